"""Routing over two REAL SGLang servers (0.5.23, CPU) and through the REAL sglang-router (0.3.2).

- Prefix affinity: through the rollout engine, every later turn of every trajectory finds its
  whole prefix (prompt + earlier turns + tool outputs) in the radix cache of the server that gets
  it, by the server's own `meta_info.cached_tokens`; least-loaded routing misses some.
- The router: the client's tokens through it equal the direct ones (greedy); it fans out
  /flush_cache and answers 404 to weight-update, pause and abort calls (so control calls go to
  `weight_urls`); `--policy manual` keeps each trajectory on one worker by the client's routing key.
- Its defaults re-send a generate (retries on a timed-out request) and cut long requests; the
  flags in `router.ROUTER_FLAGS` send it once and wait a week.
- A router given without (or with other) `weight_urls` is refused at start.

The second server and the router live for this module only (the first is the session's); the
module runs before tests/sglang_real/test_sglang_real.py on the same xdist worker.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path

import pytest

from envs.base import StepResult
from stare_tir.app.preflight import StartupError, check_router
from stare_tir.rollout.backends._http import HTTPError, request_sync
from stare_tir.rollout.backends.base import Generation
from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig
from stare_tir.rollout.backends.sglang.router import ROUTER_FLAGS, check_router_urls
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

from .conftest import LAUNCH, RealServer, _unavailable, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sglang_real")]

TURN_TOKENS = 6


@pytest.fixture(scope="module")
def second_server(tmp_path_factory) -> RealServer:
    # Like SGLANG_REAL_URL for the first: SGLANG_REAL_URL_B=... SGLANG_REAL_LOG_B=... reuse a running one.
    if os.environ.get("SGLANG_REAL_URL_B"):
        yield RealServer(
            os.environ["SGLANG_REAL_URL_B"].rstrip("/"),
            None,
            Path(os.environ["SGLANG_REAL_LOG_B"]),
            LAUNCH.TINY_BASE,
            0.0,
        )
        return
    server = start_server(tmp_path_factory.mktemp("sglang_b") / "server.log")
    print(f"\nsecond real SGLang server ready in {server.start_s:.1f} s at {server.url}")
    yield server
    stop_server(server)


def _router(log_path, workers: list[str], flags: list[str]):
    try:
        return LAUNCH.start_router(log_path, workers, flags)
    except LAUNCH.Unavailable as exc:
        _unavailable(str(exc))


@pytest.fixture(scope="module")
def router(sglang_server, second_server, tmp_path_factory):
    """sglang-router over both servers with the client's flags, pinning routing keys (manual)."""
    started = _router(
        tmp_path_factory.mktemp("router") / "router.log",
        [sglang_server.url, second_server.url],
        [*ROUTER_FLAGS, "--policy", "manual"],
    )
    yield started
    LAUNCH.stop(started)


@pytest.fixture(scope="module")
def tok():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(LAUNCH.TINY_BASE))


class ToolTurns:
    """Ends every turn after TURN_TOKENS sampled tokens as if it wrote "</code>" (the tiny model
    rarely calls the tool itself); the tokens are the server's."""

    def __init__(self, backend) -> None:
        self.backend = backend

    async def generate(self, prompt_ids, sampling, stop) -> Generation:
        from dataclasses import replace

        n = min(sampling.max_new_tokens, TURN_TOKENS)
        gen = await self.backend.generate(prompt_ids, replace(sampling, max_new_tokens=n), stop)
        if gen.finish_reason == "length" and n < sampling.max_new_tokens:
            return Generation(gen.token_ids, gen.logprobs, "stop", "</code>")
        return gen


class ToolEnv:
    """Every turn is a tool call with a short interpreter answer, three calls, then done."""

    stop_strings = ["</code>"]

    def __init__(self, problem: dict) -> None:
        self.problem, self.stats, self.sandbox_error = problem, {"tool_calls": 0}, False

    def initial_messages(self) -> list[dict]:
        return [{"role": "system", "content": "Use <code> for Python."}, {"role": "user", "content": self.problem["q"]}]

    async def step(self, turn_text: str) -> StepResult:
        if self.stats["tool_calls"] >= 3:
            return StepResult(None, True, {"reason": "answer"})
        self.stats["tool_calls"] += 1
        await asyncio.sleep(0.01)
        return StepResult(f"\n<interpreter>\n{self.stats['tool_calls']}\n</interpreter>\n", False, {})

    def reward(self, text: str) -> tuple[float, dict]:
        return 0.0, {"correct": False}

    async def close(self) -> None:
        pass


