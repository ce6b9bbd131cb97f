#!/usr/bin/env python
"""Evaluate a tool-integrated reasoning model on AIME (and other math benchmarks) with tool calls.

    python scripts/eval_aime.py --model Qwen/Qwen2.5-7B-Instruct
    python scripts/eval_aime.py --model runs/tiny_cpu/hf --datasets aime24 --limit 2 --n 2
    python scripts/eval_aime.py --config configs/eval_aime.yaml --backend sglang \
        --sglang-url http://localhost:30000 rollout.max_concurrency=256

Settings come from the config schema's defaults, then --config YAML, then the flags below, then
dotted KEY=VALUE overrides (the same syntax as training). The run writes <out>/<dataset>.jsonl
(one row per sample), <out>/summary.json and <out>/config.yaml; rerunning the same command
resumes, skipping samples already written.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Flags that map onto dotted config keys (dest -> keys). Left unset, a flag changes nothing, so
# values from --config survive.
FLAG_KEYS = {
    "model": ["model.path"],
    "n": ["eval.n"],
    "limit": ["eval.limit"],
    "temperature": ["eval.temperature"],
    "top_p": ["eval.top_p"],
    "max_turns": ["eval.max_turns"],
    "max_tokens": ["eval.max_tokens"],
    "max_tokens_per_turn": ["eval.max_tokens_per_turn"],
    "seed": ["eval.seed"],
    "backend": ["backend"],
    "sandbox": ["sandbox.backend"],
    # The env's per-call timeout and the sandbox's hard limit: the shorter one wins, so set both.
    "sandbox_timeout": ["env.code_timeout_s", "sandbox.limits.wall_time_s"],
    "sandbox_memory_mb": ["sandbox.limits.memory_mb"],
    "sandbox_workers": ["sandbox.workers"],
    "out": ["out_dir"],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        epilog="Any other setting: dotted KEY=VALUE overrides after the flags, e.g. "
               "rollout.max_concurrency=64 env.obs_max_chars=1024 rollout.hf.max_batch_size=256. "
               "Unset flags keep the value from --config, else the schema default (in brackets).",
    )
    p.add_argument("--model", help="HF model directory (e.g. a training run's exported model) or "
                   "hub id; 'tiny' builds the tiny random CPU model [tiny]")
    p.add_argument("--datasets", help="comma-separated benchmarks: aime24, aime25, amc23, math500, "
                   "minerva, olympiadbench, or JSONL paths [aime24,aime25]")
    p.add_argument("--n", type=int, help="samples per problem [32 for AIME/AMC, 4 for the others]")
    p.add_argument("--limit", type=int, help="evaluate only the first K problems of each dataset "
                   "(quick checks on CPU) [all]")
    p.add_argument("--temperature", type=float, help="sampling temperature [1.0]")
    p.add_argument("--top-p", dest="top_p", type=float, help="nucleus sampling top-p [0.7]")
    p.add_argument("--max-turns", dest="max_turns", type=int, help="model turns per sample, each "
                   "code call and the final answer counting one [rollout.max_turns: 8]")
    p.add_argument("--max-tokens", dest="max_tokens", type=int, help="response token budget per "
                   "sample, interpreter output included [rollout.max_total_tokens: 4096]")
    p.add_argument("--max-tokens-per-turn", dest="max_tokens_per_turn", type=int,
                   help="new tokens per model turn [rollout.max_new_tokens_per_turn: 1024]")
    p.add_argument("--seed", type=int, help="base sampling seed for reproducible runs "
                   "[none: the backend's random stream]")
    p.add_argument("--backend", choices=["hf", "sglang"], help="rollout backend: hf (in-process "
                   "transformers, CPU or one GPU) or sglang (already running servers) [hf]")
    p.add_argument("--sglang-url", dest="sglang_url", action="append", help="SGLang server or "
                   "router URL, http://host:port (repeat or comma-separate for several)")
    p.add_argument("--sandbox", choices=["local", "docker", "e2b"],
                   help="where the model's code runs [local]")
    p.add_argument("--sandbox-timeout", dest="sandbox_timeout", type=float,
                   help="wall-clock seconds per code execution [5, as in Retool's evaluation]")
    p.add_argument("--sandbox-memory-mb", dest="sandbox_memory_mb", type=int,
                   help="memory limit per code execution, MiB [1024]")
    p.add_argument("--sandbox-workers", dest="sandbox_workers", type=int,
                   help="code executions running at once [2]")
    p.add_argument("--config", help="YAML config, e.g. configs/eval_aime.yaml; flags and "
                   "overrides apply on top of it")
    p.add_argument("--out", help="output directory; rerunning into it resumes "
                   "[runs/eval/<model name>]")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="dotted config overrides, applied last")
    return p.parse_args(argv)


def flag_overrides(args: argparse.Namespace) -> list[str]:
    """The flags that were given, as dotted overrides (JSON values are valid YAML)."""
    out = [f"{key}={json.dumps(getattr(args, dest))}" for dest, keys in FLAG_KEYS.items()
           for key in keys if getattr(args, dest) is not None]
    if args.datasets is not None:
        out.append(f"eval.datasets={json.dumps([d for d in args.datasets.split(',') if d])}")
    if args.sglang_url:
        urls = [u for arg in args.sglang_url for u in arg.split(",") if u]
        out.append(f"rollout.sglang.urls={json.dumps(urls)}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not (args.model or args.config or any(o.startswith("model.path=") for o in args.overrides)):
        print("error: name the model to evaluate with --model PATH_OR_HF_ID ('tiny' for the tiny "
              "CPU model)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
    from stare_tir.config import ConfigError, load_config
    from stare_tir.evaluate import EvalRunConfig, run_eval

    try:
        cfg = load_config(EvalRunConfig, args.config, flag_overrides(args) + args.overrides)
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2
    run_eval(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
