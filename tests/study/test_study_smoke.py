"""Smoke test of scripts/study/study_entropy.py: two arms, two RL steps each, tiny budgets."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "study" / "study_entropy.py"

# Budgets as in tests/trainer/test_trainer_e2e.py FAST.
FAST = [
    "data.arithmetic_train_size=200",
    "data.arithmetic_eval_size=8",
    "trainer.prompts_per_step=4",
    "rollout.n_per_prompt=4",
    "rollout.max_total_tokens=64",
    "rollout.max_new_tokens_per_turn=40",
    "trainer.save_every=1",
    "algo.dynamic_sampling_rounds=2",
]
SFT_FAST = ["sft.num_traces=96", "sft.train.epochs=3", "sft.train.batch_size=32"]


@pytest.mark.slow
def test_two_arms_two_steps_write_table_and_plot(tmp_path):
    out, docs = tmp_path / "runs", tmp_path / "docs"
    cmd = [
        sys.executable,
        str(SCRIPT),
        "--seeds",
        "0",
        "--steps",
        "2",
        "--eval-every",
        "0",
        "--arms",
        "grpo_ds",
        "stare_o1",
        "--target",
        "100",
        "--targets",
        "--jobs",
        "2",
        "--threads",
        "1",
        "--out",
        str(out),
        "--docs",
        str(docs),
        "--set",
        *FAST,
        "--sft-set",
        *SFT_FAST,
    ]
    proc = subprocess.run(
        cmd,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for name in ("grpo_ds_s0", "stare_o1_s0"):
        assert (out / name / "summary.json").is_file(), name
    assert (docs / "entropy.png").stat().st_size > 0
    table = (docs / "table.md").read_text()
    assert "GRPO-ds" in table and "STARE-O1" in table
    data = json.loads((docs / "table.json").read_text())
    assert set(data["arms"]) == {"grpo_ds", "stare_o1"}
    o1 = data["arms"]["stare_o1"]["agg"]
    assert o1["frac_gated"] == 1.0  # target 100: gate on from step 1
    assert data["arms"]["grpo_ds"]["per_seed"][0]["steps"] == 2
    assert "2 runs in" in proc.stdout  # both arms went through the parallel launcher

    # Resumable: a second call skips finished arms.
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.count("skip") == 2, proc.stdout

    # The baselines study reuses the finished GRPO-ds run and the SFT; one more run (2 steps).
    base_cmd = [c for c in cmd if c not in ("grpo_ds", "stare_o1")]
    i = base_cmd.index("--arms")
    base_cmd[i + 1 : i + 1] = ["grpo_ds", "entropy_80_20"]
    proc = subprocess.run([*base_cmd, "--study", "baselines"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stdout.count("skip") == 1 and "1 runs in" in proc.stdout
    table = (docs / "baselines_table.md").read_text()
    assert "GRPO-ds" in table and "80/20 rule" in table and "| selected |" in table
    assert (docs / "baselines.png").stat().st_size > 0
    data = json.loads((docs / "baselines_table.json").read_text())
    assert data["meta"]["study"] == "baselines"
    assert data["arms"]["entropy_80_20"]["agg"]["selected_frac"] == pytest.approx(0.2, abs=0.02)
    # Its table: held-out accuracy at its best (from the run's summary) and one row per method and seed.
    assert "| held-out best |" in table and "## Per seed" in table
    for name in ("grpo_ds", "entropy_80_20"):
        arm = data["arms"][name]
        summary = json.loads((out / f"{name}_s0" / "summary.json").read_text())
        assert arm["agg"]["acc_best"] == summary["best_acc"] is not None
        assert arm["agg"]["n_seeds"] == 1
    assert table.count("| 80/20 rule (top 20% entropy) |") == 2  # the mean row and the seed-0 row
