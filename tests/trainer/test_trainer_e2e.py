"""End to end on the tiny model: the real script, HF backend, local sandbox and DeepSpeed learner."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_tir.py"


def missing_from_metrics_doc(keys) -> str:
    """tests/core/test_core_metrics_doc.py's check (tests are no package: load it by path)."""
    spec = importlib.util.spec_from_file_location("metrics_doc", ROOT / "tests" / "core" / "test_core_metrics_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.missing_from_doc(keys)


# What these runs add to the shared tiny-run budgets (tests/conftest.py `tiny_run`): a checkpoint every
# step, no periodic evaluation, and STARE's gate always on, so STARE has work at every step.
E2E = (
    "trainer.eval_every=0",
    "trainer.save_every=1",
    "algo.dynamic_sampling_rounds=2",
    "algo.stare.target_entropy=100",
)


@pytest.fixture
def fast(tiny_run) -> list[str]:
    return tiny_run(*E2E)


def run_script(run_dir: Path, fast: list[str], *extra: str, timeout: int = 420) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(SCRIPT), f"trainer.run_dir={run_dir}", *fast, *extra]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def rows_by_step(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in rows if "entropy/batch" in r]
    assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
    return {r["step"]: r for r in rows if "entropy/batch" in r}


@pytest.mark.slow
def test_short_rl_run_completes_with_finite_metrics_and_checkpoints(tmp_path, fast):
    run_dir = tmp_path / "run"
    proc = run_script(run_dir, fast, "trainer.steps=2", "trainer.save_hf_every=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = rows_by_step(run_dir)
    assert sorted(steps) == [1, 2]
    # An intermediate HF export at step 1 (the last step's export is final/).
    assert sorted(p.name for p in (run_dir / "hf").iterdir()) == ["step_000001"]
    assert (run_dir / "hf" / "step_000001" / "config.json").is_file()
    assert "| rank0 |" in (run_dir / "train.log").read_text()
    for row in steps.values():
        for key in ("entropy/batch", "update/loss", "update/grad_norm", "reward/mean"):
            assert math.isfinite(row[key]), (key, row[key])
        assert row["stare/gate_on"] == 1.0 and row["stare/reweighted_frac"] > 0
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000002"
    assert (run_dir / "final" / "config.json").is_file()
    assert (run_dir / "config.yaml").is_file()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["acc_after_rl"] is not None
    assert Path(summary["plot"]).is_file()
    # trace generation shows progress: plain lines, as stderr is a pipe here (no bar redraws)
    assert "sft traces: 96/96 (100%)" in proc.stderr and "\r" not in proc.stderr
    assert summary["sft"]["key"] and (run_dir / "sft" / "model" / "sft_key.json").is_file()

    # Every key the default run wrote is described in docs/metrics.md.
    keys = {k for line in (run_dir / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert not missing_from_metrics_doc(keys), missing_from_metrics_doc(keys)

    # A second run into the same directory is refused, and changes nothing there.
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    again = run_script(run_dir, fast, "trainer.steps=2", "algo.name=grpo_ds", timeout=120)
    assert again.returncode == 2 and "already holds a run" in again.stderr and "Traceback" not in again.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_resume_after_sigkill_matches_an_uninterrupted_run(tmp_path, fast):
    reference = tmp_path / "reference"
    proc = run_script(reference, fast, "trainer.steps=3")
    assert proc.returncode == 0, proc.stderr[-3000:]

    killed = tmp_path / "killed"
    cmd = [sys.executable, str(SCRIPT), f"trainer.run_dir={killed}", *fast, "trainer.steps=3"]
    child = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    latest = killed / "checkpoints" / "latest"
    deadline = time.time() + 400
    while time.time() < deadline and child.poll() is None:
        if latest.exists() and latest.read_text().strip() == "step_000002":
            break
        time.sleep(0.05)
    assert child.poll() is None, "the run ended before it could be killed"
    os.killpg(child.pid, signal.SIGKILL)  # mid step 3 (or between steps): no chance to clean up
    child.wait()

    # --resume alone: the run's own config.yaml brings back every setting (fast, steps=3); the
    # defaults (16000 SFT traces, 40 steps) would neither match the reference nor finish in time.
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--resume", f"trainer.run_dir={killed}"],
        capture_output=True,
        text=True,
        timeout=420,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The killed run did not redo the reference's SFT: same inputs, sibling directory, reused.
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["sft"]["reused"] and summary["steps"] == 3
    ref, res = rows_by_step(reference), rows_by_step(killed)
    assert sorted(res) == [1, 2, 3]  # no step lost, none repeated
    for step in (1, 2, 3):
        for key in ("reward/mean", "entropy/batch", "update/loss", "rollout/response_len"):
            assert res[step][key] == pytest.approx(ref[step][key], rel=1e-4, abs=1e-6), (step, key)


@pytest.mark.slow
def test_two_process_data_parallel_run_under_torchrun(tmp_path, fast):
    run_dir = tmp_path / "dp2"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        str(SCRIPT),
        f"trainer.run_dir={run_dir}",
        *fast,
        "trainer.steps=2",
        "learner.zero_stage=2",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]  # rank 0 alone writes the log
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == 2


@pytest.mark.slow
def test_ctrl_c_stops_after_the_step_saves_it_and_says_how_to_resume(tmp_path, fast):
    run_dir = tmp_path / "run"
    # No SFT and GRPO without dynamic sampling: every step updates, a step takes about a second.
    quick = ["model.path=tiny", "sft.enabled=false", "algo.name=grpo", "trainer.steps=30"]
    cmd = [sys.executable, str(SCRIPT), f"trainer.run_dir={run_dir}", *fast, *quick]
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    latest = run_dir / "checkpoints" / "latest"
    deadline = time.time() + 300
    while time.time() < deadline and child.poll() is None and not latest.exists():
        time.sleep(0.05)
    assert child.poll() is None, "the run ended before it could be interrupted"
    child.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends
    _, err = child.communicate(timeout=120)
    assert child.returncode == 130, err[-3000:]
    last = err.strip().splitlines()[-1]
    step = int(latest.read_text().strip().removeprefix("step_"))
    assert last == f"interrupted at step {step}; resume with: stare-train --resume trainer.run_dir={run_dir}", last
    assert "Traceback" not in err
    assert sorted(rows_by_step(run_dir)) == list(range(1, step + 1))  # the last step is saved, none lost

    resumed = subprocess.run(
        [sys.executable, str(SCRIPT), "--resume", f"trainer.run_dir={run_dir}", "trainer.steps=" + str(step + 1)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert resumed.returncode == 2 and f"trainer.steps: 30 -> {step + 1}" in resumed.stderr  # a change: shown
    resumed = subprocess.run(
        [*cmd[:2], "--resume", "--accept-changes", f"trainer.run_dir={run_dir}", f"trainer.steps={step + 1}"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(rows_by_step(run_dir)) == list(range(1, step + 2))
