"""The end-of-run summary and plot: when the STARE gate first opened, and the best held-out accuracy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stare_tir.app.pipeline import format_summary, run_milestones
from stare_tir.tracking import first_gate_step, plot_runs


def metrics_rows() -> list[dict]:
    """A run as metrics.jsonl holds it: eval rows at 0, 2, 4 (periodic) and 5 (final), gate from step 3."""
    rows: list[dict] = [{"step": 0, "eval/acc": 0.2, "eval/tool_calls": 0.4}]
    for step, gate in zip(range(1, 6), (0.0, 0.0, 1.0, 0.0, 1.0)):
        row = {
            "step": step,
            "entropy/batch": 0.8 - 0.1 * step,
            "entropy/target": 0.3,
            "stare/gate_on": gate,
            "reward/mean": 0.1 * step,
            "acc/train": 0.1 * step,
        }
        if step in (2, 4):
            row["eval/acc"] = {2: 0.4, 4: 0.5}[step]
        rows.append(row)
    rows.append({"step": 5, "eval/acc": 0.5, "eval/tool_calls": 0.9})  # the final evaluation
    return rows


def test_milestones_name_the_first_gated_step_and_the_first_step_at_the_best_accuracy():
    m = run_milestones(metrics_rows())
    # The best accuracy is reached at step 4 and again at the end: the first step counts.
    assert m == {"gate_first_step": 3, "best_acc": 0.5, "best_acc_step": 4}


def test_milestones_of_a_run_whose_gate_never_opened_and_that_was_never_evaluated():
    rows = [{"step": 1, "entropy/batch": 0.7, "stare/gate_on": 0.0}, {"step": 2, "entropy/batch": 0.6}]
    assert run_milestones(rows) == {"gate_first_step": None, "best_acc": None, "best_acc_step": None}
    # An evaluation row carries no gate state: it never counts as the gate's opening.
    assert first_gate_step([{"step": 1, "eval/acc": 0.3, "stare/gate_on": 1.0}]) is None


def test_summary_table_prints_gate_step_and_best_accuracy():
    s = {
        "acc_before_rl": 0.2,
        "acc_after_rl": 0.5,
        "tool_calls_before_rl": 0.4,
        "tool_calls_after_rl": 0.9,
        "entropy_first_step": 0.7,
        "entropy_last_step": 0.3,
        "gate_on_fraction": 0.4,
        "steps": 5,
        "seconds": {"sft": 10.0, "rl": 50.0},
        "plot": "p.png",
        "final_model": "final",
        **run_milestones(metrics_rows()),
    }
    text = format_summary(s)
    assert "best held-out accuracy 0.500 at step 4" in text
    assert "gate on: 40% of 5 steps, first open at step 3" in text
    never = format_summary({**s, "gate_first_step": None, "best_acc": None, "best_acc_step": None})
    assert "first open at step -" in never and "best held-out accuracy - at step -" in never


def test_plot_marks_where_the_gate_first_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import matplotlib.axes

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics_rows()))
    marks: list[tuple[float, str]] = []
    real = matplotlib.axes.Axes.axvline

    def record(self, x=0, *args, **kwargs):
        marks.append((x, kwargs.get("label", "")))
        return real(self, x, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "axvline", record)
    out = plot_runs([run], tmp_path / "curves.png")
    assert out.is_file() and out.stat().st_size > 0
    assert len(marks) == 6  # one mark per panel
    assert all(x == 3 and "gate opens (step 3)" in label for x, label in marks)
