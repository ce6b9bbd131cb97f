#!/usr/bin/env python
"""Train a tool-integrated reasoning agent: cold-start SFT -> RL (GRPO / GRPO-ds / STARE) -> eval.

With no arguments it runs the embedded CPU default (configs/tiny_cpu.yaml): a tiny Qwen2 model
learns to call a Python sandbox for arithmetic, end to end in minutes on a laptop.

Any config value can be overridden as KEY=VALUE with a dotted key, e.g.
    python scripts/train_tir.py algo.stare.target_entropy=0.25 trainer.steps=50
    python scripts/train_tir.py --config configs/retool_qwen2.5_7b_stare.yaml model.path=/ckpt/sft
Sections: model, data, sandbox, env, rollout, algo (incl. algo.stare), learner, sft, trainer.
`--print-config` shows every key with its resolved value.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(DEFAULT_CONFIG),
                        help="YAML config file (default: configs/tiny_cpu.yaml, the CPU default)")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the latest checkpoint in trainer.run_dir (SFT is reused)")
    parser.add_argument("--print-config", action="store_true",
                        help="print the resolved config as YAML and exit")
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="dotted config overrides, applied after the YAML file")
    args = parser.parse_args()

    import yaml

    from stare_tir.config import ConfigError, load_config, to_dict
    from stare_tir.train_config import TrainConfig

    try:
        cfg = load_config(TrainConfig, args.config, args.overrides)
    except ConfigError as e:
        parser.error(str(e))
    if args.print_config:
        print(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        return

    from stare_tir.pipeline import run_pipeline

    run_pipeline(cfg, resume=args.resume)


if __name__ == "__main__":
    main()
