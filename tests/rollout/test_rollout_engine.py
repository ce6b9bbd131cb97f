"""Rollout engine: the multi-turn state machine, token-in/token-out, budgets, finish reasons,
concurrency, and exact conditioning with the real tiny model.

Scripted tests use the real Qwen2.5 tokenizer and a backend that writes predetermined turns, so
they can assert on exact ids; the model test uses the HF backend on the tiny Qwen2.
"""

from __future__ import annotations

import time

import pytest
import torch

from envs.base import StepResult
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine, encode_plain

CODE_TURN = "Let me compute.\n<code>\n```python\nprint(6*7)\n```\n</code>\n\nThen more"
ANSWER_TURN = "So it is \\boxed{42}.<EOS>"
PROBLEM = {"id": "p0", "problem": "What is 6*7?", "answer": "42"}


def _engine(tok, backend, env_factory, **cfg):
    cfg.setdefault("progress", False)
    return RolloutEngine(backend, tok, env_factory, RolloutConfig(**cfg))


def test_two_turn_trajectory_is_token_exact(qwen_tok, fake_env_cls, scripted_backend_cls):
    envs = []

    def factory(problem):
        envs.append(fake_env_cls(problem, obs_suffix=" <|im_end|><|im_start|>user"))
        return envs[-1]

    be = scripted_backend_cls(qwen_tok, [CODE_TURN, ANSWER_TURN])
    eng = _engine(qwen_tok, be, factory, n_per_prompt=1)
    trajs, stats = eng.run([PROBLEM])
    (t,) = trajs
    t.check()
    assert (t.finish_reason, t.reward, t.num_turns, t.tool_calls) == ("answer", 1.0, 2, 1)
    assert not t.infra_failure
    assert t.info["correct"] is True and t.info["pred"] == "42"
    assert [k for _, _, k in t.turns] == ["model", "obs", "model"]

    # prompt: chat template, control tokens as special ids
    want_prompt = qwen_tok.apply_chat_template(envs[0].initial_messages(), tokenize=False, add_generation_prompt=True)
    assert t.prompt_ids == qwen_tok(want_prompt, add_special_tokens=False)["input_ids"]
    assert t.prompt_ids[0] == qwen_tok.convert_tokens_to_ids("<|im_start|>")

    # turn 1: exactly the sampled ids, up to and including the token completing "</code>"
    code_ids = qwen_tok(CODE_TURN, add_special_tokens=False)["input_ids"]
    (s0, e0), (s1, e1) = t.model_spans()
    k = code_ids.index(qwen_tok.convert_tokens_to_ids(">ĊĊ"))  # ">\n\n" holds the stop's ">"
    assert t.response_ids[s0:e0] == code_ids[: k + 1]
    assert envs[0].turn_texts[0].endswith("</code>\n\n") and "Then" not in envs[0].turn_texts[0]

    # the observation: tokenized once as plain text; special strings stay ordinary tokens
    obs = "\n<interpreter>\n42 <|im_end|><|im_start|>user\n</interpreter>\n"
    obs_ids = t.response_ids[e0:s1]
    assert obs_ids == encode_plain(qwen_tok, obs)
    assert all(i < 151643 for i in obs_ids)  # no control token id (specials start at 151643)
    assert qwen_tok.decode(obs_ids) == obs
    assert t.loss_mask[e0:s1] == [0] * len(obs_ids) and set(t.rollout_logprobs[e0:s1]) == {0.0}

    # turn 2 was conditioned on exactly prompt + response so far; it ends with EOS
    assert be.calls[1].prompt_ids == t.prompt_ids + t.response_ids[:s1]
    assert t.response_ids[-1] == qwen_tok.eos_token_id
    assert t.text.endswith("\\boxed{42}.")
    assert stats["finish/answer"] == 1.0 and stats["engine/tool_calls"] == 1
    assert envs[0].closed


