"""Server picking (stare_tir/rollout/backends/sglang/routing.py): prefix affinity per trajectory
and per group under a load bound, fallback when a server is busy or down, and the counts.

Trajectories are asyncio tasks here as in the rollout engine; the picker does no I/O, so these
tests drive it directly (the real servers' radix cache is measured in
tests/sglang_real/test_sglang_affinity_router.py and scripts/bench/bench_sglang.py).
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
from pathlib import Path

import pytest

from stare_tir.rollout.backends.sglang import SGLangConfig
from stare_tir.rollout.backends.sglang.routing import GROUP_MEMORY, PICK_KINDS, ServerPicker

ROOT = Path(__file__).resolve().parents[2]


def _send(picker: ServerPicker, prompt: list[int], answer: list[int], avoid=frozenset(), stale=frozenset()) -> int:
    """One request as the backend makes it: pick, (in flight), answered."""
    req = picker.request(prompt)
    server = picker.pick(req, set(avoid), set(stale))
    picker.answered(req, server, prompt, answer)
    return server


async def _trajectory(picker: ServerPicker, prompt: list[int], turns: int, obs: list[int]) -> list[int]:
    """The servers of each turn of one trajectory: prompt, then answer + observation per turn."""
    servers, context = [], list(prompt)
    for t in range(turns):
        answer = [100 + t, 200 + t]
        servers.append(_send(picker, context, answer))
        context += answer + obs
    return servers


def test_every_turn_of_a_trajectory_goes_to_the_server_of_its_previous_turn():
    picker = ServerPicker(3)

    async def main():
        return await asyncio.gather(*(_trajectory(picker, [g, 1, 2, 3], 4, [7, 7]) for g in range(6)))

    runs = asyncio.run(main())
    assert all(len(set(servers)) == 1 for servers in runs), runs
    assert {s[0] for s in runs} == {0, 1, 2}  # distinct prompts still spread over the servers
    stats = picker.take_stats()
    assert stats["route/followed_turn"] == 6 * 3 and stats["route/least_loaded"] == 6
    assert stats["route/requests"] == 24 and stats["route/affinity_frac"] == 18 / 24


def test_least_loaded_ignores_the_previous_turn():
    picker = ServerPicker(2, policy="least_loaded")

    async def main():
        return await _trajectory(picker, [1, 2, 3], 4, [7])

    assert asyncio.run(main()) == [0, 1, 0, 1]  # nothing in flight: ties in turn
    assert picker.take_stats()["route/least_loaded"] == 4


def test_a_group_shares_the_server_of_its_prompt_until_the_load_bound():
    picker = ServerPicker(2, slack=2, slack_frac=0.0)
    prompt = [5, 6, 7]
    sent = []
    for _ in range(6):  # six samples of one group start together: none has answered yet
        req = picker.request(prompt)
        server = picker.pick(req)
        picker.inflight[server] += 1
        sent.append(server)
    # the first goes to the least-loaded server, the next two follow it; then server 0 has 3 in
    # flight against 0 (beyond the slack of 2) and the least-loaded one takes the next
    assert sent[:4] == [0, 0, 0, 1]
    stats = picker.take_stats()
    assert stats["route/followed_group"] >= 3 and stats["route/moved_busy"] >= 1
    assert sum(stats[f"route/{k}"] for k in PICK_KINDS) == 6


def test_a_busy_server_is_left_and_the_trajectory_follows_the_new_one():
    picker = ServerPicker(2, slack=1, slack_frac=0.0)

    async def main():
        first = _send(picker, [1, 2], [3])
        picker.inflight[first] += 5  # other trajectories keep it busy
        second = _send(picker, [1, 2, 3, 9], [4])
        picker.inflight[first] -= 5
        third = _send(picker, [1, 2, 3, 9, 4, 9], [5])
        return first, second, third

    first, second, third = asyncio.run(main())
    assert second != first and third == second  # moved once, then followed where its prefix now is
    stats = picker.take_stats()
    assert (stats["route/moved_busy"], stats["route/followed_turn"]) == (1.0, 1.0)


def test_the_relative_bound_scales_with_the_load():
    picker = ServerPicker(2, slack=0, slack_frac=0.5)

    async def main():
        first = _send(picker, [1], [2])
        other = 1 - first
        picker.inflight[other], picker.inflight[first] = 10, 15  # 5 more: within 0.5 x 10
        kept = _send(picker, [1, 2, 3], [4])
        picker.inflight[first] = 16  # 6 more: beyond it
        moved = _send(picker, [1, 2, 3, 4, 5], [6])
        return first, kept, moved

    first, kept, moved = asyncio.run(main())
    assert kept == first and moved != first


@pytest.mark.parametrize("why", ["unreachable", "stale"])
def test_a_server_that_is_down_or_stale_is_left(why):
    picker = ServerPicker(2)

    async def main():
        first = _send(picker, [1], [2])
        gone = {first}
        kwargs = {"avoid": gone} if why == "unreachable" else {"stale": gone}
        return first, _send(picker, [1, 2, 3], [4], **kwargs)

    first, second = asyncio.run(main())
    assert second != first
    assert picker.take_stats()["route/moved_down"] == 1.0


def test_an_unrelated_request_in_the_same_task_is_not_a_continuation():
    picker = ServerPicker(2)

    async def main(second_prompt):
        a = _send(picker, [1, 2, 3], [4])
        picker.inflight[a] += 1  # so a fresh pick prefers the other server
        b = _send(picker, second_prompt, [4])
        picker.inflight[a] -= 1
        return a, b

    for second in ([9, 9, 9, 9, 9], [1, 2, 3, 5, 6]):  # longer; or starts with the prompt, not the answer
        a, b = asyncio.run(main(second))
        assert b != a
    assert picker.take_stats()["route/followed_turn"] == 0
    a, b = asyncio.run(main([1, 2, 3, 4, 5]))  # the real continuation follows
    assert b == a


def test_memory_is_bounded_and_freed_with_the_trajectories():
    picker = ServerPicker(2)

    async def one(g: int):
        _send(picker, [g, g + 1], [0])

    async def main():
        await asyncio.gather(*(one(g) for g in range(GROUP_MEMORY + 10)))

    asyncio.run(main())
    gc.collect()
    assert len(picker._last) == 0  # finished tasks take their last turn with them
    assert len(picker._groups) == GROUP_MEMORY


def test_routing_settings_are_checked():
    with pytest.raises(ValueError, match="routing='nearest'"):
        SGLangConfig(routing="nearest")
    with pytest.raises(ValueError, match="affinity_slack"):
        SGLangConfig(affinity_slack=-1)
    assert ServerPicker(2).policy == SGLangConfig().routing == "affinity"


def test_every_route_key_is_documented():
    spec = importlib.util.spec_from_file_location("metrics_doc", ROOT / "tests" / "core" / "test_core_metrics_doc.py")
    doc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(doc)
    keys = ServerPicker(1).take_stats()
    cache = {"route/prompt_tokens", "route/cached_frac"}
    assert set(keys) == {f"route/{k}" for k in PICK_KINDS} | {"route/requests", "route/affinity_frac"} | cache
    assert set(ServerPicker(1).take_stats(picks=False)) == cache  # behind a router
    assert not doc.missing_from_doc(keys), doc.missing_from_doc(keys)


def test_cached_tokens_reported_by_the_servers_are_summed():
    picker = ServerPicker(2)

    async def main():
        for prompt, cached in (([1] * 10, 0), ([2] * 30, 24), ([3] * 10, None)):  # None: not reported
            req = picker.request(prompt)
            picker.answered(req, picker.pick(req), prompt, [0], cached)

    asyncio.run(main())
    stats = picker.take_stats()
    assert stats["route/prompt_tokens"] == 40 and stats["route/cached_frac"] == 24 / 40
    assert picker.take_stats()["route/prompt_tokens"] == 0  # taken: reset
