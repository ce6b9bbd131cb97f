"""Benchmark the rollout engine on the HF backend (CPU by default, the tiny Qwen2).

1. Engine overhead, single turn, no tools: the engine's wall time vs calling the backend's batched
   generate directly on the same prompt ids, token budget and per-request seeds (so both sample
   the very same tokens). engine_overhead_ratio = engine / direct (target <= 1.2).
2. Overlap, multi-turn: every turn ends in a tool call whose fake sandbox sleeps --tool-latency s.
   The wall time is compared with generation-only time (the same rollout with a 0 s sandbox)
   plus the serial sandbox time (tool calls x latency):
   overlap_ratio = wall / (gen_only + serial_sandbox); 1.0 would mean no overlap at all.
   So that a random tiny model makes tool calls, a thin wrapper ends each turn after
   --turn-tokens sampled tokens as if the model had written "</code>" (the tokens are real).

Timings are interleaved and each ratio uses the fastest of --repeats runs (as timeit does): on a
shared machine, other processes only ever add time, so the minimum is the least disturbed.

Last line: RESULT engine_overhead_ratio=<x> overlap_ratio=<y>
"""

from __future__ import annotations

import argparse
import asyncio
import time


class NoToolEnv:
    """Single turn: whatever the model writes is the final answer."""

    stop_strings: list[str] = []

    def __init__(self, problem: dict) -> None:
        self.problem = problem
        self.stats = {"tool_calls": 0}
        self.sandbox_error = False

    def initial_messages(self) -> list[dict]:
        return [{"role": "user", "content": self.problem["problem"]}]

    async def step(self, turn_text: str):
        from envs.base import StepResult

        return StepResult(None, True, {"reason": "answer"})

    def reward(self, text: str) -> tuple[float, dict]:
        return 0.0, {"correct": False, "pred": None}

    async def close(self) -> None:
        pass


class SleepToolEnv(NoToolEnv):
    """Every turn is a tool call that sleeps `latency` s, until `calls` calls; then done."""

    stop_strings = ["</code>"]

    def __init__(self, problem: dict, latency: float, calls: int) -> None:
        super().__init__(problem)
        self.latency, self.calls = latency, calls

    async def step(self, turn_text: str):
        from envs.base import StepResult

        if self.stats["tool_calls"] >= self.calls:
            return StepResult(None, True, {"reason": "answer"})
        self.stats["tool_calls"] += 1
        await asyncio.sleep(self.latency)
        return StepResult(f"\n<interpreter>\n{self.stats['tool_calls']}\n</interpreter>\n", False, {})


class TurnsEndInToolCalls:
    """Backend wrapper: a turn that reaches `turn_tokens` tokens ends as if it wrote "</code>"."""

    def __init__(self, backend, turn_tokens: int) -> None:
        self.backend, self.turn_tokens = backend, turn_tokens

    async def generate(self, prompt_ids, sampling, stop):
        from dataclasses import replace

        from stare_tir.rollout.backends.base import Generation

        n = min(sampling.max_new_tokens, self.turn_tokens)
        gen = await self.backend.generate(prompt_ids, replace(sampling, max_new_tokens=n), stop)
        if gen.finish_reason == "length" and n < sampling.max_new_tokens:
            return Generation(gen.token_ids, gen.logprobs, "stop", "</code>")
        return gen