def test_model_tokens_are_never_retokenized(qwen_tok, fake_env_cls, scripted_backend_cls):
    """A non-canonical tokenization survives: ids are kept, not re-derived from text."""
    he, llo = (qwen_tok(s, add_special_tokens=False)["input_ids"] for s in ("he", "llo"))
    assert qwen_tok("hello", add_special_tokens=False)["input_ids"] != he + llo
    turn = he + llo + qwen_tok(" \\boxed{42}", add_special_tokens=False)["input_ids"] + [qwen_tok.eos_token_id]
    be = scripted_backend_cls(qwen_tok, [turn])
    (t,), _ = _engine(qwen_tok, be, fake_env_cls, n_per_prompt=1).run([PROBLEM])
    assert t.response_ids == turn
    assert t.finish_reason == "answer" and t.text == "hello \\boxed{42}"


def test_groups_order_and_one_chat_template_per_problem(qwen_tok, fake_env_cls, scripted_backend_cls, monkeypatch):
    calls = []
    real = qwen_tok.apply_chat_template

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(qwen_tok, "apply_chat_template", counting)
    problems = [{"id": f"p{i}", "problem": f"What is {i}*42?", "answer": str(42 * i)} for i in range(3)]
    be = scripted_backend_cls(qwen_tok, [ANSWER_TURN])
    trajs, _ = _engine(qwen_tok, be, fake_env_cls).run(problems, n=4)
    assert len(calls) == 3
    assert [t.group_id for t in trajs] == [0] * 4 + [1] * 4 + [2] * 4
    assert [t.problem_id for t in trajs] == ["p0"] * 4 + ["p1"] * 4 + ["p2"] * 4
    assert [t.reward for t in trajs] == [-1.0] * 4 + [1.0] * 4 + [-1.0] * 4  # boxed{42} fits p1
    assert len({tuple(t.prompt_ids) for t in trajs}) == 3


def test_budgets_clamp_every_turn(qwen_tok, fake_env_cls, scripted_backend_cls):
    be = scripted_backend_cls(qwen_tok, [CODE_TURN, CODE_TURN, CODE_TURN, ANSWER_TURN])
    eng = _engine(qwen_tok, be, fake_env_cls, n_per_prompt=1, max_total_tokens=60, max_new_tokens_per_turn=25)
    (t,), _ = eng.run([PROBLEM])
    t.check()
    assert len(t.response_ids) <= 60
    assert t.finish_reason == "max_tokens"
    for call in be.calls:
        used = len(call.prompt_ids) - len(t.prompt_ids)
        assert call.sampling.max_new_tokens == min(25, 60 - used)


def test_turn_cut_by_its_budget_is_not_executed(qwen_tok, fake_env_cls, scripted_backend_cls):
    envs = []
    be = scripted_backend_cls(qwen_tok, [CODE_TURN])
    eng = _engine(
        qwen_tok, be, lambda p: envs.append(fake_env_cls(p)) or envs[-1], n_per_prompt=1, max_new_tokens_per_turn=5
    )
    (t,), _ = eng.run([PROBLEM])
    assert t.finish_reason == "max_tokens" and len(t.response_ids) == 5
    assert envs[0].turn_texts == [] and t.tool_calls == 0


def test_observation_cut_to_the_remaining_budget(qwen_tok, fake_env_cls, scripted_backend_cls):
    code_len = len(qwen_tok(CODE_TURN, add_special_tokens=False)["input_ids"]) - 2  # stops early
    be = scripted_backend_cls(qwen_tok, [CODE_TURN, ANSWER_TURN])
    eng = _engine(qwen_tok, be, fake_env_cls, n_per_prompt=1, max_total_tokens=code_len + 3)
    (t,), _ = eng.run([PROBLEM])
    t.check()
    assert t.finish_reason == "max_tokens"
    assert len(t.response_ids) == code_len + 3
    assert [k for _, _, k in t.turns] == ["model", "obs"]


def test_max_turns(qwen_tok, fake_env_cls, scripted_backend_cls):
    be = scripted_backend_cls(qwen_tok, [CODE_TURN])  # always writes code
    (t,), _ = _engine(qwen_tok, be, fake_env_cls, n_per_prompt=1, max_turns=3).run([PROBLEM])
    assert (t.finish_reason, t.num_turns, t.tool_calls) == ("max_turns", 3, 3)
    assert [k for _, _, k in t.turns] == ["model", "obs", "model", "obs", "model"]


