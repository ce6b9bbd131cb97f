"""Benchmark rollout at scale on two real SGLang CPU servers (`make sglang-cpu`), the tiny model.

Multi-turn trajectories with tool calls: the Retool prompt (system + problem), every model turn
ends in a tool call after --turn-tokens sampled tokens (the tokens are the model's own, greedy; a
thin wrapper ends the turn as if it wrote "</code>", as scripts/bench/bench_rollout.py does, since the
tiny base model rarely calls the tool by itself), and the tool answers a short interpreter block
after --tool-latency s. Every run starts from empty radix caches (/flush_cache).

1. Prefix affinity: the same rollout with rollout.sglang.routing=affinity and =least_loaded over
   both servers. cached_frac = the servers' own `meta_info.cached_tokens` / `prompt_tokens`
   summed over turns >= 2 (a first turn's prompt is new to any server). tokens_identical: every
   trajectory sampled the same tokens under both policies (greedy decoding).
2. sglang-router (0.3.2 pinned) in front of both servers, with the flags the client needs
   (stare_tir/rollout/backends/sglang/router.py ROUTER_FLAGS), under its default policy
   cache_aware and under `manual` (the client's trajectory key in X-SMG-Routing-Key):
   cached_frac through the router, and router_tokens_identical (the same tokens as direct).
3. Engine overhead: the rollout engine (affinity, 0 s tools) against raw /generate calls at the
   same concurrency: every trajectory's recorded requests replayed in order, all trajectories at
   once, each request to the server the engine sent it to (so both see the same caches and
   load), with a bare aiohttp client. engine_overhead = engine wall / raw wall, the fastest of
   --repeats interleaved runs each (the machine is shared: other load only adds time).

Last line: RESULT cached_frac_affinity=... cached_frac_least_loaded=... tokens_identical=...
router=... router_tokens_identical=... engine_overhead=... (and cached_frac_router*=...)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_by_path(name: str, path: Path):
    """A module from a file of this repository that is no package (tools/, scripts/)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


LAUNCH = load_by_path("sglang_cpu_launch", ROOT / "tools" / "sglang_cpu" / "launch.py")
ROLLOUT_BENCH = load_by_path("bench_rollout", ROOT / "scripts" / "bench" / "bench_rollout.py")


class ToolCallEnv(ROLLOUT_BENCH.SleepToolEnv):
    """bench_rollout's tool env (every turn a tool call of `latency` s) with the Retool prompt."""

    def initial_messages(self) -> list[dict]:
        from envs.retool import RetoolEnv

        return RetoolEnv(self.problem, sandbox=None).initial_messages()


class RecordingClient:
    """Wraps the backend's HTTP client: keeps every /generate's server, input ids and answer."""

    def __init__(self, client) -> None:
        self.client = client
        self.records: list[tuple[str, list[int], dict, dict]] = []  # url, input ids, payload, answer

    async def request(self, method, url, payload=None, headers=None):
        out = await self.client.request(method, url, payload, headers)
        if url.endswith("/generate"):
            self.records.append((url.rsplit("/generate", 1)[0], list(payload["input_ids"]), payload, out))
        return out

    def __getattr__(self, name):
        return getattr(self.client, name)


def cached_frac(records, first_prompts: set[tuple[int, ...]], first: bool = False) -> tuple[float, int, int]:
    """sum(cached_tokens) / sum(prompt_tokens) over the requests that are not a first turn (or,
    with `first`, over the first turns only); also the request count and the uncached tokens."""
    cached = prompt = n = 0
    for _, ids, _, out in records:
        if (tuple(ids) in first_prompts) != first:
            continue
        meta = out["meta_info"]
        cached += int(meta.get("cached_tokens", 0))
        prompt += int(meta.get("prompt_tokens", len(ids)))
        n += 1
    return cached / max(prompt, 1), n, prompt - cached


def flush(urls: list[str]) -> None:
    from stare_tir.rollout.backends.sglang.push import flush_cache

    flush_cache(urls, 60.0, 40, 0.25)


def rollout(urls, weight_urls, routing, tok, problems, args, latency):
    """One rollout through SGLangBackend + RolloutEngine; (trajectories, records, wall s, route stats)."""
    from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

    flush(weight_urls)
    backend = SGLangBackend(urls, SGLangConfig(weight_urls=list(weight_urls), routing=routing), tokenizer=tok)
    recorder = RecordingClient(backend._client)
    backend._client = recorder
    budget = (args.tool_calls + 1) * (args.turn_tokens + 48)
    cfg = RolloutConfig(
        n_per_prompt=args.n,
        max_turns=args.tool_calls + 1,
        max_total_tokens=budget,
        max_new_tokens_per_turn=budget,
        temperature=0.0,
        max_concurrency=len(problems) * args.n,
        progress=False,
    )
    wrapped = ROLLOUT_BENCH.TurnsEndInToolCalls(backend, args.turn_tokens)
    engine = RolloutEngine(wrapped, tok, lambda p: ToolCallEnv(p, latency, args.tool_calls), cfg)
    try:
        t, cpu = time.perf_counter(), time.process_time()
        trajs, _ = engine.run(problems)
        wall = time.perf_counter() - t
        rollout.cpu_s = time.process_time() - cpu  # this process's CPU time (the client's own work)
    finally:
        engine.run_coroutine(backend.aclose())
        engine.close()
    errors = [t.info.get("error") for t in trajs if t.finish_reason == "error"]
    if errors:
        raise RuntimeError(f"{len(errors)} trajectories failed, first: {errors[0]}")
    return trajs, recorder.records, wall, backend.take_route_stats()


