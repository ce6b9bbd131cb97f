"""Two "nodes" on one machine train exactly like one node with two processes.

`torchrun --nnodes 2 --nproc_per_node 1` started twice (two agents, c10d rendezvous on 127.0.0.1):
both ranks have LOCAL_RANK 0, as on two real nodes, and share one run directory, as two nodes
share a file system. The same RL run (real script, HF backend, local sandbox, DeepSpeed ZeRO-2,
a checkpoint every step) then runs under `torchrun --nproc_per_node 2`. Same losses, gradient
norms and rewards step by step, and no file of the run directory written twice: one log per
rank, one metrics row per step, one summary, one checkpoint per step with both ranks' shards.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "train_tir.py"
STEPS = 3
# GRPO-ds from the shipped tiny base: groups whose rewards tie are refilled, so the steps have a
# gradient; tiny budgets keep a step short.
FAST = [
    "model.path=tiny",
    "sft.enabled=false",
    "algo.name=grpo_ds",
    "algo.dynamic_sampling_rounds=3",
    "data.arithmetic_train_size=64",
    "data.arithmetic_eval_size=2",
    "trainer.eval_every=0",
    "trainer.eval_n=1",
    "trainer.prompts_per_step=4",
    "rollout.n_per_prompt=4",
    "rollout.max_total_tokens=48",
    "rollout.max_new_tokens_per_turn=24",
    "trainer.save_every=1",
    f"trainer.steps={STEPS}",
    "learner.zero_stage=2",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {**{k: v for k, v in os.environ.items() if k not in drop}, "OMP_NUM_THREADS": "1"}


def _torchrun(args: list[str], run_dir: Path, log: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", *args, str(SCRIPT), f"trainer.run_dir={run_dir}", *FAST]
    with open(log, "w") as f:  # a file, not a pipe: a full pipe would block a rank
        return subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=f, stderr=subprocess.STDOUT)


def _wait(procs: list[subprocess.Popen], logs: list[Path]) -> None:
    try:
        for p in procs:
            p.wait(timeout=600)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, f"{log.name} (exit {p.returncode}):\n{log.read_text()[-4000:]}"


def _steps(run_dir: Path) -> dict[int, dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "reward/mean" in r]
    assert [r["step"] for r in train] == list(range(1, STEPS + 1))  # one row per step: rank 0 alone
    return {r["step"]: r for r in train}


@pytest.mark.slow
def test_two_nodes_train_exactly_like_one_node_with_two_processes(tmp_path):
    nodes_dir, one_dir = tmp_path / "two_nodes", tmp_path / "one_node"
    port = _free_port()
    rdzv = ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d"]
    rdzv += ["--rdzv_endpoint", f"127.0.0.1:{port}", "--rdzv_id", "two-nodes"]
    logs = [tmp_path / "node0.log", tmp_path / "node1.log", tmp_path / "one_node.log"]
    procs = [_torchrun(rdzv, nodes_dir, logs[0]), _torchrun(rdzv, nodes_dir, logs[1])]
    procs.append(_torchrun(["--nproc_per_node", "2", "--master_port", str(_free_port())], one_dir, logs[2]))
    _wait(procs, logs)

    nodes, one = _steps(nodes_dir), _steps(one_dir)
    for step in nodes:  # a step whose groups all tied after the refills updates nothing, in both
        keys = ["reward/mean", "entropy/batch", "update/loss", "update/grad_norm", "update/skipped_empty"]
        assert [k in nodes[step] for k in keys] == [k in one[step] for k in keys], step
        for key in (k for k in keys if k in one[step]):
            assert nodes[step][key] == pytest.approx(one[step][key], rel=1e-6, abs=1e-9), (step, key)
    assert sum(r.get("update/grad_norm", 0) > 0 for r in nodes.values()) >= 2  # it trained, after a sync too

    # Both "nodes" were LOCAL_RANK 0; what each wrote is named by its global rank.
    for run_dir in (nodes_dir, one_dir):
        assert "| rank0 |" in (run_dir / "train.log").read_text()
        rank1 = (run_dir / "train.rank1.log").read_text()
        assert "| rank1 |" in rank1 and "| rank0 |" not in rank1
        assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS
        ckpt = run_dir / "checkpoints" / (run_dir / "checkpoints" / "latest").read_text().strip()
        assert sorted(p.name for p in ckpt.glob("rng_rank*.pt")) == ["rng_rank0.pt", "rng_rank1.pt"]
        assert len(list((ckpt / "deepspeed").glob("zero_pp_rank_*_optim_states.pt"))) == 2
        assert json.loads((ckpt / "learner_layout.json").read_text())["world_size"] == 2
