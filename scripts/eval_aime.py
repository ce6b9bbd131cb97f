#!/usr/bin/env python
"""Evaluate a tool-integrated reasoning model on AIME (and other math benchmarks) with tool calls.

The same command as the installed `stare-eval`: a config file plus dotted KEY=VALUE overrides.
    python scripts/eval_aime.py model.path=Qwen/Qwen2.5-7B-Instruct
    python scripts/eval_aime.py model.path=runs/tiny_cpu/final eval.datasets=[aime24] eval.limit=2 eval.n=2
    python scripts/eval_aime.py --config configs/eval_aime.yaml backend=sglang \\
        rollout.sglang.urls=[http://localhost:30000] rollout.max_concurrency=256
The earlier flags (--model, --datasets, --n, --limit, ...) remain as documented aliases of dotted
keys (see --help). The run writes <out>/<dataset>.jsonl, <out>/summary.json and <out>/config.yaml;
rerunning the same command resumes, skipping samples already written.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from stare_tir.app.cli import eval_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(eval_main())
