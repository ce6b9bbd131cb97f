"""Aborting a request on the REAL SGLang server (0.5.23, CPU build): what `algo.round_end=enough`
relies on when it cancels the trajectories still generating.

`/abort_request {"rid"}` (entrypoints/http_server.py `abort_request`) ends the request named by the
rid its /generate carried: the answer comes back at once with finish_reason "abort" and only the
tokens generated so far; and a cancelled `SGLangBackend.generate` sends it, so the server is idle
(flush succeeds) long before the answer could have finished.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid

import pytest

from stare_tir.rollout.backends._http import HTTPError, request_sync
from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.sglang import SGLangBackend

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sglang_real")]

LONG = 2000  # new tokens (the context holds 2048): several seconds of the tiny model on CPU, far beyond the waits below


@pytest.fixture(scope="module")
def prompt() -> list[int]:
    from transformers import AutoTokenizer

    from .conftest import TINY_BASE

    tok = AutoTokenizer.from_pretrained(str(TINY_BASE))
    return tok("x = 12 * 7\nprint(x)\n", add_special_tokens=False)["input_ids"]


def test_abort_request_ends_a_running_request_early_with_finish_abort(sglang_server, prompt):
    url = sglang_server.url
    rid = f"abort-test-{uuid.uuid4().hex}"
    payload = {
        "rid": rid,
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": LONG, "ignore_eos": True},
    }
    box: dict = {}
    thread = threading.Thread(
        target=lambda: box.setdefault("out", request_sync("POST", url + "/generate", payload, timeout_s=600))
    )
    thread.start()
    time.sleep(1.0)
    assert thread.is_alive(), "the answer ended before the abort: make it longer"
    t0 = time.perf_counter()
    request_sync("POST", url + "/abort_request", {"rid": rid}, timeout_s=30)
    thread.join(timeout=60)
    waited = time.perf_counter() - t0
    meta = box["out"]["meta_info"]
    assert meta["finish_reason"]["type"] == "abort", meta["finish_reason"]
    assert meta["completion_tokens"] < LONG // 2, meta["completion_tokens"]
    assert waited < 10.0


def _flush_when_idle(url: str, timeout_s: float) -> float:
    """Seconds until /flush_cache succeeds (the server refuses it while a request runs)."""
    t0 = time.perf_counter()
    while True:
        try:
            request_sync("POST", url + "/flush_cache", {}, timeout_s=30)
            return time.perf_counter() - t0
        except HTTPError:
            if time.perf_counter() - t0 > timeout_s:
                raise
            time.sleep(0.1)


def test_a_cancelled_backend_call_stops_its_request_on_the_server(sglang_server, prompt):
    url = sglang_server.url
    backend = SGLangBackend([url])
    send = backend._client.request

    async def long_answers(method, target, payload=None, headers=None):
        if target.endswith("/generate"):  # the tiny model soon samples EOS: make the answer long
            payload = {**payload, "sampling_params": {**payload["sampling_params"], "ignore_eos": True}}
        return await send(method, target, payload, headers)

    backend._client.request = long_answers

    async def scenario() -> float:
        sampling = SamplingParams(temperature=1.0, max_new_tokens=LONG)
        task = asyncio.ensure_future(backend.generate(prompt, sampling, []))
        await asyncio.sleep(1.0)
        assert not task.done(), "the answer ended before the cancel: make it longer"
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return await asyncio.to_thread(_flush_when_idle, url, 30.0)

    try:
        idle_after = asyncio.run(scenario())
    finally:
        asyncio.run(backend.aclose())
        backend.close()
    # Idle at once (measured 0.12 s): the request no longer runs. Without the abort the closed
    # connection alone is noticed by the server's periodic disconnect check (measured 3.1 s).
    assert idle_after < 1.5, idle_after
    assert backend.aborted_requests == 1
    assert 0 < backend.take_aborted_tokens() < LONG // 2  # what it had sampled when aborted