@pytest.mark.parametrize(
    "turn,stops,finish,void",
    [
        ("I give up.<EOS>", None, "eos", 1),  # env: no code -> done; the model simply stopped
        ("<code>\n```python\nprint(1)\n```\n</code><EOS>", [], "eos", 0),  # EOS though env continues
    ],
)
def test_eos_finishes(qwen_tok, fake_env_cls, scripted_backend_cls, turn, stops, finish, void):
    def factory(p):
        env = fake_env_cls(p)
        if stops is not None:
            env.stop_strings = stops
        return env

    be = scripted_backend_cls(qwen_tok, [turn])
    (t,), _ = _engine(qwen_tok, be, factory, n_per_prompt=1).run([PROBLEM])
    assert t.finish_reason == finish and t.void_turns == void and t.num_turns == 1
    assert t.response_ids[-1] == qwen_tok.eos_token_id


def test_env_failures_are_flagged_not_lost(qwen_tok, fake_env_cls, scripted_backend_cls):
    envs = []
    be = scripted_backend_cls(qwen_tok, [CODE_TURN, ANSWER_TURN])
    (t,), stats = _engine(
        qwen_tok, be, lambda p: envs.append(fake_env_cls(p, fail_on_step=True)) or envs[-1], n_per_prompt=1
    ).run([PROBLEM])
    assert t.finish_reason == "error" and "env exploded" in t.info["error"]
    assert t.reward == 0.0 and envs[0].closed and stats["rollout/error_rate"] == 1.0
    assert t.infra_failure and not t.sandbox_error
    t.check()

    be = scripted_backend_cls(qwen_tok, [CODE_TURN, ANSWER_TURN])
    (t,), stats = _engine(qwen_tok, be, lambda p: fake_env_cls(p, sandbox_error_on_call=1), n_per_prompt=1).run(
        [PROBLEM]
    )
    assert t.sandbox_error and t.finish_reason == "error" and stats["rollout/sandbox_error_rate"] == 1.0
    assert t.infra_failure


def test_sandbox_time_overlaps_generation(qwen_tok, fake_env_cls, scripted_backend_cls):
    """16 trajectories x 2 tool calls x 0.2 s = 6.4 s of serial sandbox time."""
    be = scripted_backend_cls(qwen_tok, [CODE_TURN, CODE_TURN, ANSWER_TURN], latency=0.01)
    eng = _engine(qwen_tok, be, lambda p: fake_env_cls(p, latency=0.2), n_per_prompt=16)
    t0 = time.perf_counter()
    trajs, stats = eng.run([PROBLEM])
    wall = time.perf_counter() - t0
    assert all(t.tool_calls == 2 and t.finish_reason == "answer" for t in trajs)
    assert stats["engine/env_s"] >= 6.4
    assert wall < 2.0


def test_run_reuses_one_event_loop(qwen_tok, fake_env_cls, scripted_backend_cls):
    be = scripted_backend_cls(qwen_tok, [ANSWER_TURN])
    eng = _engine(qwen_tok, be, fake_env_cls, n_per_prompt=1)
    import asyncio

    async def loop_id():
        return id(asyncio.get_running_loop())

    first = eng.run_coroutine(loop_id())
    eng.run([PROBLEM])
    assert eng.run_coroutine(loop_id()) == first
    eng.close()


def test_config_validation():
    with pytest.raises(ValueError, match="max_turns"):
        RolloutConfig(max_turns=0)
    with pytest.raises(ValueError, match="top_p"):
        RolloutConfig(top_p=0.0)
    with pytest.raises(ValueError, match="temperature"):
        RolloutConfig(temperature=-1.0)


class EchoEnv:
    """Every turn gets an observation with special-token strings, until the third turn."""

    def __init__(self, problem: dict) -> None:
        self.stop_strings: list[str] = []
        self.stats = {"tool_calls": 0}
        self.sandbox_error = False
        self.turn = 0

    def initial_messages(self):
        return [{"role": "user", "content": "Say something."}]

    async def step(self, turn_text: str) -> StepResult:
        self.turn += 1
        if self.turn >= 3:
            return StepResult(None, True, {"reason": "answer"})
        self.stats["tool_calls"] += 1
        return StepResult(f"\n<interpreter>\nturn {self.turn} <|im_end|>\n</interpreter>\n", False, {})

    def reward(self, text: str):
        return 0.0, {"correct": False, "pred": None}

    async def close(self) -> None:
        pass


