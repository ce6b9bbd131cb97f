"""The project's SGLang backend against the REAL SGLang server (0.5.23, CPU build).

What runs here is SGLang itself (scheduler, tokenizer manager, radix cache, sampler, weight
loaders, its HTTP API), not our stand-in: token-in/token-out generation with stop strings and
logprobs, EOS and length finishes, every weight-sync mode inside SGLang's begin/end weight-update
session, weight versions, a refused update failing fast, the faults of a run (a server that
restarts, one that kept a dead trainer's group, a refusal in a 2-rank ZeRO-3 run), the 2-rank RL
run, and a server with 2 TP ranks. One server (conftest) serves every test; each test that
changes the weights puts the tiny base weights back.

What a CPU cannot show (NCCL, CUDA IPC handles, speed) is listed in the README.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

from stare_tir.rollout.backends._http import HTTPError, request_sync
from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig, StaleWeightsError, sampling_payload

from .conftest import ROOT, TINY_BASE, restart_server

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sglang_real")]

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def local():
    """The same checkpoint in this process (HF transformers), to check what the server computes."""
    from stare_tir.rollout.backends.hf import HFBackend

    be = HFBackend(str(TINY_BASE))
    yield be
    be.close()


@pytest.fixture(scope="module")
def tok(local):
    return local.tokenizer


def _prompt(tok, text: str = "What is 3 * 4?") -> list[int]:
    s = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(s, add_special_tokens=False)["input_ids"]


def _run(coro):
    return asyncio.run(coro)


def _base_state() -> dict[str, torch.Tensor]:
    from stare_tir.rollout.backends._weights import iter_checkpoint_tensors

    return dict(iter_checkpoint_tensors(str(TINY_BASE)))


def _perturbed_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """The base weights plus seeded noise: same names and shapes, visibly different outputs."""
    gen = torch.Generator().manual_seed(seed)
    return {n: t + 0.05 * torch.randn(t.shape, generator=gen, dtype=t.dtype) for n, t in _base_state().items()}


def _fingerprint(backend, prompt) -> torch.Tensor:
    """Greedy logprobs of a fixed prompt: they move with any weight change, unlike greedy ids."""
    return torch.tensor(_run(backend.generate(prompt, GREEDY, [])).logprobs)


def _scores(url: str, ids: list[int]) -> torch.Tensor:
    """The server's log-probability of each token of `ids` given its prefix (prefill only).

    A fingerprint of the served weights that does not depend on what greedy decoding happens to
    pick (the tiny model is confident, so greedy logprobs are all near 0)."""
    out = request_sync(
        "POST",
        url + "/generate",
        {
            "input_ids": ids,
            "return_logprob": True,
            "logprob_start_len": 0,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
        },
        timeout_s=120,
    )
    return torch.tensor([p[0] for p in out["meta_info"]["input_token_logprobs"][1:]])


def _local_scores(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


# ------------------------------------------------------------------------------------ generation


def _assert_stop_completed_by_last_token(tok, ids: list[int], stop: str) -> None:
    """The stop string first appears with the last token, which is kept whole (with a real BPE
    it may carry more text, e.g. ">\n" completing "</code>")."""
    assert stop in tok.decode(ids) and stop not in tok.decode(ids[:-1]), tok.decode(ids)


def test_greedy_tito_equals_raw_server_and_local_model(sglang_server, local, tok):
    """Token in / token out: our ids and logprobs are exactly the server's
    `meta_info.output_token_logprobs`, and the real engine computes what HF transformers does."""
    prompt = _prompt(tok)
    be = SGLangBackend([sglang_server.url], tokenizer=tok)
    sp = SamplingParams(temperature=0.0, max_new_tokens=48)
    raw = request_sync(
        "POST",
        sglang_server.url + "/generate",
        {"input_ids": prompt, "return_logprob": True, "sampling_params": sampling_payload(sp, ["</code>"])},
    )
    g = _run(be.generate(prompt, sp, ["</code>"]))
    pairs = raw["meta_info"]["output_token_logprobs"]
    assert g.token_ids == [p[1] for p in pairs] == raw["output_ids"]
    assert g.logprobs == pytest.approx([p[0] for p in pairs], abs=1e-6)
    # the tiny base writes a code block first: the stop string ends the turn, kept in the text
    assert (g.finish_reason, g.stop_text) == ("stop", "</code>")
    assert raw["meta_info"]["finish_reason"] == {"type": "stop", "matched": "</code>"}
    _assert_stop_completed_by_last_token(tok, g.token_ids, "</code>")
    want = _run(local.generate(prompt, sp, ["</code>"]))
    assert g.token_ids == want.token_ids
    assert torch.allclose(torch.tensor(g.logprobs), torch.tensor(want.logprobs), atol=1e-3)


def test_sampled_concurrent_logprobs_match_a_local_recompute(sglang_server, local, tok):
    """Many requests in flight (the server batches them): each sampled token's logprob is the
    temperature-scaled log-softmax of the real model at that position."""
    be = SGLangBackend([sglang_server.url], tokenizer=tok)
    prompts = [_prompt(tok, f"What is {i} + {2 * i}?") for i in range(8)]
    sp = SamplingParams(temperature=0.7, max_new_tokens=40)

    async def all_of_them():
        return await asyncio.gather(*(be.generate(p, sp, ["</code>"]) for p in prompts))

    gens = _run(all_of_them())
    assert {g.finish_reason for g in gens} <= {"stop", "eos", "length"}
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) == len(g.logprobs) > 0
        with torch.no_grad():
            logits = local.model(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1]
        want = (logits.float() / 0.7).log_softmax(-1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.allclose(want, torch.tensor(g.logprobs), atol=1e-3), (want, g.logprobs)
        if g.finish_reason == "stop":
            assert g.stop_text == "</code>"
            _assert_stop_completed_by_last_token(tok, g.token_ids, "</code>")


def test_eos_and_length_finishes(sglang_server, local, tok):
    be = SGLangBackend([sglang_server.url], tokenizer=tok)
    prompt = _prompt(tok)
    full = _run(be.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=80), []))
    assert full.finish_reason == "eos" and full.token_ids[-1] == tok.eos_token_id
    assert full.stop_text is None
    short = _run(be.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=5), []))
    assert short.finish_reason == "length"
    assert short.token_ids == full.token_ids[:5]


def test_eos_or_stop_on_the_last_budget_token_is_a_stop(sglang_server, tok):
    """The last allowed token is EOS (or completes a stop string): that is a stop, not a
    length finish. Older SGLang checked max_new_tokens first and said "length" (reproduced by
    the stand-in's compat setting); 0.5.23 reports the stop itself, checked here on the raw
    answer, and the backend agrees with the HF backend either way."""
    be = SGLangBackend([sglang_server.url], tokenizer=tok)
    prompt = _prompt(tok)
    full = _run(be.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=80), []))
    n = len(full.token_ids)
    sp = SamplingParams(temperature=0.0, max_new_tokens=n)
    raw = request_sync(
        "POST",
        sglang_server.url + "/generate",
        {"input_ids": prompt, "return_logprob": True, "sampling_params": sampling_payload(sp, [])},
    )
    assert raw["meta_info"]["finish_reason"] == {"type": "stop", "matched": tok.eos_token_id}
    eos_last = _run(be.generate(prompt, sp, []))
    assert eos_last.token_ids == full.token_ids
    assert eos_last.finish_reason == "eos"
    code = _run(be.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=80), ["</code>"]))
    assert code.finish_reason == "stop"
    k = len(code.token_ids)
    sp = SamplingParams(temperature=0.0, max_new_tokens=k)
    raw = request_sync(
        "POST",
        sglang_server.url + "/generate",
        {"input_ids": prompt, "return_logprob": True, "sampling_params": sampling_payload(sp, ["</code>"])},
    )
    assert raw["meta_info"]["finish_reason"] == {"type": "stop", "matched": "</code>"}
    stop_last = _run(be.generate(prompt, sp, ["</code>"]))
    assert stop_last.token_ids == code.token_ids
    assert (stop_last.finish_reason, stop_last.stop_text) == ("stop", "</code>")


# ------------------------------------------------------------------------------------ weight sync


@pytest.fixture(scope="module")
def score_ids(local, tok) -> list[int]:
    """A fixed sequence (prompt + the base model's greedy answer) whose per-token scores tell
    which weights the server holds."""
    prompt = _prompt(tok)
    answer = _run(local.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=40), []))
    return prompt + answer.token_ids


@pytest.fixture(scope="module")
def perturbed(score_ids):
    """(state, expected scores) of the perturbed weights, computed with HF transformers."""
    from stare_tir.rollout.backends.hf import HFBackend

    state = _perturbed_state()
    ref = HFBackend(str(TINY_BASE))
    ref.update_weights(state.items())
    want = _local_scores(ref.model, score_ids)
    ref.close()
    return state, want


def _write_checkpoint(state: dict[str, torch.Tensor], out) -> str:
    """An HF checkpoint directory: the tiny base's config and tokenizer, these weights."""
    import shutil

    from safetensors.torch import save_file

    shutil.copytree(TINY_BASE, out, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file({n: t.contiguous() for n, t in state.items()}, str(out / "model.safetensors"))
    return str(out)


@pytest.mark.parametrize("mode", ["disk_path", "disk", "tensor", "distributed"])
def test_weight_sync_changes_what_the_server_computes(sglang_server, local, score_ids, perturbed, tmp_path, mode):
    """Each sync mode (inside SGLang's begin/end weight-update session where the server demands
    it) makes the real server compute with the pushed weights, and the same path puts the base
    weights back. Scores are compared with HF transformers on the same weights."""
    state, want_new = perturbed
    want_old = _local_scores(local.model, score_ids)
    assert (want_new - want_old).abs().max() > 0.05  # the perturbation is visible at all
    url = sglang_server.url
    assert torch.allclose(_scores(url, score_ids), want_old, atol=1e-3), "server not on base"
    cfg = SGLangConfig(
        weight_sync="disk" if mode == "disk_path" else mode,
        dist_backend="gloo",
        sync_dir=str(tmp_path / "sync"),
        bucket_mb=1,
    )
    be = SGLangBackend([url], cfg)
    try:
        if mode == "disk_path":
            be.update_weights_from_disk(_write_checkpoint(state, tmp_path / "ckpt"))
        else:
            be.update_weights(state.items())
        got = _scores(url, score_ids)
        assert torch.allclose(got, want_new, atol=1e-3), (got - want_new).abs().max()
    finally:
        if mode == "disk_path":
            be.update_weights_from_disk(str(TINY_BASE))
        else:
            be.update_weights(_base_state().items())
        be.close()
    assert torch.allclose(_scores(url, score_ids), want_old, atol=1e-3), "base not restored"
    # generation (not only prefill scoring) runs on the restored weights: greedy ids agree
    prompt = score_ids[: len(_prompt(local.tokenizer))]
    restored = SGLangBackend([url], tokenizer=local.tokenizer)
    assert _run(restored.generate(prompt, GREEDY, [])).token_ids == _run(local.generate(prompt, GREEDY, [])).token_ids


def test_server_refuses_tensor_updates_outside_a_session(sglang_server):
    """The real 0.5.23 rule the backend must follow (our stand-in mirrors it): an update from
    tensors outside begin_weight_update/end_weight_update is refused with 400."""
    from stare_tir.rollout.backends.sglang import serialize_named_tensors

    name, t = next(iter(_base_state().items()))
    with pytest.raises(HTTPError) as err:
        request_sync(
            "POST",
            sglang_server.url + "/update_weights_from_tensor",
            {"serialized_named_tensors": [serialize_named_tensors([(name, t)])], "flush_cache": True},
            timeout_s=60,
        )
    assert err.value.status == 400 and "begin_weight_update" in str(err.value)


def _push_with_guard(be: SGLangBackend, state: dict, limit_s: float = 90.0):
    """Run `be.update_weights` in a thread; return (exception or None, seconds, still_running)."""
    box: dict = {}

    def push() -> None:
        try:
            be.update_weights(state.items())
        except BaseException as exc:  # reported to the test
            box["exc"] = exc

    t0 = time.monotonic()
    worker = threading.Thread(target=push, daemon=True)
    worker.start()
    worker.join(limit_s)
    return box.get("exc"), time.monotonic() - t0, worker.is_alive()


def test_refused_distributed_update_fails_fast(sglang_server, score_ids):
    """The server loses the update group (as after a restart): it refuses the next
    update_weights_from_distributed at once. A client that broadcasts anyway waits forever for
    receivers that never come; ours must raise, name the refusal, and leave the server usable."""
    url = sglang_server.url
    base = _base_state()
    want = _scores(url, score_ids)
    # its own group name: the group this process abandons after the failure keeps its name
    cfg = SGLangConfig(weight_sync="distributed", dist_backend="gloo", bucket_mb=1, group_name="refused_update_group")
    be = SGLangBackend([url], cfg)
    try:
        exc, _, hung = _push_with_guard(be, base)  # creates the group, pushes (same weights)
        assert exc is None and not hung, exc
        request_sync("POST", url + "/destroy_weights_update_group", {"group_name": be._group.name}, timeout_s=60)
        exc, took, hung = _push_with_guard(be, base)
        assert not hung, "a refused distributed update blocked the trainer (> 90 s)"
        assert isinstance(exc, RuntimeError), exc
        assert url in str(exc) and took < 60
    finally:
        be.close()
    # no half-open session left behind: a tensor update (own session) still works
    tensor = SGLangBackend([url], SGLangConfig(weight_sync="tensor"))
    exc, _, hung = _push_with_guard(tensor, base)
    assert exc is None and not hung, exc
    assert torch.allclose(_scores(url, score_ids), want, atol=1e-5)


def test_a_stale_open_session_does_not_block_the_next_push(sglang_server, score_ids):
    """A session left open (a trainer killed between begin and end) makes the real server refuse
    begin_weight_update ("already open"). The next push must neither hang nor load into the
    stale session silently: the backend closes it, runs its own, and closes that too."""
    url = sglang_server.url
    want = _scores(url, score_ids)
    request_sync("POST", url + "/begin_weight_update", {}, timeout_s=60)
    try:
        for mode in ("tensor", "distributed"):
            be = SGLangBackend(
                [url], SGLangConfig(weight_sync=mode, dist_backend="gloo", group_name=f"stale_session_{mode}")
            )
            try:
                exc, took, hung = _push_with_guard(be, _base_state())
            finally:
                be.close()
            assert not hung, f"{mode}: blocked behind another open session"
            assert exc is None, (mode, exc)
        with pytest.raises(HTTPError) as err:  # ours was closed: nothing is left open
            request_sync("POST", url + "/end_weight_update", {}, timeout_s=60)
        assert err.value.status == 400 and "no weight-update session" in str(err.value)
    except BaseException:
        try:
            request_sync("POST", url + "/end_weight_update", {}, timeout_s=60)
        except HTTPError:
            pass
        raise
    assert torch.allclose(_scores(url, score_ids), want, atol=1e-5)


# ------------------------------------------------------------------------------ the 2-rank RL run

RL_STEPS = 2
# GRPO without dynamic sampling, so every step updates even when the tiny base's rewards tie
# (each step then syncs exactly once); budgets that keep a step at seconds on a 2-core CPU.
RL_ARGS = [
    "model.path=tiny",
    "sft.enabled=false",
    "algo.name=grpo",
    "trainer.backend=sglang",
    "data.arithmetic_train_size=64",
    "data.arithmetic_eval_size=2",
    "trainer.eval_n=1",
    "trainer.prompts_per_step=2",
    "rollout.n_per_prompt=2",
    "rollout.max_total_tokens=48",
    "rollout.max_new_tokens_per_turn=24",
    "trainer.eval_every=0",
    f"trainer.save_every={RL_STEPS}",
    f"trainer.steps={RL_STEPS}",
    "learner.zero_stage=3",  # the 7B configs' learner; fp32 for speed on CPU, bf16 in one run
    "rollout.sglang.dist_backend=gloo",
]
PUSH_ROUTE = {
    "disk": "/update_weights_from_disk",
    "tensor": "/update_weights_from_tensor",
    "distributed": "/update_weights_from_distributed",
}


def _rl_command(run_dir, url: str, mode: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        str(ROOT / "scripts" / "train_tir.py"),
        f"trainer.run_dir={run_dir}",
        *RL_ARGS,
        f"rollout.sglang.urls={json.dumps([url])}",
        f"rollout.sglang.weight_sync={mode}",
        f"rollout.sglang.sync_dir={run_dir.parent / 'sync'}",
        *extra,
    ]


@pytest.mark.parametrize(("mode", "dtype"), [("disk", "fp32"), ("tensor", "bf16"), ("distributed", "fp32")])
def test_two_rank_rl_run_trains_against_the_real_server(sglang_server, score_ids, tmp_path, mode, dtype):
    """`torchrun --nproc_per_node 2 scripts/train_tir.py trainer.backend=sglang` as a user runs
    it: every step updates the model, no rollout is lost, and each sync reaches the server once
    (rank 0 pushes; before the fix each rank pushed, and distributed sync hung)."""
    url = sglang_server.url
    before = {
        route: sglang_server.count_requests(route)
        for route in (*PUSH_ROUTE.values(), "/begin_weight_update", "/init_weights_update_group")
    }
    run_dir = tmp_path / "run"
    cmd = _rl_command(run_dir, url, mode, f"learner.dtype={dtype}")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=540, cwd=ROOT, env=env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if "reward/mean" in r]
        assert [r["step"] for r in steps] == list(range(1, RL_STEPS + 1))
        for r in steps:  # every step trained on real rollouts, none lost to an error
            assert r.get("update/skipped_empty", 0.0) == 0.0 and "update/loss" in r, r
            assert r["dropped/rollout_error"] == 0 and r["finish/error"] == 0.0, r
            assert r["rollout/response_len"] > 0
        syncs = 1 + RL_STEPS  # the initial push (learner weights to the server) + one per step
        pushes = sglang_server.count_requests(PUSH_ROUTE[mode]) - before[PUSH_ROUTE[mode]]
        assert pushes == syncs, f"{pushes} {PUSH_ROUTE[mode]} for {syncs} syncs"
        sessions = sglang_server.count_requests("/begin_weight_update") - before["/begin_weight_update"]
        assert sessions == (0 if mode == "disk" else syncs)
        if mode == "distributed":
            inits = sglang_server.count_requests("/init_weights_update_group") - before["/init_weights_update_group"]
            assert inits == 1
        if mode == "disk":
            assert sorted(p.name for p in (tmp_path / "sync").iterdir()) == ["model.safetensors"]
        # the server serves the learner's last weights, named by its applied steps
        assert request_sync("GET", url + "/get_model_info")["weight_version"] == str(RL_STEPS)
    finally:  # the next test expects the base weights
        SGLangBackend([url]).update_weights_from_disk(str(TINY_BASE))


def test_zero3_two_rank_run_whose_server_refuses_a_push_exits_with_the_refusal(sglang_server, tmp_path):
    """The real server refuses an update once it has lost the trainer's group (destroyed here
    after the first push): the 2-rank ZeRO-3 run must end non-zero within minutes, the server's
    refusal in its log, instead of hanging in mismatched collectives until the PG timeout."""
    url = sglang_server.url
    run_dir = tmp_path / "run"
    pushes_before = sglang_server.count_requests("/update_weights_from_distributed")
    log_start = len(sglang_server.log_text())
    proc = subprocess.Popen(
        _rl_command(run_dir, url, "distributed", "learner.dtype=fp32", "learner.dist_timeout_minutes=30"),
        cwd=ROOT,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while sglang_server.count_requests("/update_weights_from_distributed") == pushes_before:
            assert proc.poll() is None and time.monotonic() < deadline, "the run never pushed"
            time.sleep(0.2)
        names = re.findall(r"group_name=([\w.-]+)", sglang_server.log_text()[log_start:])
        request_sync("POST", url + "/destroy_weights_update_group", {"group_name": names[-1]}, timeout_s=60)
        t0 = time.monotonic()
        out, _ = proc.communicate(timeout=300)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        SGLangBackend([url]).update_weights_from_disk(str(TINY_BASE))
    assert proc.returncode != 0
    assert took < 240, f"{took:.0f} s after the refusal"
    assert "Failed to receive weights" in out  # the server's own refusal, in the trainer's log
    assert out.index("weight sync failed on rank 0") < out.index("weight sync failed on another rank")


def test_a_restarted_server_is_detected_and_gets_the_weights_again(sglang_server, score_ids, perturbed):
    """A server restarted mid-run serves its start-up weights and reports weight version
    "default": the backend discards its answers (and says why when no server is left), names
    it in `stale_servers`, and the re-push makes it compute with the pushed weights again."""
    url = sglang_server.url
    state, want_new = perturbed
    be = SGLangBackend([url], SGLangConfig(weight_sync="tensor"))
    be.update_weights(state.items(), version="5")
    assert request_sync("GET", url + "/get_model_info")["weight_version"] == "5"
    restart_server(sglang_server)
    try:
        with pytest.raises(StaleWeightsError, match="'default', expected '5'"):
            _run(be.generate(score_ids[:20], GREEDY, []))
        assert be.stale_servers() == [url]
        be.update_weights(state.items(), version="5")  # what the trainer does before the next step
        assert be.stale_servers() == []
        assert torch.allclose(_scores(url, score_ids), want_new, atol=1e-3)
        assert _run(be.generate(score_ids[:20], GREEDY, [])).weight_version == "5"
    finally:
        SGLangBackend([url]).update_weights_from_disk(str(TINY_BASE))


def test_resume_against_a_server_that_kept_the_old_group(sglang_server, score_ids):
    """A trainer that died with its group open leaves it in the server; a new trainer's group
    has another name (a second group of the same name is refused), and its push works."""
    url = sglang_server.url
    cfg = SGLangConfig(weight_sync="distributed", dist_backend="gloo")
    dead = SGLangBackend([url], cfg)
    exc, _, hung = _push_with_guard(dead, _base_state())
    assert exc is None and not hung, exc
    fresh = SGLangBackend([url], cfg)
    try:
        exc, _, hung = _push_with_guard(fresh, _perturbed_state(1))
        assert exc is None and not hung, exc
        assert fresh._group.name != dead._group.name
        assert request_sync("GET", url + "/get_model_info")["weight_version"] == "1"
    finally:
        fresh.update_weights(_base_state().items())
        fresh.close()
        dead.close()


# ------------------------------------------------------------------------------ 2 TP ranks


@pytest.mark.parametrize("mode", ["tensor", "distributed"])
def test_tp2_server_is_read_at_start_and_updated_on_every_rank(sglang_tp2_server, score_ids, perturbed, mode):
    """A server started with --tp 2: the default config reads tp_size=2 from /get_server_info,
    sends one tensor payload per TP rank (or makes a group of 1 + 2 ranks), and the server then
    computes with the pushed weights on both ranks. A config saying tp_size=1 is refused before
    anything is sent (one payload would kill the server: IndexError in tp_worker.py)."""
    url = sglang_tp2_server.url
    state, want_new = perturbed
    cfg = SGLangConfig(weight_sync=mode, dist_backend="gloo", bucket_mb=1)
    be = SGLangBackend([url], cfg)
    assert [lay.tp_size for lay in be.layouts()] == [2]
    try:
        be.update_weights(state.items())
        assert torch.allclose(_scores(url, score_ids), want_new, atol=1e-3)
        with pytest.raises(ValueError, match=r"tp_size=1 but .* reports tp_size=2"):
            SGLangBackend([url], SGLangConfig(weight_sync=mode, tp_size=1)).update_weights(state.items())
        assert SGLangBackend([url]).health() == [True]
    finally:
        be.update_weights(_base_state().items())
        be.close()
