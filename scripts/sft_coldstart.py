"""Cold-start SFT on Retool-style traces; writes an HF checkpoint that the RL stage loads.

    python scripts/sft_coldstart.py --model tiny --data traces.jsonl --output runs/sft
    python scripts/sft_coldstart.py --model Qwen/Qwen2.5-7B --data retool_sft.jsonl --output ckpt/sft \\
        --config configs/retool_qwen2.5_7b_stare.yaml learner.zero_stage=3 epochs=2
    torchrun --nproc_per_node 8 scripts/sft_coldstart.py ...      # data parallel, same flags
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from stare_tir.config import ConfigError, resolve_config  # noqa: E402
from stare_tir.sft import SFTConfig  # noqa: E402 (light: no torch at import time)


def _fields_help(cfg: object, prefix: str = "") -> list[str]:
    """One line per config key with its default, nested sections flattened to dotted keys."""
    lines = []
    for f in dataclasses.fields(cfg):  # type: ignore[arg-type]
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            lines += _fields_help(value, f"{prefix}{f.name}.")
        else:
            lines.append(f"  {prefix}{f.name}={value!r}")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description="Supervised cold start: fine-tune a causal LM on Retool-style tool-use traces "
                    "(loss on model-written tokens only; interpreter outputs masked exactly as in RL).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Config keys (KEY=VALUE overrides; defaults shown, see stare_tir/sft.py and "
               "stare_tir/learner.py for what each does):\n" + "\n".join(_fields_help(SFTConfig())),
    )
    p.add_argument("--model", required=True,
                   help="starting model: an HF directory or hub id, 'tiny' for the shipped tiny base, or "
                        "'tiny-random' for a randomly initialised tiny Qwen2 (created once and cached)")
    p.add_argument("--data", required=True,
                   help='JSONL traces, one per line: {"messages": [system, user, assistant]} or {"text": ...}')
    p.add_argument("--output", required=True,
                   help="directory for the fine-tuned HF checkpoint (weights + tokenizer)")
    p.add_argument("--config", default=None,
                   help="YAML with SFT settings: the SFTConfig keys at the top level, or a training "
                        "config whose 'sft:' section holds them")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="override config keys after the YAML, e.g. epochs=2 learner.lr=1e-3")
    return p


def load_sft_config(config_path: str | None, overrides: list[str]) -> SFTConfig:
    """Defaults, then the YAML (SFTConfig keys, or a training config's sft.train section), then
    KEY=VALUE overrides; validated."""
    import yaml

    section: dict = {}
    if config_path:
        loaded = yaml.safe_load(Path(config_path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {config_path!r} must hold a mapping at the top level")
        sft = loaded.get("sft")
        section = sft["train"] if isinstance(sft, dict) and isinstance(sft.get("train"), dict) else loaded
    return resolve_config(SFTConfig, section, overrides)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_sft_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from stare_tir.sft import run_sft

    model = args.model
    if model == "tiny":
        from stare_tir.tiny import pretrained_tiny_base

        model = str(pretrained_tiny_base())
    elif model == "tiny-random":
        from stare_tir.tiny import ensure_tiny_checkpoint

        model = str(ensure_tiny_checkpoint())
    summary = run_sft(cfg, model, args.data, args.output)
    if summary["rank"] == 0:
        print(f"RESULT steps={summary['steps']} first_loss={summary['first_loss']:.4f} "
              f"final_loss={summary['final_loss']:.4f} seconds={summary['seconds']:.1f} "
              f"output={summary['output_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
