"""Weight pushes while generation is in flight (asynchronous training), against the SGLang stand-in
(its pause modes, update lock and version spans mirror 0.5.23: tests/rollout/sglang_standin_gen.py)
and the in-process HF backend."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch

from stare_tir.rollout.backends._http import HTTPError, request_sync
from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig

SEED = 1234


def _prompt(tok) -> list[int]:
    return list(tok("Compute 12 + 30 with code.", add_special_tokens=False)["input_ids"])


def _sharper(model) -> list[tuple[str, torch.Tensor]]:
    """The model's weights with a sharper output layer: other weights, other log-probs."""
    out = []
    for name, p in model.state_dict().items():
        t = p.detach().clone()
        if "lm_head" in name or "embed_tokens" in name:
            t = t * 3.0
        out.append((name, t))
    return out


def _logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log p(token) of every generated token under `model` (temperature 1)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def _in_background(coro):
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("out", asyncio.run(coro)), daemon=True)
    thread.start()
    return thread, box


@pytest.fixture
def slow_server(tiny_path, standin):
    # seeds honoured: the same tokens on every run (no early EOS to shorten the answer)
    server = standin.StandinServer(str(tiny_path), deterministic=True, token_delay_s=0.02).start()
    yield server
    server.shutdown()


@pytest.mark.parametrize("compute_lag_s", [0.0, 1.0])
def test_a_push_mid_answer_retracts_and_resumes_it_on_the_new_weights(slow_server, tiny_path, compute_lag_s):
    """compute_lag_s: the stand-in computes the answer's first segment only after the push arrived
    (a loaded machine): the update must wait for it, or the tokens out before the pause would carry
    the old version with the new weights' log-probs."""
    from transformers import AutoModelForCausalLM

    server = slow_server
    if compute_lag_s:
        generate = server.backend.generate

        async def late(*args, **kwargs):
            if server.control.updates == 1:  # only the segment the push interrupts
                await asyncio.sleep(compute_lag_s)
            return await generate(*args, **kwargs)

        server.backend.generate = late
    model = AutoModelForCausalLM.from_pretrained(str(tiny_path)).eval()
    be = SGLangBackend([server.url], SGLangConfig(weight_sync="tensor", send_seed=True), tokenizer=server.tokenizer)
    be.update_weights(model.state_dict().items(), version="0")
    be.allow_in_flight_updates(2)
    prompt = _prompt(server.tokenizer)
    thread, box = _in_background(be.generate(prompt, SamplingParams(max_new_tokens=60, seed=SEED), []))
    time.sleep(0.5)  # ~25 tokens emitted
    new = _sharper(model)
    be.update_weights(iter(new), version="1")
    thread.join(timeout=60)
    gen = box["out"]

    spans = gen.weight_versions
    assert [v for _, _, v in spans] == ["0", "1"], spans  # old tokens, then the new weights' tokens
    k = spans[0][1]
    assert 0 < k < len(gen.token_ids) == spans[1][1]
    stats = request_sync("GET", server.url + "/standin_stats")
    assert stats["pauses"]["retract"] == 1 and stats["interrupted"] == 1
    assert stats["tokens_during_update"] == 0  # nothing generated while the weights changed
    # Each span's log-probs are its own weights': the resumed request ran on the new ones.
    old_lp = _logprobs(model, prompt, gen.token_ids)
    model.load_state_dict(dict(new))
    new_lp = _logprobs(model, prompt, gen.token_ids)
    got = torch.tensor(gen.logprobs)
    assert torch.allclose(got[:k], old_lp[:k], atol=1e-4)
    assert torch.allclose(got[k:], new_lp[k:], atol=1e-4)
    assert not torch.allclose(got[k:], old_lp[k:], atol=1e-2)
    be.close()


