"""Every second of an RL step is inside a named phase: the time/* phases add up to time/step (a timer
nested in another counts once), and the after-update diagnostic runs only on its schedule."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stare_tir.trainer.step import PhaseTimer

ROOT = Path(__file__).resolve().parents[2]


def test_nested_and_repeated_phases_count_each_second_once():
    timer = PhaseTimer()
    with timer("update"):
        time.sleep(0.05)
        with timer("shape"):
            time.sleep(0.1)
    with timer("other"):
        time.sleep(0.02)
    with timer("other"):
        time.sleep(0.02)
    m = timer.metrics()
    assert m["time/shape"] == pytest.approx(0.1, abs=0.04)
    assert m["time/update"] == pytest.approx(0.05, abs=0.04)  # without the nested shape phase
    assert m["time/other"] == pytest.approx(0.04, abs=0.03)  # both entries
    phases = sum(v for k, v in m.items() if k != "time/step")
    assert phases == pytest.approx(m["time/step"], rel=0.05)


@pytest.mark.slow
def test_the_phases_of_every_step_add_up_to_the_step(tmp_path, tiny_run):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        str(ROOT / "scripts" / "train_tir.py"),
        f"trainer.run_dir={run_dir}",
        *tiny_run(
            "trainer.steps=3",
            "trainer.eval_every=0",
            "trainer.save_every=3",
            "trainer.diagnostics_every=2",
            "algo.dynamic_sampling_rounds=2",
        ),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "time/step" in r]
    assert len(steps) == 3
    for row in steps:
        phases = {k: v for k, v in row.items() if k.startswith("time/") and k != "time/step"}
        assert "time/other" in phases, sorted(phases)
        total = sum(phases.values())
        assert abs(total - row["time/step"]) <= 0.05 * row["time/step"], (row["step"], phases, row["time/step"])
        # The after-update diagnostic: on its schedule only (trainer.diagnostics_every=2), in its own phase.
        trained = row.get("update/optimizer_steps", 0.0) > 0
        on_schedule = trained and row["step"] % 2 == 0
        assert ("entropy/after_update" in row) == on_schedule, row["step"]
        assert ("time/diagnostics" in row) == on_schedule, row["step"]