def hf_generate_reference(backend, prompt_ids: list[list[int]], new_tokens: int) -> float:
    """Tokens/s of transformers' own generate() on the same prompts (left padding, KV cache)."""
    import torch

    tok, model = backend.tokenizer, backend.model
    batch = tok.pad({"input_ids": prompt_ids}, padding=True, padding_side="left", return_tensors="pt")
    batch = {k: v.to(backend.device) for k, v in batch.items()}
    kwargs = dict(
        max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=True, pad_token_id=backend.pad_token_id
    )
    with torch.inference_mode():
        model.generate(**batch, **kwargs)  # warm-up
        t = time.perf_counter()
        model.generate(**batch, **kwargs)
        return len(prompt_ids) * new_tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default="tiny-random",
        help="model.path: HF checkpoint dir, 'tiny' (the shipped base) or 'tiny-random' (built once)",
    )
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128, help="part 1 token budget per prompt")
    ap.add_argument("--batch", type=int, default=64, help="HF backend max_batch_size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    ap.add_argument("--multi-prompts", type=int, default=32)
    ap.add_argument("--multi-n", type=int, default=2, help="samples per prompt in part 2")
    ap.add_argument("--tool-calls", type=int, default=3)
    ap.add_argument("--turn-tokens", type=int, default=32)
    ap.add_argument("--tool-latency", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch

    from stare_tir.model import ModelConfig, resolve_model_path
    from stare_tir.rollout.backends.base import SamplingParams
    from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine, _derive_seed

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    path = resolve_model_path(ModelConfig(path=args.model))  # the names mean what they mean in training
    backend = HFBackend(path, cfg=HFBackendConfig(max_batch_size=args.batch))
    tok = backend.tokenizer
    print(f"model={path} device={backend.device} threads={torch.get_num_threads()} batch={args.batch}")

    # ---------------------------------------------------------------- 1. engine overhead
    problems = [
        {"id": f"q{i}", "problem": f"Compute {i} * {i + 7} and explain the steps."} for i in range(args.prompts)
    ]
    cfg = RolloutConfig(
        n_per_prompt=1,
        max_turns=1,
        max_total_tokens=args.new_tokens,
        max_new_tokens_per_turn=args.new_tokens,
        seed=args.seed,
        progress=False,
    )
    engine = RolloutEngine(backend, tok, NoToolEnv, cfg)
    prompt_ids = [engine._prompt_ids(NoToolEnv(p)) for p in problems]
    seeds = [_derive_seed(args.seed, g, 0, 0) for g in range(len(problems))]

    async def direct():
        return await asyncio.gather(
            *(
                backend.generate(p, SamplingParams(max_new_tokens=args.new_tokens, seed=s), [])
                for p, s in zip(prompt_ids, seeds)
            )
        )

    def time_engine() -> tuple[float, float, int]:
        t, c = time.perf_counter(), time.process_time()
        trajs, _ = engine.run(problems)
        return time.perf_counter() - t, time.process_time() - c, sum(len(x.response_ids) for x in trajs)

    def time_direct() -> tuple[float, float, int]:
        t, c = time.perf_counter(), time.process_time()
        gens = engine.run_coroutine(direct())
        return time.perf_counter() - t, time.process_time() - c, sum(len(g.token_ids) for g in gens)

    time_engine(), time_direct()  # warm-up (first forwards are slow)
    eng_t, dir_t, eng_c, dir_c = [], [], [], []
    for _ in range(args.repeats):  # interleaved, so load changes hit both alike
        (te, ce, ne), (td, cd, nd) = time_engine(), time_direct()
        eng_t.append(te)
        dir_t.append(td)
        eng_c.append(ce)
        dir_c.append(cd)
    if ne != nd:
        print(f"warning: engine sampled {ne} tokens, direct {nd} (should be equal)")
    e, d = min(eng_t), min(dir_t)
    overhead = e / d
    ref = hf_generate_reference(backend, prompt_ids, args.new_tokens)
    print(f"[1] single turn: {args.prompts} prompts x {args.new_tokens} tokens ({nd} sampled)")
    print(f"    direct batched generate: {d:.3f} s  ({nd / d:,.0f} tok/s)   runs={[round(x, 3) for x in dir_t]}")
    print(f"    engine:                  {e:.3f} s  ({ne / e:,.0f} tok/s)   runs={[round(x, 3) for x in eng_t]}")
    print(f"    reference: transformers generate(), same batch, KV cache: {ref:,.0f} tok/s")
    print(
        f"    process CPU time (all threads), fastest run: engine {min(eng_c):.3f} s, "
        f"direct {min(dir_c):.3f} s, ratio {min(eng_c) / min(dir_c):.3f}"
    )
    print(f"    engine_overhead_ratio = {overhead:.3f}")

    # ---------------------------------------------------------------- 2. overlap
    mproblems = [{"id": f"m{i}", "problem": f"Use the tool to compute {i} ** 3."} for i in range(args.multi_prompts)]
    budget = (args.tool_calls + 1) * (args.turn_tokens + 16)
    mcfg = RolloutConfig(
        n_per_prompt=args.multi_n,
        max_turns=args.tool_calls + 1,
        max_total_tokens=budget,
        max_new_tokens_per_turn=budget,
        seed=args.seed + 1,
        progress=False,
    )
    wrapped = TurnsEndInToolCalls(backend, args.turn_tokens)

    def rollout(latency: float) -> tuple[float, dict]:
        eng = RolloutEngine(wrapped, tok, lambda p: SleepToolEnv(p, latency, args.tool_calls), mcfg)
        t = time.perf_counter()
        trajs, stats = eng.run(mproblems)
        wall = time.perf_counter() - t
        eng.close()
        return wall, stats

    rollout(0.0)  # warm-up
    gen_runs, walls = [], []
    for _ in range(max(2, args.repeats // 2)):  # interleaved, fastest of each
        gen_runs.append(rollout(0.0)[0])
        walls.append(rollout(args.tool_latency))
    gen_only = min(gen_runs)
    wall, stats = min(walls, key=lambda w: w[0])
    serial = stats["engine/tool_calls"] * args.tool_latency
    overlap = wall / (gen_only + serial)
    print(
        f"[2] multi-turn: {len(mproblems)} x {args.multi_n} trajectories, "
        f"{stats['engine/tool_calls']:.0f} tool calls of {args.tool_latency} s, "
        f"{stats['rollout/turns']:.1f} turns, {stats['engine/model_tokens']:.0f} model tokens"
    )
    print(f"    generation only (0 s sandbox): {gen_only:.3f} s   runs={[round(x, 3) for x in gen_runs]}")
    print(f"    serial sandbox time:           {serial:.3f} s")
    finish = {k[len("finish/") :]: round(v, 3) for k, v in stats.items() if k.startswith("finish/") and v}
    print(f"    wall with sandbox:             {wall:.3f} s   runs={[round(w, 3) for w, _ in walls]}")
    print(f"    finish reasons: {finish}")
    print(f"    overlap_ratio = {overlap:.3f}")
    engine.close()
    backend.close()
    print(f"RESULT engine_overhead_ratio={overhead:.3f} overlap_ratio={overlap:.3f}")


if __name__ == "__main__":
    main()
