"""`stare-export RUN [--step N] [--out DIR] [--push-to-hub REPO]`: any RL checkpoint as an HF model.

A run's checkpoints (`<run>/checkpoints/step_NNNNNN/deepspeed`) are DeepSpeed's: without ZeRO one
full copy of the weights, with ZeRO 1-3 the fp32 master weights split over the ranks that saved
them. The export reads whichever layout was saved (any stage, any number of ranks: DeepSpeed's
own consolidation, `deepspeed.utils.zero_to_fp32`), puts the weights into the run's model
architecture (the RL stage's starting model: the run's SFT output, or model.path with SFT off)
and writes an ordinary HF directory with the run's tokenizer: loadable with `from_pretrained`,
evaluable with `stare-eval model.path=DIR`, uploadable with `--push-to-hub`. Default output:
`<run>/hf/step_NNNNNN` (where trainer.save_hf_every writes). No GPU and no process group needed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from stare_tir.errors import StartupError

# The learner wraps the HF model (stare_tir.learner.parts.token_logprob_model): its checkpoint
# names every weight with this prefix.
MODULE_PREFIX = "lm."


def find_checkpoint(run_dir: Path, step: int | None) -> Path:
    """<run>/checkpoints/step_N (or the latest complete one); a StartupError naming what exists."""
    from stare_tir.trainer.checkpoint import checkpoint_dir, latest_checkpoint

    root = run_dir / "checkpoints"
    saved = sorted(p.name for p in root.glob("step_*") if (p / "deepspeed").is_dir()) if root.is_dir() else []
    if step is None:
        path = latest_checkpoint(run_dir)
        if path is None:
            raise StartupError(
                f"{run_dir}: no checkpoint (checkpoints/latest) to export; trainer.save_every saves them"
            )
        return path
    path = checkpoint_dir(run_dir, step)
    if not (path / "deepspeed").is_dir():
        raise StartupError(f"{run_dir}: no checkpoint of step {step}; saved: {', '.join(saved) or 'none'}")
    return path


def base_model(run_dir: Path) -> tuple[Any, str]:
    """The run's config and the HF directory its RL stage started from (architecture, tokenizer)."""
    from stare_tir.app.run_dir import read_saved_config
    from stare_tir.model import resolve_model_path
    from stare_tir.train_config import TrainConfig

    if not (run_dir / "config.yaml").is_file():
        raise StartupError(f"{run_dir}: holds no config.yaml, so no run: pass a training run directory")
    _, cfg = read_saved_config(TrainConfig, run_dir)
    if cfg.sft.enabled:
        path = Path(cfg.sft.output) if cfg.sft.output else run_dir / "sft" / "model"
        if not (path / "config.json").is_file():
            raise StartupError(f"{run_dir}: the run's SFT model {path} is gone; its architecture is needed to export")
        return cfg, str(path)
    return cfg, resolve_model_path(cfg.model)


def checkpoint_state_dict(ckpt: Path) -> dict:
    """{HF parameter name: tensor} of a learner checkpoint, whatever its ZeRO stage and rank count."""
    import torch

    from stare_tir.learner.checkpoint_layout import load_layout

    layout = load_layout(ckpt)
    if layout.get("zero_stage") == 0:  # full replicas: rank 0's module states hold every weight
        state = torch.load(ckpt / "deepspeed" / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
        state = state["module"]
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag="deepspeed")
    return {k.removeprefix(MODULE_PREFIX): v for k, v in state.items()}


def export_checkpoint(run_dir: str | Path, step: int | None = None, out: str | Path | None = None) -> Path:
    """Write the HF model of one checkpoint of `run_dir`; returns its directory."""
    import torch
    from transformers import AutoModelForCausalLM

    from stare_tir.model import load_tokenizer

    run_dir = Path(run_dir)
    ckpt = find_checkpoint(run_dir, step)
    cfg, base = base_model(run_dir)
    state = checkpoint_state_dict(ckpt)
    model = AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, trust_remote_code=cfg.model.trust_remote_code
    )
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {k for k in missing if model.config.tie_word_embeddings and k.endswith("lm_head.weight")}
    if set(missing) - tied or unexpected:
        raise StartupError(
            f"{ckpt}: its weights do not fit {base} (missing {sorted(set(missing) - tied)[:3]}, unexpected "
            f"{sorted(unexpected)[:3]}): was the run's model replaced since?"
        )
    target = Path(out) if out else run_dir / "hf" / ckpt.name
    target.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(target))
    load_tokenizer(cfg.model, base).save_pretrained(str(target))
    return target


def push_to_hub(directory: Path, repo: str) -> str:
    """Upload an exported directory to the Hugging Face hub (a private repo is created if needed)."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo, exist_ok=True, private=True)
    api.upload_folder(folder_path=str(directory), repo_id=repo, commit_message=f"stare-export of {directory.name}")
    return f"https://huggingface.co/{repo}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="stare-export", description=__doc__.split("\n\n")[0])
    p.add_argument("run", metavar="RUN", help="training run directory (holds config.yaml and checkpoints/)")
    p.add_argument("--step", type=int, default=None, help="the checkpoint of this RL step (default: the latest)")
    p.add_argument("--out", default=None, help="output directory (default: RUN/hf/step_NNNNNN)")
    p.add_argument("--push-to-hub", metavar="REPO", default=None, help="also upload it to this hub repository")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    args = p.parse_args(argv)
    try:
        out = export_checkpoint(args.run, args.step, args.out)
        print(f"exported {out}  (stare-eval model.path={out})")
        if args.push_to_hub:
            print(f"pushed to {push_to_hub(out, args.push_to_hub)}")
    except (StartupError, FileNotFoundError) as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