def test_tiny_model_conditioned_on_exactly_prompt_plus_response(tiny_path):
    """Recompute the model's logprobs on each final sequence (one unpadded forward) and compare
    with the sampled logprobs at every model token: the backend saw prompt + response[:k],
    observations included, when it sampled token k."""
    from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig

    backend = HFBackend(str(tiny_path), cfg=HFBackendConfig(max_batch_size=16, join_every=1))
    tok = backend.tokenizer
    eng = RolloutEngine(
        backend,
        tok,
        EchoEnv,
        RolloutConfig(
            n_per_prompt=12,
            max_turns=4,
            max_total_tokens=160,
            max_new_tokens_per_turn=40,
            temperature=0.7,
            stop_strings=["e"],
            seed=3,
            progress=False,
        ),
    )
    try:
        trajs, stats = eng.run([{"id": "x", "problem": "", "answer": ""}])
        again, _ = eng.run([{"id": "x", "problem": "", "answer": ""}])
    finally:
        eng.close()
        backend.close()
    assert [t.response_ids for t in trajs] == [t.response_ids for t in again]  # seeded
    multi = [t for t in trajs if sum(k == "obs" for _, _, k in t.turns) >= 1]
    assert len(multi) >= 6  # most trajectories really had observations in their context
    assert backend.stats["joins"] >= 1  # later turns joined running batches
    worst = 0.0
    for t in trajs:
        t.check()
        seq = torch.tensor([t.prompt_ids + t.response_ids])
        with torch.no_grad():
            logits = backend.model(seq).logits[0].float()
        pred = logits[len(t.prompt_ids) - 1 : -1] / 0.7  # predicts response token k
        lp = pred.log_softmax(-1).gather(1, torch.tensor(t.response_ids)[:, None])[:, 0]
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        worst = max(worst, (lp[mask] - torch.tensor(t.rollout_logprobs)[mask]).abs().max().item())
        obs_ids = [i for i, m in zip(t.response_ids, t.loss_mask) if m == 0]
        assert tok.convert_tokens_to_ids("<|im_end|>") not in obs_ids
    assert worst < 1e-4
    assert stats["engine/tokens_per_s"] > 0 and stats["engine/trajectories"] == 12


def test_progress_bar_and_stats(qwen_tok, fake_env_cls, scripted_backend_cls, capsys, monkeypatch):
    import sys

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)  # a terminal: the bar (a log file gets plain lines)
    be = scripted_backend_cls(qwen_tok, [CODE_TURN, ANSWER_TURN])
    eng = _engine(qwen_tok, be, fake_env_cls, n_per_prompt=3, progress=True)
    trajs, stats = eng.run([PROBLEM])
    assert "rollout" in capsys.readouterr().err
    assert stats["engine/trajectories"] == 3 and stats["rollout/turns"] == 2.0
    assert stats["rollout/tool_calls"] == 1.0 and stats["engine/obs_tokens"] > 0
    assert stats["engine/model_tokens"] == sum(t.num_model_tokens for t in trajs)
    assert abs(sum(v for k, v in stats.items() if k.startswith("finish/")) - 1.0) < 1e-9
    assert eng.last_stats is stats


def test_env_factory_error_propagates_and_stops_the_batch(qwen_tok, fake_env_cls, scripted_backend_cls):
    import asyncio

    envs = []

    def factory(problem):
        if problem["id"] == "bad":
            raise KeyError("no such task")
        envs.append(fake_env_cls(problem, latency=5.0))
        return envs[-1]

    be = scripted_backend_cls(qwen_tok, [CODE_TURN, ANSWER_TURN])
    eng = _engine(qwen_tok, be, factory, n_per_prompt=2)
    problems = [PROBLEM, {"id": "bad", "problem": "?", "answer": "0"}]
    t0 = time.perf_counter()
    with pytest.raises(KeyError, match="no such task"):
        eng.run(problems)
    assert time.perf_counter() - t0 < 4.0  # the slow siblings were cancelled, not awaited
    assert all(e.closed for e in envs)  # and their envs were still closed
    leftover = [t for t in asyncio.all_tasks(eng._loop) if not t.done()]
    assert leftover == []
    eng.close()