def test_an_answer_that_ended_just_before_a_push_is_not_taken_for_a_restarted_server(slow_server):
    be = SGLangBackend([slow_server.url], SGLangConfig(weight_sync="tensor"), tokenizer=slow_server.tokenizer)
    be.expect_version("3")
    be.allow_in_flight_updates(1)
    be.expect_version("4")  # pushed while the answer below was on its way
    slow_server.weight_version = "3"
    gen = asyncio.run(be.generate(_prompt(slow_server.tokenizer), SamplingParams(max_new_tokens=2), []))
    assert gen.weight_version == "3" and be.stale_answers == 0
    slow_server.weight_version = "default"  # a restarted server is still caught
    with pytest.raises(Exception, match="weight version 'default'"):
        asyncio.run(be.generate(_prompt(slow_server.tokenizer), SamplingParams(max_new_tokens=2), []))
    assert be.stale_answers >= 1


def test_a_non_pushing_rank_accepts_the_version_being_pushed_before_the_push(slow_server):
    """Rank 1's requests resume on the weights rank 0 pushes while they run: their answers carry
    the new version before rank 1 hears that the push succeeded. They are the trainer's weights,
    not a restarted server's: no stale answer, no error."""
    rank1 = SGLangBackend([slow_server.url], SGLangConfig(weight_sync="tensor"), tokenizer=slow_server.tokenizer)
    rank1.expect_version("3")
    rank1.allow_in_flight_updates(2)
    rank1.accept_version("4")  # what sync_weights does on every non-pushing rank before rank 0 pauses
    slow_server.weight_version = "4"  # rank 0's push landed mid-request
    gen = asyncio.run(rank1.generate(_prompt(slow_server.tokenizer), SamplingParams(max_new_tokens=2), []))
    assert gen.weight_version == "4" and rank1.stale_answers == 0
    rank1.expect_version("4")  # rank 0's push confirmed by the agreement
    assert rank1.weight_version == "4"

    late = SGLangBackend([slow_server.url], SGLangConfig(weight_sync="tensor"), tokenizer=slow_server.tokenizer)
    late.expect_version("3")  # without the acceptance the same answer is taken for a restarted server's
    with pytest.raises(Exception, match="weight version '4'"):
        asyncio.run(late.generate(_prompt(slow_server.tokenizer), SamplingParams(max_new_tokens=2), []))


def test_a_server_left_paused_by_a_killed_trainer_is_continued_when_the_next_one_starts(slow_server):
    request_sync("POST", slow_server.url + "/pause_generation", {"mode": "retract"})  # ... and the trainer died
    cfg = SGLangConfig(generate_timeout_s=3.0)
    stuck = SGLangBackend([slow_server.url], cfg, tokenizer=slow_server.tokenizer)
    with pytest.raises(TimeoutError, match="paused by a trainer killed"):  # bounded, and named
        asyncio.run(stuck.generate(_prompt(slow_server.tokenizer), SamplingParams(max_new_tokens=2), []))
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
    try:
        be = SGLangBackend([slow_server.url], cfg, tokenizer=slow_server.tokenizer)
        be.claim_servers()
        be.claim_servers()  # idempotent
    finally:
        logger.remove(sink)
    gen = asyncio.run(be.generate(_prompt(slow_server.tokenizer), SamplingParams(max_new_tokens=2), []))
    assert len(gen.token_ids) == 2
    assert any("/continue_generation sent to" in line and slow_server.url in line for line in lines)


