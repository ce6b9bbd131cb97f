"""Benchmark `algo.round_end`: time to a full batch when response lengths have a long tail.

The trainer's own `collect_batch` (dynamic sampling, 2x over-sampling) runs twice on the same
prompts and seeds, once with round_end=all (the round waits for its slowest trajectory) and once
with round_end=enough (it stops once the batch's groups are in, cancelling the rest), first on the
in-process HF backend, then on the real SGLang CPU server (`make sglang-cpu`; skipped with
--no-sglang).

Lengths are scripted, seeded per trajectory: a wrapper sets each answer's token budget from its
sampling seed, about `--short` tokens for most and `--long-factor` times that for a `--long-frac`
share (each times a uniform 0.5-1.5 spread), and EOS is ignored (HF: the backend's EOS set emptied; SGLang: `ignore_eos`), so every answer has
exactly its scripted length. Rewards are a seeded coin per trajectory (a group of equal rewards is
dropped, as dynamic sampling does). One model turn, no tools, the tiny base model, one torch thread.

Timings are interleaved and each mode keeps the fastest of --repeats runs (other processes on a
shared machine only ever add time). kept vs all mean length shows the length bias of `enough`.

What to expect on CPU: the gain is the tail's time, after the short answers are in. A CPU decode
step costs roughly in proportion to the rows it holds, so the tail of a few long rows is cheap
next to the bulk (the real server: ~0.6-0.8 at the defaults, ~0.4 with --long-factor 16); on a
GPU a step costs about the same with 4 rows or 128, and the tail weighs more.

Last line: RESULT round_end_ratio=<enough/all, HF> round_end_ratio_sglang=<enough/all, SGLang> ...
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


class OneAnswerEnv:
    """One model turn; the reward is a coin seeded by the answer's tokens' text."""

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
        return (1.0 if random.Random(text).random() < 0.5 else -1.0), {"correct": False}

    async def close(self) -> None:
        pass


class ScriptedLengths:
    """Backend wrapper: each answer's token budget is drawn from a long tail, seeded by the
    problem's prompt (`per="problem"`: a hard problem makes every sample long) or by the
    trajectory's sampling seed (`per="trajectory"`: any sample may run long)."""

    def __init__(self, backend, short: int, factor: int, frac: float, per: str) -> None:
        self.backend, self.short, self.factor, self.frac, self.per = backend, short, factor, frac, per

    def length(self, prompt_ids: list[int], seed: int | None) -> int:
        key = str(prompt_ids) if self.per == "problem" else seed
        long = random.Random(key).random() < self.frac
        spread = random.Random(seed).uniform(0.5, 1.5)  # lengths vary inside both classes too
        return max(1, round(self.short * (self.factor if long else 1) * spread))

    async def generate(self, prompt_ids, sampling, stop):
        budget = self.length(prompt_ids, sampling.seed)
        return await self.backend.generate(prompt_ids, dataclasses.replace(sampling, max_new_tokens=budget), stop)

    def __getattr__(self, name):
        return getattr(self.backend, name)


class OneRank:
    rank, world_size = 0, 1

    def all_reduce_sum(self, x):
        return x.clone()

    def shard(self, items):
        return list(items)


class FixedPrompts:
    """The same prompts on every call: both modes see the same problems and seeds."""

    def __init__(self, problems: list[dict]) -> None:
        self.problems = problems

    def take(self, k: int) -> list[dict]:
        return self.problems[:k]


def one_batch(engine, tok, args, round_end: str) -> tuple[float, dict]:
    from stare_tir.train_config import TrainConfig
    from stare_tir.trainer import collect_batch

    cfg = TrainConfig()
    cfg.trainer.prompts_per_step = args.prompts
    cfg.trainer.samples_every = 0
    cfg.trainer.seed = args.seed
    cfg.rollout.n_per_prompt = args.n
    cfg.algo.dynamic_sampling = True
    cfg.algo.oversample = args.oversample
    cfg.algo.dynamic_sampling_rounds = 1  # one round: the time of one barrier, nothing else
    cfg.algo.round_end = round_end
    problems = [
        {"id": str(i), "problem": f"Tell me about the number {i}."} for i in range(args.prompts * args.oversample)
    ]
    run = SimpleNamespace(
        cfg=cfg, learner=OneRank(), engine=engine, sampler=FixedPrompts(problems), run_dir=None, log=None
    )
    run.parts = SimpleNamespace(tokenizer=tok)
    t0 = time.perf_counter()
    batch, rolled, m = collect_batch(run, step=1)
    return time.perf_counter() - t0, m


