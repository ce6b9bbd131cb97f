"""Benchmark the HF rollout backend's waste cuts on SmolLM2-135M-Instruct, side by side in one run.

0. thread_scope: does `torch.set_num_threads(1)` in the backend's worker thread change the main
   thread's matmul speed (the learner's), or threads started later? (`hf_cpu.py` relies on it.)
1. prefix cache: a seeded multi-turn rollout (RolloutEngine, the Retool short prompt, a tool
   output after each of the first two turns, turns ending at "</code>" or a paragraph break, the
   configs/smollm2_cpu.yaml budgets: 16 trajectories, 3 turns, 128 tokens) with the cache
   and without it, alternating: prompt tokens computed vs reused, rollout wall time, and whether
   both sampled the same tokens (they must) with their log-probs' largest difference.
2. threads: decode tokens/s of a batch of 16 rows on 1 vs 2 torch threads (fp32, no cache).
3. bf16: prefill and decode tokens/s of the same batch in bfloat16 vs float32 (one thread), and
   the bf16 log-probs' difference from an fp32 recompute of the same tokens (what the learner,
   in fp32, would compute for them). A CPU without native bf16 (no avx512_bf16 / amx_bf16) can be
   emulated: ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python scripts/bench/bench_hf_engine.py

Every ratio takes the best of --repeats alternating runs of each side (on a shared machine other
processes only ever add time). Tokens/s are from the backend's own forward timings (`stats`:
prefill_s, decode_s), so event-loop and sampling time are not in them.

Last line: RESULT prefix_reuse_frac=<reused / prompt tokens, with the cache>
prefill_saved_ratio=<prompt tokens computed without / with the cache> rollout_speedup=<wall without
/ with> bf16_decode_ratio=<bf16 / fp32 decode tok/s> bf16_prefill_ratio=<bf16 / fp32 prefill tok/s>
bf16_logprob_maxdiff=... bf16_logprob_meandiff=... thread1_vs_2_decode_ratio=<1-thread / 2-thread decode tok/s>
load=<1-minute load average at the end>
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

PROBLEMS = [
    "What is 417*386?",
    "A shop has 213 books, sells 45 and buys 7. How many books are left?",
    "What is 1234+5678-910?",
    "12 boxes have 35 pens each. How many pens?",
]


class ToolTurnsEnv:
    """The Retool short prompt; the first two turns get a tool output back, the third ends. The
    untrained model writes no <code> blocks, so a turn also ends at a paragraph break (a tool call's
    turn after SFT is a paragraph and a code block: ~30-60 tokens)."""

    stop_strings = ["</code>", "\n\n"]

    def __init__(self, problem: dict) -> None:
        self.problem, self.stats, self.sandbox_error, self.turn = problem, {"tool_calls": 0}, False, 0

    def initial_messages(self) -> list[dict]:
        from envs.retool import SHORT_SYSTEM_PROMPT

        return [
            {"role": "system", "content": SHORT_SYSTEM_PROMPT},
            {"role": "user", "content": self.problem["problem"]},
        ]

    async def step(self, turn_text: str):
        from envs.base import StepResult

        self.turn += 1
        if self.turn >= 3:
            return StepResult(None, True, {"reason": "answer"})
        self.stats["tool_calls"] += 1
        return StepResult(f"\n<interpreter>\n{160929 + self.turn}\n</interpreter>\n", False, {})

    def reward(self, text: str) -> tuple[float, dict]:
        return 0.0, {"correct": False, "pred": None}

    async def close(self) -> None:
        pass


def thread_scope() -> tuple[float, int]:
    """(main thread's matmul time after / before the worker set 1 thread, a new thread's count)."""
    import torch

    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)

    def best() -> float:
        out = float("inf")
        for _ in range(15):
            t = time.perf_counter()
            a @ b
            out = min(out, time.perf_counter() - t)
        return out

    before = best()
    with ThreadPoolExecutor(1) as ex:
        ex.submit(lambda: (torch.get_num_threads(), torch.set_num_threads(1))).result()
        worker = ex.submit(best).result()
        after = best()
        seen: list[int] = []
        t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
        t.start()
        t.join()
    print(
        f"[0] threads: main matmul {before * 1e3:.1f} ms -> {after * 1e3:.1f} ms after the worker set 1 "
        f"(worker: {worker * 1e3:.1f} ms); main keeps {torch.get_num_threads()}, a new thread gets {seen[0]} "
        "(torch's process default: the backend puts it back after setting its worker's)"
    )
    return after / before, seen[0]


def prefix_cache(path: str, repeats: int) -> tuple[float, float, float]:
    import torch

    from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

    cfg = RolloutConfig(
        n_per_prompt=4, max_turns=3, max_total_tokens=128, max_new_tokens_per_turn=96, temperature=1.0,
        seed=11, progress=False,
    )  # fmt: skip
    problems = [{"id": f"p{i}", "problem": p} for i, p in enumerate(PROBLEMS)]
    sides = {}
    for name, budget in (("cache", 32768), ("none", 0)):
        backend = HFBackend(path, cfg=HFBackendConfig(prefix_cache_tokens=budget, threads=1))
        sides[name] = (backend, RolloutEngine(backend, backend.tokenizer, ToolTurnsEnv, cfg))
    wall = {"cache": float("inf"), "none": float("inf")}
    out, counts = {}, {}
    for _ in range(repeats):
        for name, (backend, engine) in sides.items():
            before = dict(backend.stats)
            t = time.perf_counter()
            out[name] = engine.run(problems)[0]
            wall[name] = min(wall[name], time.perf_counter() - t)
            counts[name] = {k: backend.stats[k] - before.get(k, 0) for k in ("prefill_tokens", "reused_tokens")}
            counts[name]["prefill_s"] = backend.stats["prefill_s"] - before.get("prefill_s", 0.0)
    for backend, engine in sides.values():
        engine.close()
        backend.close()
    same = [t.response_ids for t in out["cache"]] == [t.response_ids for t in out["none"]]
    diff = max(
        (torch.tensor(a.rollout_logprobs) - torch.tensor(b.rollout_logprobs)).abs().max().item()
        for a, b in zip(out["cache"], out["none"])
    )
    c, n = counts["cache"], counts["none"]
    reuse = c["reused_tokens"] / max(1, c["prefill_tokens"] + c["reused_tokens"])
    saved = n["prefill_tokens"] / max(1, c["prefill_tokens"])
    turns = sum(t.num_turns for t in out["cache"]) / len(out["cache"])
    print(
        f"[1] prefix cache: {len(out['cache'])} trajectories, {turns:.2f} turns each; prompt tokens computed "
        f"{n['prefill_tokens']} without -> {c['prefill_tokens']} with ({c['reused_tokens']} reused, {reuse:.1%}); "
        f"prefill {n['prefill_s']:.2f} s -> {c['prefill_s']:.2f} s; rollout {wall['none']:.2f} s -> {wall['cache']:.2f} s; "
        f"same tokens: {same}, largest log-prob difference {diff:.1e}"
    )
    if not same:
        raise SystemExit("the prefix cache changed the sampled tokens: it must not")
    return reuse, saved, wall["none"] / wall["cache"]


def batch_prompts(tok, n: int) -> list[list[int]]:
    from envs.retool import SHORT_SYSTEM_PROMPT

    out = []
    for i in range(n):
        msgs = [{"role": "system", "content": SHORT_SYSTEM_PROMPT}, {"role": "user", "content": PROBLEMS[i % 4]}]
        text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def run_batch(backend, prompts, new_tokens: int):
    """(generations, prefill tok/s, decode tok/s) of one seeded batch (EOS off: every row decodes
    `new_tokens`, so both sides of a comparison do the same work)."""
    from stare_tir.rollout.backends.base import SamplingParams

    before = dict(backend.stats)
    sp = [SamplingParams(temperature=1.0, max_new_tokens=new_tokens, seed=100 + i) for i in range(len(prompts))]

    async def go():
        return await asyncio.gather(*(backend.generate(p, s, []) for p, s in zip(prompts, sp)))

    gens = asyncio.run(go())
    d = {k: backend.stats[k] - before.get(k, 0) for k in ("prefill_tokens", "prefill_s", "sampled_tokens", "decode_s")}
    return gens, d["prefill_tokens"] / d["prefill_s"], d["sampled_tokens"] / d["decode_s"]


def compare(path: str, repeats: int, new_tokens: int, a: dict, b: dict):
    """Best prefill and decode tok/s of backends `a` and `b` (HFBackendConfig kwargs), alternating."""
    from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig

    backends = [HFBackend(path, cfg=HFBackendConfig(prefix_cache_tokens=0, **kw)) for kw in (a, b)]
    for be in backends:
        be.eos_token_ids = frozenset()  # fixed work: no row stops early
    prompts = batch_prompts(backends[0].tokenizer, 16)
    best = [[0.0, 0.0], [0.0, 0.0]]
    gens = [None, None]
    for be in backends:
        run_batch(be, prompts[:2], 4)  # warm-up
    for _ in range(repeats):
        for i, be in enumerate(backends):
            gens[i], pre, dec = run_batch(be, prompts, new_tokens)
            best[i] = [max(best[i][0], pre), max(best[i][1], dec)]
    return backends, prompts, gens, best


def logprob_gap(model, prompts, gens) -> tuple[float, float, float]:
    """(max, mean, share over the PPO clip) of |sampled log-prob - fp32 recompute| over every
    sampled token (temperature 1). The share counts tokens whose ratio to the learner's
    probability leaves [1/1.2, 1.2] (clip 0.2) from the rollout's rounding alone."""
    import math

    import torch

    worst, total, n, over = 0.0, 0.0, 0, 0
    with torch.inference_mode():
        for p, g in zip(prompts, gens):
            logits = model(torch.tensor([p + g.token_ids])).logits[0].float()
            lp = logits[len(p) - 1 : -1].log_softmax(-1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
            d = (lp - torch.tensor(g.logprobs)).abs()
            worst, total, n = max(worst, d.max().item()), total + d.sum().item(), n + d.numel()
            over += int((d > math.log(1.2)).sum())
    return worst, total / n, over / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--new-tokens", type=int, default=64, help="decode steps of the 16-row batch")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    import torch

    from stare_tir.model import ModelConfig, resolve_model_path
    from stare_tir.rollout.backends.hf_cpu import BF16_CPU_FLAGS, cpu_flags

    torch.set_num_threads(1)  # one thread unless measuring threads (the backends set their own)
    path = resolve_model_path(ModelConfig(path="smollm2-135m-instruct"))
    flags = sorted(f for f in BF16_CPU_FLAGS if f in cpu_flags())
    print(f"model={path} cores={os.cpu_count()} bf16 flags={flags or 'none'} load={os.getloadavg()[0]:.1f}")

    with_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    thread_scope()
    torch.set_num_threads(with_threads)

    reuse, saved, speedup = prefix_cache(path, args.repeats)

    _, _, _, t = compare(path, args.repeats, args.new_tokens, {"threads": 1}, {"threads": 2})
    thread_ratio = t[0][1] / t[1][1]
    print(f"[2] threads: decode {t[0][1]:.0f} tok/s on 1 thread, {t[1][1]:.0f} on 2 -> {thread_ratio:.2f}x")

    fp32 = {"threads": 1, "dtype": "float32"}
    bf16 = {"threads": 1, "dtype": "bfloat16"}
    backends, prompts, gens, r = compare(path, args.repeats, args.new_tokens, fp32, bf16)
    worst_bf16, mean_bf16, over_bf16 = logprob_gap(backends[0].model, prompts, gens[1])
    worst_fp32, mean_fp32, _ = logprob_gap(backends[0].model, prompts, gens[0])
    pre_ratio, dec_ratio = r[1][0] / r[0][0], r[1][1] / r[0][1]
    print(
        f"[3] bf16: prefill {r[0][0]:.0f} -> {r[1][0]:.0f} tok/s ({pre_ratio:.2f}x), decode {r[0][1]:.0f} -> "
        f"{r[1][1]:.0f} tok/s ({dec_ratio:.2f}x); log-prob vs fp32 recompute: bf16 max {worst_bf16:.3f} "
        f"mean {mean_bf16:.4f} ({over_bf16:.1%} of tokens past the 0.2 clip), fp32 max {worst_fp32:.1e} "
        f"mean {mean_fp32:.1e}"
    )
    for be in backends:
        be.close()
    print(
        f"RESULT prefix_reuse_frac={reuse:.3f} prefill_saved_ratio={saved:.2f} rollout_speedup={speedup:.2f} "
        f"bf16_decode_ratio={dec_ratio:.2f} bf16_prefill_ratio={pre_ratio:.2f} bf16_logprob_maxdiff={worst_bf16:.3f} "
        f"bf16_logprob_meandiff={mean_bf16:.4f} "
        f"thread1_vs_2_decode_ratio={thread_ratio:.2f} load={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
