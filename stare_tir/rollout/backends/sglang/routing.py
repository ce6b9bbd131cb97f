"""Which server a `/generate` goes to: prefix affinity under a load bound, or least-loaded.

Every turn of a multi-turn trajectory sends the whole context again (prompt, earlier turns, tool
outputs). The server that answered the previous turn holds that prefix in its radix cache and
prefills only the new tokens; any other server prefills it all again. So (policy "affinity"):

- a turn that continues the previous request of the same trajectory (its prompt starts with that
  request's prompt + answer) goes to the server that answered it;
- a first turn goes to the server that already got the same prompt (the group's earlier samples
  share it), so a group's prompt is prefilled once;
- unless that server is over the load bound (more than `slack + slack_frac x least` requests in
  flight beyond the least-loaded server) or cannot take the request (connect failure, stale
  weights): then the least-loaded server takes it, and the trajectory follows it from there.

What a trajectory is: the rollout engine runs each trajectory as one asyncio task
(engine.py `RolloutEngine.generate`), so the task that awaits `generate` names it; the prefix
check makes a task that runs unrelated requests one after another harmless (no match, no
preference). AReaL pins a request id to a server the same way (areal/engine/sglang_remote.py
`rid_to_address`), without the load bound; sglang-router's cache_aware policy matches prefixes
itself, behind one URL (see `ROUTING_KEY_HEADER` for pinning trajectories there).

Every choice is counted, and so are the prompt tokens the servers report they took from their
cache (`take_stats`, the `route/*` metrics of docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Literal

# sglang-router's `--policy manual` pins each value of this header to one worker
# (sgl-model-gateway src/policies/manual.rs); other policies ignore it.
ROUTING_KEY_HEADER = "X-SMG-Routing-Key"

# Prompts remembered for group affinity (first turns only; a step has at most a few thousand).
GROUP_MEMORY = 8192

# What a pick can be, in the counters and metrics (route/<kind>).
PICK_KINDS = ("followed_turn", "followed_group", "moved_busy", "moved_down", "least_loaded")


@dataclass(frozen=True)
class _LastTurn:
    """What one trajectory's previous request left on its server: `length` tokens hashing to
    `prefix_hash` (prompt + answer)."""

    server: int
    length: int
    prefix_hash: int
    key: str


@dataclass(frozen=True)
class Request:
    """One `/generate` as routing sees it: the trajectory's key, and whether it continues that
    trajectory's previous request (`last`) or is a first turn (`group`: its prompt's hash)."""

    key: str
    last: _LastTurn | None
    group: int | None


class ServerPicker:
    """Chooses a server index for each request and counts the choices (no I/O).

    policy: "affinity" (see the module docstring) or "least_loaded" (fewest requests in flight,
    ties in turn). slack / slack_frac: the load bound of affinity. The caller keeps `inflight`
    (requests in flight per server) up to date.
    """

    def __init__(
        self,
        n_servers: int,
        policy: Literal["affinity", "least_loaded"] = "affinity",
        slack: int = 16,
        slack_frac: float = 0.5,
    ) -> None:
        if policy not in ("affinity", "least_loaded"):
            raise ValueError(f"routing={policy!r}: must be affinity or least_loaded")
        self.n = n_servers
        self.policy = policy
        self.slack, self.slack_frac = slack, slack_frac
        self.inflight = [0] * n_servers
        self._turn = itertools.count()
        self._keys = itertools.count()
        self._last: weakref.WeakKeyDictionary[asyncio.Task, _LastTurn] = weakref.WeakKeyDictionary()
        self._groups: OrderedDict[int, int] = OrderedDict()  # hash of a first-turn prompt -> server
        self.counts: Counter[str] = Counter()

    def request(self, prompt_ids: list[int]) -> Request:
        """What routing needs to know about a new request from the running task."""
        task = _current_task()
        last = self._last.get(task) if task is not None else None
        if last is not None and _continues(prompt_ids, last):
            return Request(last.key, last, None)
        return Request(f"traj-{next(self._keys)}", None, hash(tuple(prompt_ids)))

    def pick(self, req: Request, avoid: set[int] = frozenset(), stale: set[int] = frozenset()) -> int:
        """The server for `req`. avoid: servers this request could not reach; stale: servers set
        aside for their weights (used only when nothing else is left). Each call is counted."""
        usable = [i for i in range(self.n) if i not in stale]
        cands = [i for i in usable if i not in avoid] or usable or list(range(self.n))
        low = min(self.inflight[i] for i in cands)
        preferred = self._preferred(req) if self.policy == "affinity" else None
        server = None
        if preferred is None:
            self.counts["least_loaded"] += 1
        elif preferred[0] not in cands:
            self.counts["moved_down"] += 1
        elif self.inflight[preferred[0]] - low > self.slack + self.slack_frac * low:
            self.counts["moved_busy"] += 1
        else:
            self.counts[preferred[1]] += 1
            server = preferred[0]
        if server is None:
            ties = [i for i in cands if self.inflight[i] == low]
            server = ties[next(self._turn) % len(ties)]
        if req.group is not None and req.group not in self._groups:
            # Set when sent, not when answered: a group's samples start together, and the server
            # that prefills the prompt first serves it from its cache to the samples after it.
            self._groups[req.group] = server
            while len(self._groups) > GROUP_MEMORY:
                self._groups.popitem(last=False)
        return server

    def _preferred(self, req: Request) -> tuple[int, str] | None:
        if req.last is not None:
            return req.last.server, "followed_turn"
        server = self._groups.get(req.group)
        if server is None:
            return None
        self._groups.move_to_end(req.group)  # recently used: kept longest
        return server, "followed_group"

    def answered(
        self, req: Request, server: int, prompt_ids: list[int], output_ids: list[int], cached_tokens: int | None = None
    ) -> None:
        """`server` answered `req` with `output_ids`: its cache now holds prompt + answer, and the
        trajectory's next turn (same task, prompt starting with them) should go there.
        cached_tokens: the prompt tokens the server took from its cache (`meta_info.cached_tokens`;
        None: not reported)."""
        if cached_tokens is not None:
            self.counts["prompt_tokens"] += len(prompt_ids)
            self.counts["cached_tokens"] += min(int(cached_tokens), len(prompt_ids))
        task = _current_task()
        if task is not None:
            full = list(prompt_ids) + list(output_ids)
            self._last[task] = _LastTurn(server, len(full), hash(tuple(full)), req.key)

    def take_stats(self, picks: bool = True) -> dict[str, float]:
        """The `route/*` metrics since the last call (then reset): how the servers' caches served
        the prompts, and (`picks`) where the requests went and the share that went to a server
        holding their prefix."""
        counts, self.counts = self.counts, Counter()
        prompt = counts["prompt_tokens"]
        stats = {
            "route/prompt_tokens": float(prompt),
            "route/cached_frac": counts["cached_tokens"] / prompt if prompt else 0.0,
        }
        if picks:
            total = sum(counts[k] for k in PICK_KINDS)
            stats.update({f"route/{k}": float(counts[k]) for k in PICK_KINDS})
            stats["route/requests"] = float(total)
            followed = counts["followed_turn"] + counts["followed_group"]
            stats["route/affinity_frac"] = followed / total if total else 0.0
        return stats


def _current_task() -> asyncio.Task | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no running loop
        return None


def _continues(prompt_ids: list[int], last: _LastTurn) -> bool:
    """Does `prompt_ids` start with the previous request's prompt + answer?"""
    return len(prompt_ids) >= last.length and hash(tuple(prompt_ids[: last.length])) == last.prefix_hash