def compare(name: str, engine, tok, args) -> tuple[float, dict]:
    """Interleaved repeats of both modes; prints each mode's best time and lengths; enough/all."""
    best: dict[str, tuple[float, dict]] = {}
    one_batch(engine, tok, args, "all")  # warm-up: first forward passes, connections
    for _ in range(args.repeats):
        for mode in ("all", "enough"):
            s, m = one_batch(engine, tok, args, mode)
            if mode not in best or s < best[mode][0]:
                best[mode] = (s, m)
    for mode, (s, m) in best.items():
        print(
            f"{name} round_end={mode}: {s:.2f} s to a full batch, groups={m['batch/groups']:.0f}, "
            f"kept_mean_length={m['rollout/kept_mean_length']:.1f} all_mean_length={m['rollout/all_mean_length']:.1f}, "
            f"aborted_trajectories={m['batch/aborted_trajectories']:.0f} aborted_tokens={m['batch/aborted_tokens']:.0f}",
            flush=True,
        )
    return best["enough"][0] / best["all"][0], best


def make_engine(backend, tok, args):
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

    budget = args.short * args.long_factor * 2  # above the longest scripted answer
    cfg = RolloutConfig(
        n_per_prompt=args.n,
        max_turns=1,
        max_total_tokens=budget,
        max_new_tokens_per_turn=budget,
        progress=False,
    )
    lengths = ScriptedLengths(backend, args.short, args.long_factor, args.long_frac, args.long_per)
    return RolloutEngine(lengths, tok, OneAnswerEnv, cfg)


def sglang_ignoring_eos(backend) -> None:
    """Every /generate of `backend` ignores EOS: answers have exactly their scripted length."""
    send = backend._client.request

    async def request(method, url, payload=None, headers=None):
        if url.endswith("/generate"):
            payload = {**payload, "sampling_params": {**payload["sampling_params"], "ignore_eos": True}}
        return await send(method, url, payload, headers)

    backend._client.request = request


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=16, help="groups per batch (trainer.prompts_per_step)")
    ap.add_argument("--n", type=int, default=4, help="samples per prompt")
    ap.add_argument("--oversample", type=int, default=2)
    ap.add_argument("--short", type=int, default=64, help="tokens of a short answer")
    ap.add_argument("--long-factor", type=int, default=8, help="a long answer is this many times longer")
    ap.add_argument("--long-frac", type=float, default=0.1, help="share of long answers")
    ap.add_argument(
        "--long-per",
        choices=("problem", "trajectory"),
        default="trajectory",
        help="what is drawn long: a problem (all its samples) or each trajectory on its own",
    )
    ap.add_argument("--sglang-kv-tokens", type=int, default=131072, help="the server's --max-total-tokens")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-sglang", action="store_true", help="only the HF backend")
    ap.add_argument("--no-hf", action="store_true", help="only the SGLang server")
    args = ap.parse_args()

    import torch
    from transformers import AutoTokenizer

    from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    launch = _load_launch()
    tok = AutoTokenizer.from_pretrained(str(launch.TINY_BASE))
    ratio_hf, kept, every = float("nan"), float("nan"), float("nan")
    if not args.no_hf:
        hf = HFBackend(str(launch.TINY_BASE), cfg=HFBackendConfig(max_batch_size=128))
        hf.eos_token_ids = frozenset()  # scripted lengths: EOS does not end an answer
        engine = make_engine(hf, tok, args)
        try:
            ratio_hf, best_hf = compare("hf", engine, tok, args)
        finally:
            engine.close()
            hf.close()
        kept, every = (best_hf["enough"][1][k] for k in ("rollout/kept_mean_length", "rollout/all_mean_length"))

    ratio_sg = float("nan")
    if not args.no_sglang:
        ratio_sg = sglang_compare(launch, tok, args)
    load = os.getloadavg()[0]
    print(
        f"RESULT round_end_ratio={ratio_hf:.3f} round_end_ratio_sglang={ratio_sg:.3f} "
        f"kept_mean_length_enough={kept:.1f} all_mean_length_enough={every:.1f} "
        f"short={args.short} long={args.short * args.long_factor} long_frac={args.long_frac} long_per={args.long_per} "
        f"oversample={args.oversample} load={load:.2f}"
    )


def sglang_compare(launch, tok, args) -> float:
    import tempfile

    from stare_tir.rollout.backends.sglang import SGLangBackend

    logs = Path(tempfile.mkdtemp(prefix="bench_round_end_"))
    try:
        # KV room for every request of a round at once (the tests' 4096 would queue most of them,
        # and a queued server finishes groups in arrival order, not by length)
        server = launch.start_server(logs / "server.log", max_total_tokens=args.sglang_kv_tokens)
    except launch.Unavailable as exc:
        print(f"sglang: not run ({exc})", flush=True)
        return float("nan")
    backend = SGLangBackend([server.url])
    sglang_ignoring_eos(backend)
    engine = make_engine(backend, tok, args)
    try:
        ratio, _ = compare("sglang", engine, tok, args)
        print(f"sglang: {backend.aborted_requests} requests aborted on the server over all runs", flush=True)
        return ratio
    finally:
        engine.close()
        backend.close()
        launch.stop(server)


def _load_launch():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sglang_cpu_launch", ROOT / "tools" / "sglang_cpu" / "launch.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["sglang_cpu_launch"] = mod
    spec.loader.exec_module(mod)
    return mod


if __name__ == "__main__":
    main()
