"""The console of a job whose output is a file: rank 0 alone, plain periodic progress lines."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "STARE_PROGRESS_INTERVAL_S": "0"}

SCRIPT = """
import sys
from loguru import logger
from stare_tir.tracking import progress, setup_run_logging
setup_run_logging(sys.argv[1], rank=int(sys.argv[2]), fresh=True)
logger.info("a log line")
with progress(3, "sft", "batch") as bar:
    for _ in range(3):
        bar.update(1)
        bar.set_postfix(loss="0.5")
"""


def run_rank(tmp_path: Path, rank: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), str(rank)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**ENV, "RANK": str(rank), "WORLD_SIZE": "2"},
    )


def test_progress_in_a_file_is_plain_lines_and_only_rank_0_prints(tmp_path):
    r0 = run_rank(tmp_path, 0)
    assert r0.returncode == 0, r0.stderr
    assert "\r" not in r0.stderr and "\x1b[" not in r0.stderr  # no redraws, no cursor codes
    lines = [line for line in r0.stderr.splitlines() if "sft: " in line]
    assert len(lines) == 4 and "sft: 3/3 (100%)" in lines[-1] and "loss=0.5" in lines[-1] and "(done)" in lines[-1]
    assert "a log line" in r0.stderr
    r1 = run_rank(tmp_path, 1)
    assert r1.returncode == 0 and r1.stderr == "", r1.stderr  # rank 1: its file only
    assert "a log line" in (tmp_path / "train.rank1.log").read_text()


def test_the_comparison_plot_tells_identical_runs_apart_and_marks_sparse_points(tmp_path, monkeypatch):
    import json

    import matplotlib.axes

    from stare_tir.tracking import plot_runs

    rows = [{"step": s, "entropy/batch": 0.5 - 0.01 * s, "reward/mean": 0.1 * s} for s in range(1, 31)]
    rows += [{"step": s, "eval/acc": 0.2 + 0.1 * i} for i, s in enumerate((0, 10, 30))]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    drawn = []
    original = matplotlib.axes.Axes.plot

    def plot(self, *args, **kwargs):
        drawn.append((self.get_title(), kwargs))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "plot", plot)
    plot_runs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp.png")
    entropy = [kw for title, kw in drawn if kw.get("label") in ("a", "b") and "ls" in kw and kw.get("marker") is None]
    assert len({kw["ls"] for kw in entropy}) == 2  # the same curve twice, two dash patterns
    evals = [kw for _, kw in drawn if kw.get("marker") == "o"]
    assert len(evals) >= 2  # 3 evaluations: 3 points, not a smooth line
