"""sglang-router in front of the servers: what it forwards, the flags it must run with, and the
start-up check of a router URL.

What sglang-router 0.3.2 (the Rust router on PyPI) does with the client's calls, measured against
it and two real SGLang servers (tests/sglang_real/test_sglang_affinity_router.py):
- `/generate` goes to one worker that its `--policy` picks; the worker's answer comes back as is
  (token ids, logprobs, `meta_info` with `weight_version` and `cached_tokens`).
- `/flush_cache` is sent to every worker.
- weight updates (`/update_weights_from_*`, `/init_weights_update_group`, `/begin_weight_update`,
  ...), `/pause_generation`, `/continue_generation`, `/abort_request` and the memory calls answer
  404: control calls must reach the workers themselves, so behind a router `urls` is the router
  and `weight_urls` lists its workers.
- `GET /workers` lists its workers (an SGLang server answers 404): that is how a router is told
  apart from a server (`layout.is_router`).

Two of its defaults break the client's rules and must be changed (`ROUTER_FLAGS`):
- it retries a failed request up to 5 times on another worker (on 408, 429, 500, 502, 503, 504,
  or a broken connection), so a `/generate` that already reached a worker may run again: the client
  never re-sends a generate that went out (`--disable-retries`);
- it gives every request 1800 s in total (`--request-timeout-secs`), so exactly the long turns of
  a loaded server would be cut and lost: the client sets no total timeout. 604800 s (a week) is
  the stand-in for none.
The router reports neither setting (no endpoint shows its arguments, and it overwrites its own
command line with its process title), so they cannot be checked from here: the start-up check
below says so in the log, naming them. What can be checked is checked: a router given without
`weight_urls` is refused, and `weight_urls` must be exactly the router's workers (a worker left out
would never get new weights, and its answers would come from the starting weights).

Its default `--policy cache_aware` keeps requests that share a prefix on one worker while the
load is balanced; `--policy manual` pins each value of the `X-SMG-Routing-Key` header to one
worker, and the client sends the trajectory's key in it (`routing.ROUTING_KEY_HEADER`).
scripts/bench/bench_sglang.py measures both.
"""

from __future__ import annotations

from loguru import logger

from stare_tir.rollout.backends._http import HTTPError, request_sync
from stare_tir.rollout.backends.sglang.layout import is_router

# The router flags the client needs (see the module docstring), as a command-line fragment.
ROUTER_FLAGS = ("--disable-retries", "--request-timeout-secs", "604800")


def router_workers(url: str, timeout_s: float) -> list[str] | None:
    """The worker URLs a sglang-router at `url` routes to; None when `url` is not a router.

    0.3.x answers GET /workers with {"workers": [{"url": ...}, ...]}; older routers answered
    GET /list_workers with {"urls": [...]}.
    """
    if not is_router(url, timeout_s):
        return None
    for path in ("/workers", "/list_workers"):
        try:
            listing = request_sync("GET", url + path, timeout_s=timeout_s)
        except HTTPError:
            continue
        if not isinstance(listing, dict):
            continue
        entries = listing.get("workers", listing.get("urls", []))
        found = [e.get("url", "") if isinstance(e, dict) else e for e in entries]
        return sorted(str(u).rstrip("/") for u in found if u)
    return []


def check_router_urls(urls: list[str], weight_urls: list[str], timeout_s: float = 30.0) -> None:
    """Refuse a sglang-router among `urls` without `weight_urls`, or with `weight_urls` other than
    its workers (ValueError naming the key and the fix); log the flags it must run with."""
    for url in (u.rstrip("/") for u in urls):
        workers = router_workers(url, timeout_s)
        if workers is None:
            continue
        if not weight_urls:
            raise ValueError(
                f"rollout.sglang.urls has a sglang-router ({url}) but rollout.sglang.weight_urls is empty: "
                "weight updates, flushes and memory calls must reach every worker, and the router answers "
                f"404 to them. List its workers in rollout.sglang.weight_urls (it routes to {workers})"
            )
        given = sorted(u.rstrip("/") for u in weight_urls)
        if workers and given != workers:
            raise ValueError(
                f"rollout.sglang.weight_urls={given} but the sglang-router at {url} routes to {workers}: a "
                "worker missing from weight_urls never gets new weights. Make weight_urls the router's workers"
            )
        logger.info(
            f"rollout.sglang.urls: {url} is a sglang-router over {workers}; it must run with "
            f"{' '.join(ROUTER_FLAGS)} (it reports neither, so this cannot be checked from here: README, GPUs)"
        )
