#!/usr/bin/env python
"""Train a tool-integrated reasoning agent: cold-start SFT -> RL (GRPO / GRPO-ds / STARE) -> eval.

The same command as the installed `stare-train`. With no arguments it runs the embedded CPU default
(configs/tiny_cpu.yaml). Any config value can be overridden as a dotted KEY=VALUE:
    python scripts/train_tir.py algo.stare.target_entropy=0.25 trainer.steps=50
    python scripts/train_tir.py --config configs/retool_qwen2.5_7b_stare.yaml model.path=/ckpt/sft
`--help` lists every key, `--print-config` the resolved values.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from stare_tir.app.cli import train_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(train_main())
