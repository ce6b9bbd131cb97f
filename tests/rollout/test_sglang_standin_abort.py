"""The SGLang stand-in's /abort_request behaves as the real 0.5.23 server's does (checked there by
tests/sglang_real/test_sglang_real_abort.py): the request named by its rid (or a prefix of it) ends
at once with finish_reason abort and what it had emitted; a rid not in flight is ignored with 200;
and a cancelled SGLangBackend call counts the aborted request's tokens as waste."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from stare_tir.rollout.backends._http import request_sync
from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig

DELAY_S = 0.05
LONG = 400  # tokens at DELAY_S each: 20 s if never aborted


@pytest.fixture
def slow_server(tiny_path, standin):
    server = standin.StandinServer(str(tiny_path), deterministic=True, token_delay_s=DELAY_S).start()
    yield server
    server.shutdown()


def _wait_until_emitting(server, seconds: float = 0.3, timeout_s: float = 30.0) -> None:
    """Wait until the stand-in has computed the request's tokens and let them come out for `seconds`.
    It computes a segment first and emits it on the delay's clock afterwards; an abort during the
    computation answers no tokens, so a fixed sleep made the count depend on the machine's load."""
    t0 = time.perf_counter()
    while server.control.segments_computed < 1:
        assert time.perf_counter() - t0 < timeout_s, "the stand-in never computed the request"
        time.sleep(0.01)
    time.sleep(seconds)


def _generate_in_background(url: str, rid: str, max_new_tokens: int = LONG) -> tuple[threading.Thread, dict]:
    payload = {
        "rid": rid,
        "input_ids": [1, 2, 3, 4],
        "return_logprob": True,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": max_new_tokens},
    }
    box: dict = {}
    thread = threading.Thread(
        target=lambda: box.setdefault("out", request_sync("POST", url + "/generate", payload, timeout_s=60)),
        daemon=True,
    )
    thread.start()
    return thread, box


@pytest.mark.parametrize("told", ["rid", "prefix", "abort_all"])
def test_abort_request_ends_the_request_early_with_finish_abort(slow_server, told):
    rid = "round-3-abcdef"
    thread, box = _generate_in_background(slow_server.url, rid)
    _wait_until_emitting(slow_server)
    assert thread.is_alive()
    body = {"rid": {"rid": rid}, "prefix": {"rid": "round-3-"}, "abort_all": {"abort_all": True}}[told]
    t0 = time.perf_counter()
    assert request_sync("POST", slow_server.url + "/abort_request", body, timeout_s=10) in ("", None)
    thread.join(timeout=30)
    waited = time.perf_counter() - t0
    meta = box["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort" and meta["finish_reason"]["message"] == "Aborted"
    # what it had emitted by the abort (the computation's time and 0.3 s on the 0.05 s clock), not all
    assert 0 < meta["completion_tokens"] == len(meta["output_token_logprobs"]) < LONG // 2
    assert waited < 2.0


def test_abort_request_of_a_rid_not_in_flight_is_ignored(slow_server):
    thread, box = _generate_in_background(slow_server.url, "kept", max_new_tokens=40)
    time.sleep(0.2)
    for body in ({"rid": "other"}, {"rid": ""}, {}):
        request_sync("POST", slow_server.url + "/abort_request", body, timeout_s=10)
    thread.join(timeout=30)
    meta = box["out"]["meta_info"]
    assert meta["finish_reason"]["type"] != "abort" and meta["completion_tokens"] > 0


def test_a_cancelled_backend_call_aborts_its_request_and_counts_its_tokens(slow_server):
    async def scenario() -> SGLangBackend:
        backend = SGLangBackend([slow_server.url], SGLangConfig(connect_timeout_s=5.0))
        try:
            long = SamplingParams(temperature=1.0, max_new_tokens=LONG, seed=3)
            task = asyncio.ensure_future(backend.generate([1, 2, 3, 4], long, []))
            await asyncio.to_thread(_wait_until_emitting, slow_server)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            t0 = time.perf_counter()
            while slow_server.control.in_flight and time.perf_counter() - t0 < 10.0:
                await asyncio.sleep(0.02)
        finally:
            await backend.aclose()
        return backend

    t0 = time.perf_counter()
    backend = asyncio.run(scenario())
    assert time.perf_counter() - t0 < 12.0  # not the 20 s of the whole answer
    assert slow_server.control.in_flight == set()  # the request ended on the server
    assert backend.aborted_requests == 1
    assert 0 < backend.take_aborted_tokens() < LONG // 2
