"""Data parallelism: 2 processes (ZeRO-2, gloo) take the same steps as 1 process on the same data.

The batch is split round robin, so the ranks hold different numbers of tokens and micro-batches:
this checks the global token count, the empty filler micro-batches, the undoing of DeepSpeed's
gradient averaging, and STARE's batch-scope selection over all-gathered tokens.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).resolve().parent / "learner_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(model: str, out: Path, world: int, extra: list[str]) -> None:
    """Start `world` ranks of the worker the way torchrun would (env:// rendezvous)."""
    port = _free_port()
    procs, logs = [], []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world),
            "OMP_NUM_THREADS": "1",
        }  # 2 ranks on 2 cores: no oversubscription
        log = out.with_suffix(f".rank{rank}.log")
        logs.append(log)
        with open(log, "w") as f:  # a file, not a pipe: a rank blocked on a full pipe would hang the rest
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(WORKER), model, str(out), *extra], env=env, stdout=f, stderr=subprocess.STDOUT
                )
            )
    try:
        for p in procs:
            p.wait(timeout=300)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} failed (exit {p.returncode}):\n{log.read_text()[-4000:]}"


@pytest.mark.parametrize("stage", [2, 3])
def test_two_process_zero_matches_one_process(tiny_path, worker, vocab, tmp_path, stage):
    """ZeRO-3: every parameter is partitioned over the ranks and gathered at each use.

    The 2-rank run also saves a checkpoint after its first step; a 1-process learner resumes from
    it (through DeepSpeed's universal checkpoint) and takes the 2-rank run's second step."""
    out, ckpt = tmp_path / "two.pt", tmp_path / "ckpt"
    extra = ["--zero-stage", str(stage), "--budget", "64", "--stare", "--dist-timeout-minutes", "37"]
    _launch(tiny_path, out, 2, [*extra, "--save-after-first", str(ckpt)])
    two = torch.load(out, weights_only=False)
    one = worker.run(tiny_path, zero_stage=stage, budget=64, stare=True)
    assert two["world_size"] == 2 and one["world_size"] == 1
    # learner.dist_timeout_minutes reached the env:// process group's gloo backend, and every
    # group DeepSpeed created (its data-parallel clone of the world, ZeRO's groups).
    assert two["pg_timeout"] == timedelta(minutes=37)
    assert len(two["group_timeouts"]) > 1 and set(two["group_timeouts"]) == {timedelta(minutes=37)}

    for step, (m1, m2) in enumerate(zip(one["metrics"], two["metrics"])):
        assert m1["tokens"] == m2["tokens"] and m1["sequences"] == m2["sequences"], step
        assert m2["loss"] == pytest.approx(m1["loss"], rel=1e-5, abs=1e-7), step
        assert m2["grad_norm"] == pytest.approx(m1["grad_norm"], rel=1e-5), step
        assert m2["pg/clipfrac_high"] == pytest.approx(m1["pg/clipfrac_high"], abs=1e-9), step
        assert m1["step_skipped"] == m2["step_skipped"] == 0
        # STARE selected the same tokens over the all-gathered batch as over the whole one.
        assert m1["omega_excess"] > 0 and m2["omega_excess"] == pytest.approx(m1["omega_excess"], rel=1e-9)
    w1, w2 = one["weights"], two["weights"]
    assert w1.keys() == w2.keys()
    assert max(float((w1[k] - w2[k]).abs().max()) for k in w1) < 1e-5
    # Not vacuous: the two steps moved the weights by far more than the tolerance.
    from transformers import AutoModelForCausalLM

    w0 = dict(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).named_parameters())
    assert max(float((w1[k] - w0[k]).abs().max()) for k in w1) > 1e-3

    # Resume the 2-rank checkpoint on 1 rank: converted once, then the same second step.
    resumed = worker.make_learner(tiny_path, stage, 64)
    resumed.load_checkpoint(ckpt)
    assert (ckpt / "universal" / "zero").is_dir() and resumed.steps_applied == 1
    m = worker.step(resumed, 16, vocab, stare=True)
    assert m["loss"] == pytest.approx(two["metrics"][1]["loss"], rel=1e-5, abs=1e-7)
    assert m["grad_norm"] == pytest.approx(two["metrics"][1]["grad_norm"], rel=1e-5)
    wr = {k: v.clone() for k, v in resumed.export_weights()}
    assert max(float((wr[k] - w2[k]).abs().max()) for k in w2) < 1e-5  # weights and Adam state carried over


def test_one_process_group_gets_the_configured_timeout():
    """Without a launcher (in-process store) the timeout reaches the group too; a fresh
    interpreter, since a test process may already hold a group from another test."""
    code = (
        "from datetime import timedelta\n"
        "from stare_tir.learner.distributed import init_process_group, process_group_timeout\n"
        "init_process_group('gloo', timedelta(minutes=123))\n"
        "print(process_group_timeout().total_seconds())\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    res = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert res.returncode == 0, res.stderr[-2000:]
    assert float(res.stdout.split()[-1]) == 123 * 60
