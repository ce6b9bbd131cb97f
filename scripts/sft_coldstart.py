#!/usr/bin/env python
"""Cold-start SFT on Retool-style traces; writes an HF checkpoint that the RL stage loads.

The same command as the installed `stare-sft`: it reads a training config and runs its `sft` stage.
    python scripts/sft_coldstart.py model.path=tiny sft.traces=traces.jsonl sft.output=runs/sft
    python scripts/sft_coldstart.py --config configs/retool_qwen2.5_7b_stare.yaml \\
        model.path=Qwen/Qwen2.5-7B sft.traces=retool_sft.jsonl sft.output=ckpt/sft sft.train.epochs=2
    torchrun --nproc_per_node 8 scripts/sft_coldstart.py ...      # data parallel, same keys
`--model`, `--data` and `--output` remain as aliases of model.path, sft.traces and sft.output.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from stare_tir.app.cli import sft_main  # noqa: E402

if __name__ == "__main__":
    sys.exit(sft_main())