class Recorder:
    """The backend's HTTP client, keeping each /generate's server, input ids and answer."""

    def __init__(self, client) -> None:
        self.client, self.records = client, []

    async def request(self, method, url, payload=None, headers=None):
        out = await self.client.request(method, url, payload, headers)
        if url.endswith("/generate"):
            self.records.append((url.rsplit("/generate", 1)[0], list(payload["input_ids"]), out))
        return out

    def __getattr__(self, name):
        return getattr(self.client, name)


# An odd count: least-loaded breaks ties in turn, so with an even count trajectories that move in
# lockstep would land every turn on the server of their previous one, and miss nothing.
PROBLEMS = [{"id": str(i), "q": f"What is {i} * {i + 13} + {3 * i}?"} for i in range(13)]


def _rollout(backend: SGLangBackend, tok):
    """The engine over PROBLEMS (greedy, one sample each); (trajectories, recorded requests)."""
    backend.flush_cache()
    recorder = Recorder(backend._client)
    backend._client = recorder
    cfg = RolloutConfig(
        n_per_prompt=1, max_turns=4, max_total_tokens=256, max_new_tokens_per_turn=64, temperature=0.0, progress=False
    )
    engine = RolloutEngine(ToolTurns(backend), tok, ToolEnv, cfg)
    try:
        trajs, _ = engine.run(PROBLEMS)
        engine.run_coroutine(backend.aclose())
    finally:
        engine.close()
    assert not [t.info.get("error") for t in trajs if t.finish_reason == "error"]
    return trajs, recorder.records


def _later_turns(records) -> list[tuple[int, int, int]]:
    """(cached tokens, prompt tokens, length of the turn before) of every request that continues
    an earlier one (its prompt starts with that request's prompt + answer)."""
    done, out = [], []
    for _, ids, answer in records:
        meta = answer["meta_info"]
        before = max((len(d) for d in done if len(d) <= len(ids) and tuple(ids[: len(d)]) == d), default=0)
        if before:
            out.append((int(meta["cached_tokens"]), len(ids), before))
        done.append(tuple(ids) + tuple(int(e[1]) for e in meta["output_token_logprobs"]))
    return out


def test_affinity_keeps_every_later_turn_on_the_server_caching_its_prefix(sglang_server, second_server, tok):
    urls = [sglang_server.url, second_server.url]
    affinity = SGLangBackend(urls, SGLangConfig(), tokenizer=tok)
    trajs, records = _rollout(affinity, tok)
    later = _later_turns(records)
    assert len(later) >= 12 and {r[0] for r in records} == set(urls)  # multi-turn, both servers used
    # SGLang caches a finished request's prompt + answer but its last token: the whole prefix hit
    assert all(cached >= before - 1 for cached, _, before in later), later
    stats = affinity.take_route_stats()
    assert stats["route/followed_turn"] == len(later) and stats["route/cached_frac"] > 0.5

    least = SGLangBackend(urls, SGLangConfig(routing="least_loaded"), tokenizer=tok)
    again, records = _rollout(least, tok)
    misses = [r for r in _later_turns(records) if r[0] < r[2] - 1]
    assert misses, "least-loaded should send some later turns to the server without their prefix"
    assert [t.response_ids for t in again] == [t.response_ids for t in trajs]  # greedy: same tokens


def test_the_client_through_the_real_router(sglang_server, second_server, router, tok):
    urls = [sglang_server.url, second_server.url]
    direct, _ = _rollout(SGLangBackend(urls, SGLangConfig(), tokenizer=tok), tok)
    behind = SGLangBackend([router.url], SGLangConfig(weight_urls=urls), tokenizer=tok)
    routed, records = _rollout(behind, tok)
    assert [t.response_ids for t in routed] == [t.response_ids for t in direct]
    # --policy manual + the client's X-SMG-Routing-Key: each trajectory stays on one worker
    assert all(cached >= before - 1 for cached, _, before in _later_turns(records))
    assert set(behind.take_route_stats()) == {"route/prompt_tokens", "route/cached_frac"}

    # The router fans /flush_cache out to every worker, and refuses every control call.
    flushes = [s.log_text().count('"POST /flush_cache') for s in (sglang_server, second_server)]
    request_sync("POST", router.url + "/flush_cache", {}, timeout_s=60)
    assert [s.log_text().count('"POST /flush_cache') for s in (sglang_server, second_server)] == [
        n + 1 for n in flushes
    ]
    for path in (
        "/update_weights_from_disk",
        "/update_weights_from_distributed",
        "/init_weights_update_group",
        "/begin_weight_update",
        "/pause_generation",
        "/continue_generation",
        "/abort_request",
        "/release_memory_occupation",
    ):
        with pytest.raises(HTTPError) as err:
            request_sync("POST", router.url + path, {}, timeout_s=30)
        assert err.value.status == 404, path


