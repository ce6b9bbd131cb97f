"""A default run writes what the model wrote (samples/step_N.jsonl), and stare-compare puts two runs
side by side; an evaluation directory keeps one summary per dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "scripts" / "train_tir.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def compare(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "stare_tir.app.compare", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, env=ENV)


@pytest.mark.slow
def test_a_default_run_writes_samples_and_compare_prints_two_runs(tmp_path, tiny_run):
    runs = []
    for name, algo in (("stare", "stare"), ("grpo", "grpo_ds")):
        run_dir = tmp_path / name
        cmd = [
            sys.executable,
            str(TRAIN),
            f"trainer.run_dir={run_dir}",
            *tiny_run("trainer.eval_every=0", "algo.dynamic_sampling_rounds=2"),
            "trainer.steps=1",
            f"algo.name={algo}",
        ]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=ROOT, env=ENV)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        assert "\r" not in r.stderr and "\x1b[" not in r.stderr  # a console that is a pipe: plain lines
        runs.append(run_dir)

    rows = [json.loads(line) for line in (runs[0] / "samples" / "step_000001.jsonl").read_text().splitlines()]
    assert 1 <= len(rows) <= 4
    assert len({r["problem_id"] for r in rows}) == len(rows)  # one per prompt first
    for r in rows:
        assert r["step"] == 1 and r["reward"] in (-1.0, 1.0) and isinstance(r["correct"], bool)
        assert r["finish_reason"] and r["weight_version"] not in (None, [])
        assert "<|im_start|>assistant" in r["prompt"] and r["text"]

    r = compare(*map(str, runs), "--csv", str(tmp_path / "t.csv"), "--markdown", str(tmp_path / "t.md"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["field", "stare", "grpo"]
    for run_dir, col in zip(runs, (1, 2)):
        summary = json.loads((run_dir / "summary.json").read_text())
        best = next(line for line in lines if line.startswith("best held-out acc "))
        assert best.split()[-3 + col] == f"{summary['best_acc']:.3f}"
    assert any(line.startswith("RL steps") and line.split()[-2:] == ["1", "1"] for line in lines)
    assert (tmp_path / "t.csv").read_text().startswith("field,stare,grpo")
    assert (tmp_path / "t.md").read_text().startswith("| field | stare | grpo |")


def test_compare_reads_every_dataset_of_an_evaluation_directory(tmp_path):
    from stare_tir.eval.command import keep_dataset_summaries

    ev = tmp_path / "eval"
    ev.mkdir()
    m = {"problems": 30, "n": 4, "avg@4": 0.25, "maj@4": 0.3, "pass@4": 0.5, "mean_tool_calls": 1.5}
    keep_dataset_summaries(ev, {"datasets": {"aime24": m}, "six_benchmark_avg": None, "model": "x"})
    keep_dataset_summaries(ev, {"datasets": {"aime25": {**m, "avg@4": 0.125}}, "six_benchmark_avg": None})
    assert set(json.loads((ev / "summary.json").read_text())["datasets"]) == {"aime24", "aime25"}  # none lost
    r = compare(str(ev))
    assert r.returncode == 0, r.stderr
    assert "aime24: avg@N" in r.stdout and "0.250" in r.stdout and "aime25: avg@N" in r.stdout and "0.125" in r.stdout
    r = compare(str(tmp_path / "nothing"))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and len(r.stderr.splitlines()) == 1


def test_samples_go_to_wandb_as_a_table_and_only_at_step_1_and_every_nth(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from stare_tir.rollout.trajectory import Trajectory
    from stare_tir.tracking import MetricsLog
    from stare_tir.trainer.samples import write_samples

    logged = []
    fake = SimpleNamespace(
        init=lambda **kw: SimpleNamespace(log=lambda row, step: logged.append((step, row)), finish=lambda: None),
        Table=lambda columns, data: {"columns": columns, "data": data},
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    tok = SimpleNamespace(decode=lambda ids, skip_special_tokens=False: " ".join(map(str, ids)))
    trajs = []
    for group in range(3):
        for k in range(2):
            t = Trajectory(prompt_ids=[1, 2], problem_id=f"p{group}", group_id=group, reward=1.0 if k else -1.0)
            t.append([5, 6], [0.0, 0.0], "model", weight_versions=[(0, 2, "v3")])
            t.info["correct"] = bool(k)
            trajs.append(t)
    log = MetricsLog(tmp_path, wandb_project="p", run_name="r", wandb_id="x")
    assert write_samples(tmp_path, 2, trajs, tok, every=5, log=log) is None  # neither step 1 nor a 5th
    path = write_samples(tmp_path, 5, trajs, tok, every=5, n=4, log=log)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["problem_id"] for r in rows] == ["p0", "p1", "p2", "p0"]  # one per prompt first
    assert rows[0]["weight_version"] == "v3" and rows[0]["text"] == "5 6"
    step, row = logged[-1]
    assert step == 5 and row["samples"]["columns"][:3] == ["step", "problem_id", "reward"]
    assert len(row["samples"]["data"]) == 4
    assert write_samples(tmp_path, 1, trajs, tok, every=5) is not None  # the first step is always kept
    assert write_samples(tmp_path, 5, trajs, tok, every=5, rank=1) is None  # rank 0 writes


def test_stare_env_prints_versions_and_devices():
    r = subprocess.run(
        [sys.executable, "-m", "stare_tir.app.env_info"], capture_output=True, text=True, timeout=120, env=ENV
    )
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()]
    for name in ("python", "torch", "deepspeed", "transformers", "sglang"):
        assert name in names
    assert "cuda" in r.stdout


def _write_run(run: Path, rows: list[dict], summary: dict | None, grader: str = "math_verify") -> Path:
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(f"trainer:\n  steps: 4\nenv:\n  grader: {grader}\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))
    return run


def _step(step: int, entropy: float, gate: float = 0.0, seconds: float = 10.0, **extra) -> dict:
    return {"step": step, "entropy/batch": entropy, "stare/gate_on": gate, "time/step": seconds, **extra}


def test_compare_shows_an_unfinished_run_beside_a_finished_one(tmp_path):
    """One run still training (no summary.json): its column shows what metrics.jsonl has, marked
    unfinished; the table is not refused for it."""
    done_rows = [{"step": 0, "eval/acc": 0.2, "eval/tool_calls": 1.0}, *(_step(s, 0.5) for s in (1, 2))]
    done_rows.append({"step": 2, "eval/acc": 0.4, "eval/tool_calls": 2.0})
    summary = {"acc_before_rl": 0.2, "acc_after_rl": 0.4, "steps": 2, "grader": "math_verify", "seconds": {"rl": 30}}
    done = _write_run(tmp_path / "done", done_rows, summary)
    running = _write_run(
        tmp_path / "running",
        [{"step": 0, "eval/acc": 0.1, "eval/tool_calls": 0.5}, _step(1, 0.7, gate=1.0), _step(2, 0.6)],
        None,
        grader="boxed",
    )
    r = compare(str(done), str(running))
    assert r.returncode == 0, r.stderr
    lines = {line.split("  ")[0].strip(): line.split() for line in r.stdout.splitlines()[2:]}
    assert "finished" in r.stdout and "unfinished (no summary.json yet)" in r.stdout
    assert lines["held-out acc before RL"][-2:] == ["0.200", "0.100"]
    assert lines["held-out acc after RL (final)"][-2:] == ["0.400", "-"]
    assert lines["RL steps"][-2:] == ["2", "2"] and lines["STARE gate first open at step"][-1] == "1"
    assert lines["grader"][-2:] == ["math_verify", "boxed"]  # the unfinished run's config says


def test_compare_after_a_resume_covers_every_launch(tmp_path):
    """A run stopped at step 2 and resumed to step 4: summary.json was written by the last launch
    (its wall time is that launch's), the numbers of the table come from the whole metrics.jsonl."""
    rows = [
        {"step": 0, "eval/acc": 0.5, "eval/tool_calls": 1.0},
        _step(1, 0.9, gate=1.0, seconds=100.0),
        _step(2, 0.8, seconds=100.0),  # first launch ends here (interrupted, checkpoint at 2)
        _step(3, 0.7, seconds=50.0),
        _step(4, 0.6, gate=1.0, seconds=50.0),
        {"step": 4, "eval/acc": 0.75, "eval/tool_calls": 2.0},
    ]
    last_launch = {"acc_after_rl": 0.75, "steps": 4, "entropy_first_step": 0.7, "gate_on_fraction": 0.5}
    run = _write_run(tmp_path / "run", rows, {**last_launch, "grader": "math_verify", "seconds": {"rl": 101.0}})
    r = compare(str(run))
    assert r.returncode == 0, r.stderr
    lines = {line.split("  ")[0].strip(): line.split() for line in r.stdout.splitlines()[2:]}
    assert lines["entropy first step"][-1] == "0.900"  # step 1 of the first launch
    assert lines["gate on (fraction of steps)"][-1] == "0.500"
    assert lines["STARE gate first open at step"][-1] == "1"
    assert lines["best held-out acc"][-1] == "0.750" and lines["held-out acc before RL"][-1] == "0.500"
    assert lines["RL step time, all launches (s)"][-1] == "300.000"
    assert lines["wall time, last launch (s)"][-1] == "101.000"
    _write_run(tmp_path / "extended", [*rows, _step(5, 0.5)], {**last_launch, "seconds": {"rl": 101.0}})
    r = compare(str(tmp_path / "extended"))  # resumed past its end (more steps), still running
    assert "unfinished (its summary.json is from step 4)" in r.stdout and "RL steps" in r.stdout