def test_abort_pause_ends_requests_and_the_client_refuses_the_answer(slow_server):
    be = SGLangBackend([slow_server.url], tokenizer=slow_server.tokenizer)
    box: dict = {}

    def run():
        try:
            box["out"] = asyncio.run(be.generate(_prompt(slow_server.tokenizer), SamplingParams(max_new_tokens=60), []))
        except Exception as exc:  # noqa: BLE001 - inspected below
            box["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)
    be.pause_generation("abort")
    thread.join(timeout=30)
    be.continue_generation()
    assert "abort" in str(box["error"])  # never trained on as if it had finished


def test_in_place_pause_refuses_the_flush_until_continue(slow_server):
    be = SGLangBackend([slow_server.url], tokenizer=slow_server.tokenizer)
    thread, box = _in_background(be.generate(_prompt(slow_server.tokenizer), SamplingParams(max_new_tokens=40), []))
    time.sleep(0.3)
    be.pause_generation("in_place")
    with pytest.raises(HTTPError) as err:
        request_sync("POST", slow_server.url + "/flush_cache")
    assert err.value.status == 400
    be.continue_generation()
    thread.join(timeout=30)
    assert len(box["out"].token_ids) > 0


def test_stop_string_split_across_a_pause_ends_the_answer_where_it_completes(standin, tiny_tok):
    from sglang_standin_gen import GenerationControl

    from stare_tir.rollout.backends.base import Generation, StopChecker, fast_decoder

    pieces = ["x = 1", "</", "co", "de", ">", " tail"]
    ids = [tiny_tok(p, add_special_tokens=False)["input_ids"] for p in pieces]
    before = ids[0] + ids[1]  # emitted before the pause: "x = 1</"
    after = [i for piece in ids[2:] for i in piece]  # generated after it: "code> tail"
    gen = Generation(after, [-0.5] * len(after), "length")
    checker = StopChecker(fast_decoder(tiny_tok), ["</code>"])
    cut_ids, _, finish, stop = GenerationControl._cut(
        gen, before, checker, frozenset(), SamplingParams(max_new_tokens=99)
    )
    assert finish == "stop" and stop == "</code>"
    assert fast_decoder(tiny_tok)(before + cut_ids).endswith("</code>")  # " tail" was never generated


def test_servers_without_pause_modes_are_refused_for_in_flight_pushes(tiny_path, standin):
    server = standin.StandinServer(str(tiny_path), compat="0.5.2").start()
    try:
        be = SGLangBackend([server.url])
        with pytest.raises(ValueError, match=r"max_staleness.*0\.5\.6.*'0\.5\.2'"):
            be.allow_in_flight_updates(2)
    finally:
        server.shutdown()


def test_hf_update_lets_running_requests_finish_on_the_old_weights(tiny_path):
    from stare_tir.rollout.backends.hf import HFBackend

    be = HFBackend(str(tiny_path))
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    prompt = _prompt(be.tokenizer)
    try:
        first = asyncio.run_coroutine_threadsafe(be.generate(prompt, SamplingParams(max_new_tokens=200), []), loop)
        while not be._batch:  # the request is running
            time.sleep(0.01)
        be.update_weights(_sharper(be.model), version="1")
        gen = first.result(timeout=60)
        assert [v for _, _, v in gen.weight_versions] == ["0"]  # it finished before the weights changed
        later = asyncio.run_coroutine_threadsafe(be.generate(prompt, SamplingParams(max_new_tokens=4), []), loop)
        assert [v for _, _, v in later.result(timeout=60).weight_versions] == ["1"]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        be.close()


def test_stare_eval_continues_a_server_left_paused_before_it_samples(slow_server, tiny_path, tmp_path):
    from stare_tir.config import load_config
    from stare_tir.eval.command import EvalRunConfig, run_eval

    request_sync("POST", slow_server.url + "/pause_generation", {"mode": "retract"})  # ... and the trainer died
    cfg = load_config(
        EvalRunConfig,
        None,
        [
            f"model.path={tiny_path}",
            "backend=sglang",
            f"rollout.sglang.urls=[{slow_server.url}]",
            "rollout.sglang.generate_timeout_s=20",  # without the claim: a TimeoutError naming the pause
            f"out_dir={tmp_path / 'eval'}",
            "eval.datasets=[aime24]",
            "eval.limit=1",
            "eval.n=1",
            "eval.max_turns=1",
            "eval.max_tokens=4",
            "eval.max_tokens_per_turn=4",
            "env.prompt=short",
            "rollout.progress=false",
            "sandbox.workers=1",
        ],
    )
    summary = run_eval(cfg)
    assert summary["datasets"]["aime24"]["new_samples"] == 1
    assert slow_server.stats()["counts"].get("/continue_generation", 0) >= 1