def test_a_router_without_its_workers_in_weight_urls_is_refused_at_start(sglang_server, second_server, router):
    urls = [sglang_server.url, second_server.url]
    with pytest.raises(ValueError, match=r"sglang-router .* rollout.sglang.weight_urls is empty"):
        check_router_urls([router.url], [])
    with pytest.raises(ValueError, match=r"never gets new weights"):
        check_router_urls([router.url], urls[:1])
    check_router_urls([router.url], urls)  # its workers: accepted
    check_router_urls(urls, [])  # plain servers: nothing to check
    with pytest.raises(StartupError, match="weight_urls is empty") as err:
        check_router(SGLangConfig(urls=[router.url]))  # what the trainer's start-up checks call
    message = str(err.value)
    assert "\n" not in message and "List its workers in rollout.sglang.weight_urls" in message
    assert all(u in message for u in urls)  # the fix names the workers to list


def _router_sends(router) -> int:
    """How many times the router sent a /generate to a worker that failed (its own log)."""
    return len(re.findall(r"Failed to send typed request worker_url=\S+ route=/generate", router.log_text()))


PREFILL = re.compile(r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+)")


def _runs(server: RealServer, since: int, prompt_len: int) -> int:
    """Requests of `prompt_len` tokens the worker started since log offset `since`, by its prefill
    log lines (a re-sent prompt is mostly cached: new + cached tokens is still its length). Counting
    starts, not aborts: a run that finishes within the 4 s in which SGLang notices a dropped client
    (tokenizer_manager.py `_REQUEST_STATE_WAIT_TIMEOUT`) is never logged as aborted."""
    runs = 0
    for seqs, new, cached in PREFILL.findall(server.log_text()[since:]):
        if int(new) + int(cached) == prompt_len * int(seqs):
            runs += int(seqs)
    return runs


def _worker_runs(server: RealServer, since: int, prompt_len: int, expected: int, timeout_s: float = 30.0) -> int:
    """`_runs` once `expected` are in (or at the deadline), then one more second for a late extra one."""
    deadline = time.monotonic() + timeout_s
    while _runs(server, since, prompt_len) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)
    return _runs(server, since, prompt_len)


def _with_timeout(flags, seconds: int) -> list[str]:
    """`flags` with --request-timeout-secs set to `seconds`."""
    out = list(flags)
    out[out.index("--request-timeout-secs") + 1] = str(seconds)
    return out


def test_router_defaults_resend_a_generate_and_the_flags_stop_it(sglang_server, tmp_path):
    """With a 1 s request timeout, one client request that runs longer is sent again and again by
    the router's default retries (each attempt cut by the router, run again on the worker); with
    the client's ROUTER_FLAGS (their timeout cut to 1 s here) it is sent once. Their own timeout is
    a week."""
    prompt = list(range(100, 137))  # a length no other request of this module has
    long = {
        "input_ids": prompt,
        "sampling_params": {"temperature": 0, "max_new_tokens": 1000, "ignore_eos": True},
    }

    def attempts(name: str, flags: list[str]) -> tuple[int, int]:
        """(sends by the router, runs started on the worker) of the one client request."""
        router = _router(tmp_path / f"router_{name}.log", [sglang_server.url], flags)
        since = len(sglang_server.log_text())
        try:
            with pytest.raises(HTTPError):
                request_sync("POST", router.url + "/generate", long, timeout_s=300)
        finally:
            LAUNCH.stop(router)
        sends = _router_sends(router)
        return sends, _worker_runs(sglang_server, since, len(prompt), sends)

    sends, runs = attempts("defaults", ["--request-timeout-secs", "1"])
    assert sends >= 3 and runs == sends  # every re-send ran on the worker again
    assert attempts("client_flags", _with_timeout(ROUTER_FLAGS, 1)) == (1, 1)
    # A timeout cuts a turn (above): the client's must outlast any turn (the client waits forever).
    assert int(ROUTER_FLAGS[ROUTER_FLAGS.index("--request-timeout-secs") + 1]) >= 7 * 24 * 3600