async def replay(records, concurrency_groups: list[list[int]]) -> list[list[int]]:
    """Raw /generate calls: each group (one trajectory's requests, in order) runs sequentially,
    all groups at once, each request to the server the engine used. Returns the output ids."""
    import aiohttp

    outputs: list[list[int]] = [[] for _ in records]
    timeout = aiohttp.ClientTimeout(total=None, connect=30)
    connector = aiohttp.TCPConnector(limit=256, keepalive_timeout=4.0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, trust_env=False) as session:

        async def one_trajectory(indices: list[int]) -> None:
            for i in indices:
                url, _, payload, _ = records[i]
                async with session.post(url + "/generate", json=payload) as resp:
                    body = await resp.json()
                outputs[i] = [int(e[1]) for e in body["meta_info"]["output_token_logprobs"]]

        await asyncio.gather(*(one_trajectory(g) for g in concurrency_groups))
    return outputs


def by_trajectory(records, first_prompts) -> list[list[int]]:
    """Record indices grouped by trajectory: a request continues the group whose last request's
    input + output starts its input (greedy siblings are identical: any match is equivalent)."""
    groups: list[list[int]] = []
    ends: dict[tuple[int, ...], list[int]] = {}
    for i, (_, ids, _, out) in enumerate(records):
        key = None
        for end in ends:
            if len(end) <= len(ids) and tuple(ids[: len(end)]) == end:
                key = end
                break
        group = ends.pop(key) if key is not None else None
        if group is None:
            group = []
            groups.append(group)
        group.append(i)
        ends[tuple(ids) + tuple(int(e[1]) for e in out["meta_info"]["output_token_logprobs"])] = group
    return groups


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=64)
    # One sample per problem: under greedy decoding a group's samples are identical, so any
    # server that served a sibling holds the whole prefix and least-loaded would look cached.
    ap.add_argument("--n", type=int, default=1, help="samples per problem (a group)")
    ap.add_argument("--group-n", type=int, default=4, help="samples per problem in part 1's group run")
    ap.add_argument("--tool-calls", type=int, default=3, help="tool calls per trajectory (turns = this + 1)")
    ap.add_argument("--turn-tokens", type=int, default=8)
    ap.add_argument("--tool-latency", type=float, default=0.05, help="seconds per tool call in parts 1-2")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved engine/raw runs in part 3")
    ap.add_argument("--max-total-tokens", type=int, default=65536, help="each server's KV pool (radix cache)")
    ap.add_argument("--urls", default="", help="two running servers (comma-separated) instead of starting them")
    ap.add_argument("--logs", default="", help="directory for the servers' and router's logs (default: temporary)")
    args = ap.parse_args()

    from transformers import AutoTokenizer

    from envs.arithmetic import make_problems
    from stare_tir.rollout.backends.sglang.router import ROUTER_FLAGS

    logs = Path(args.logs or tempfile.mkdtemp(prefix="bench_sglang_"))
    logs.mkdir(parents=True, exist_ok=True)
    started = []
    try:
        if args.urls:
            urls = [u.rstrip("/") for u in args.urls.split(",")]
        else:
            t = time.perf_counter()
            for name in ("a", "b"):
                started.append(LAUNCH.start_server(logs / f"server_{name}.log", max_total_tokens=args.max_total_tokens))
            urls = [s.url for s in started]
            print(f"two real SGLang servers ready in {time.perf_counter() - t:.0f} s: {urls} (logs in {logs})")
        tok = AutoTokenizer.from_pretrained(str(LAUNCH.TINY_BASE))
        problems = make_problems(args.problems, 0, "test")
        first_prompts = {tuple(first_turn_prompt(tok, p)) for p in problems}
        n_traj = len(problems) * args.n
        print(
            f"{n_traj} trajectories ({args.problems} problems x {args.n}), {args.tool_calls + 1} turns of "
            f"{args.turn_tokens} tokens, tool latency {args.tool_latency} s, greedy"
        )

        # ------------------------------------------------------------ 1. affinity vs least-loaded
        runs = {}
        for routing in ("affinity", "least_loaded"):
            trajs, records, wall, route = rollout(urls, urls, routing, tok, problems, args, args.tool_latency)
            frac, later, uncached = cached_frac(records, first_prompts)
            split = {u: sum(r[0] == u for r in records) for u in urls}
            runs[routing] = (trajs, frac, uncached)
            print(
                f"[1] {routing:12s} cached_frac={frac:.3f} over {later} later turns ({uncached} tokens prefilled), "
                f"wall {wall:.2f} s, requests per server {list(split.values())}, "
                f"route { ({k[6:]: (round(v, 3) if k.endswith('_frac') else int(v)) for k, v in route.items()}) }"
            )
        same = [a.response_ids == b.response_ids for a, b in zip(runs["affinity"][0], runs["least_loaded"][0])]
        tokens_identical = all(same)
        print(
            f"    tokens identical in {sum(same)}/{len(same)} trajectories; later turns prefill "
            f"{runs['least_loaded'][2] / max(runs['affinity'][2], 1):.1f}x the tokens under least-loaded"
        )
        # groups: the first turns of a group's samples share the whole prompt
        gproblems = problems[: max(1, args.problems // args.group_n)]
        gprompts = {tuple(first_turn_prompt(tok, p)) for p in gproblems}
        gargs = argparse.Namespace(**{**vars(args), "n": args.group_n, "tool_calls": 0})
        for routing in ("affinity", "least_loaded"):
            _, records, _, _ = rollout(urls, urls, routing, tok, gproblems, gargs, 0.0)
            frac, firsts, _ = cached_frac(records, gprompts, first=True)
            print(
                f"[1] groups of {args.group_n}, {routing:12s} first-turn cached_frac={frac:.3f} over {firsts} first turns"
            )

        # ------------------------------------------------------------------ 2. sglang-router
        router_fracs, router_same = {}, []
        for policy in ("cache_aware", "manual"):
            flags = [*ROUTER_FLAGS, "--policy", policy]
            router = LAUNCH.start_router(logs / f"router_{policy}.log", urls, flags)
            started.append(router)
            try:
                trajs, records, wall, _ = rollout(
                    [router.url], urls, "affinity", tok, problems, args, args.tool_latency
                )
            finally:
                LAUNCH.stop(router)
                started.remove(router)
            frac, later, _ = cached_frac(records, first_prompts)
            same = [a.response_ids == b.response_ids for a, b in zip(runs["affinity"][0], trajs)]
            router_fracs[policy] = frac
            router_same += same
            print(
                f"[2] router --policy {policy:11s} cached_frac={frac:.3f} over {later} later turns, wall {wall:.2f} s, "
                f"tokens identical to direct in {sum(same)}/{len(same)} trajectories"
            )
        print(f"    router flags: {' '.join(ROUTER_FLAGS)}")

        # ------------------------------------------------------------------ 3. engine overhead
        eng_walls, raw_walls, eng_cpu, raw_cpu, replay_same = [], [], [], [], True
        for _ in range(args.repeats):
            trajs, records, wall, _ = rollout(urls, urls, "affinity", tok, problems, args, 0.0)
            eng_walls.append(wall)
            eng_cpu.append(rollout.cpu_s)
            groups = by_trajectory(records, first_prompts)
            flush(urls)
            t, cpu = time.perf_counter(), time.process_time()
            outputs = asyncio.run(replay(records, groups))
            raw_walls.append(time.perf_counter() - t)
            raw_cpu.append(time.process_time() - cpu)
            recorded = [[int(e[1]) for e in r[3]["meta_info"]["output_token_logprobs"]] for r in records]
            replay_same &= outputs == recorded
        overhead = min(eng_walls) / min(raw_walls)
        print(
            f"[3] {len(records)} requests in {len(groups)} concurrent trajectories: engine "
            f"{[round(w, 2) for w in eng_walls]} s, raw {[round(w, 2) for w in raw_walls]} s, "
            f"raw tokens identical: {replay_same}; engine_overhead = {overhead:.3f}"
        )
        print(
            f"    client process CPU time, fastest run: engine {min(eng_cpu):.2f} s, raw {min(raw_cpu):.2f} s; load "
            f"average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (on CPU servers the client's CPU competes "
            "with theirs and other load stretches it; on GPU servers it does not)"
        )
    finally:
        for process in started:
            LAUNCH.stop(process)

    print(
        f"RESULT cached_frac_affinity={runs['affinity'][1]:.3f} cached_frac_least_loaded={runs['least_loaded'][1]:.3f} "
        f"tokens_identical={int(tokens_identical)} router=sglang-router-{LAUNCH.router_version()} "
        f"router_tokens_identical={int(all(router_same))} engine_overhead={overhead:.3f} "
        f"cached_frac_router={router_fracs['cache_aware']:.3f} cached_frac_router_manual={router_fracs['manual']:.3f}"
    )


def first_turn_prompt(tok, problem: dict) -> list[int]:
    """The engine's first-turn prompt ids for `problem` (chat template applied once)."""
    env = ToolCallEnv(problem, 0.0, 0)
    text = tok.apply_chat_template(env.initial_messages(), tokenize=False, add_generation_prompt=True)
    return list(tok(text, add_special_tokens=False)["input_ids"])


if __name__ == "__main__":
    main()
