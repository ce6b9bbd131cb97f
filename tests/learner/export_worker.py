"""One rank of a 2-rank ZeRO-3 learner that leaves a run directory to export: a config.yaml, a
checkpoint after step 1 (as the RL loop writes it), and rank 0's token log-probs and entropies on
fixed trajectories at that step, the numbers the exported model must reproduce.

    python tests/learner/export_worker.py RUN_DIR --zero-stage 3
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))


def main() -> None:
    import learner_worker as w
    import torch
    from transformers import AutoConfig

    from stare_tir.config import load_config, save_config
    from stare_tir.model import ensure_tiny_checkpoint
    from stare_tir.train_config import TrainConfig

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("run_dir")
    ap.add_argument("--zero-stage", type=int, default=3)
    a = ap.parse_args()
    run_dir = Path(a.run_dir)
    tiny = str(ensure_tiny_checkpoint())
    vocab = AutoConfig.from_pretrained(tiny).vocab_size
    learner = w.make_learner(tiny, a.zero_stage, budget=64)
    w.step(learner, 16, vocab, stare=False)  # step 1: the weights move away from the base
    ckpt = run_dir / "checkpoints" / "step_000001"
    learner.save_checkpoint(ckpt, {"step": 1})
    probe = w.make_trajs(4, seed=7, vocab=vocab)
    # every rank computes the same rows: the collective gathers of ZeRO-3 need all of them
    logps, ents = learner.compute_logprobs_entropy(probe)
    w.step(learner, 16, vocab, stare=False)  # step 2 after the checkpoint: the export is of step 1
    if learner.rank == 0:
        cfg = load_config(
            TrainConfig, None, ["model.path=tiny", "sft.enabled=false", f"learner.zero_stage={a.zero_stage}"]
        )
        cfg.trainer.run_dir = str(run_dir)
        save_config(cfg, run_dir / "config.yaml")
        (run_dir / "checkpoints" / "latest").write_text(ckpt.name)
        rows = [{"prompt_ids": t.prompt_ids, "response_ids": t.response_ids} for t in probe]
        torch.save({"rows": rows, "logps": logps, "ents": ents}, run_dir / "probe.pt")


if __name__ == "__main__":
    main()
