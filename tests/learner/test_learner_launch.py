"""Launchers: torchrun, DeepSpeed's launcher, srun and mpirun give a rank, a world size and a
rendezvous address, or the start is refused with a line naming what is missing. Never N
single-process runs. The launchers' environments are simulated (variables as each one sets them:
torchrun/deepspeed.launcher.launch: RANK..., srun: SLURM_*, Open MPI: OMPI_COMM_WORLD_*, Hydra:
PMI_*/MPI_LOCALRANKID)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from stare_tir.learner.distributed import LaunchError, first_host, launch_env

ROOT = Path(__file__).resolve().parents[2]

SRUN = {  # task 3 of an 8-task srun step on two nodes, as slurmstepd sets it
    "SLURM_JOB_ID": "4242",
    "SLURM_NTASKS": "8",
    "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "3",
    "SLURM_STEP_NODELIST": "gpu[007-008]",
    "SLURM_JOB_NODELIST": "cpu1,gpu[007-008]",
}


def test_plain_python_is_one_process():
    assert launch_env({}) is None
    assert launch_env({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None  # sbatch -n 1


def test_torchrun_and_deepspeed_launcher_variables_are_used_as_they_are():
    env = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n0", "MASTER_PORT": "1234"}
    got = launch_env(env)
    assert (got.rank, got.world_size, got.local_rank, got.master_addr, got.master_port) == (5, 8, 1, "n0", 1234)
    # DeepSpeed's MPICH runner exports WORLD_SIZE/MASTER_*, its helper RANK; LOCAL_RANK from Hydra
    env = {"RANK": "2", "WORLD_SIZE": "4", "MPI_LOCALRANKID": "0", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    assert launch_env(env).local_rank == 0


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"RANK": "0"}, "WORLD_SIZE is not set"),
        ({"WORLD_SIZE": "2"}, "RANK is not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a", "MASTER_PORT": "1"}, "LOCAL_RANK is not set"),
        ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}, "MASTER_ADDR is not set"),
        ({"RANK": "2", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "a"}, "rank 2 of world size 2"),
        ({"RANK": "x", "WORLD_SIZE": "2"}, "RANK='x' is not an integer"),
    ],
)
def test_incomplete_torchrun_style_variables_are_refused(env, needle):
    with pytest.raises(LaunchError, match=needle):
        launch_env(env)


def test_srun_task_gets_rank_size_local_rank_and_the_steps_first_node():
    got = launch_env(SRUN)
    assert (got.rank, got.world_size, got.local_rank) == (3, 8, 3)
    assert got.master_addr == "gpu007"  # the step's first node, not the job's (cpu1 serves SGLang)
    assert got.master_port == 20000 + 4242 % 10000  # per job: two jobs on one node do not collide
    assert launch_env({**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "2"}).master_addr == "head"  # job's choice wins


def test_srun_without_a_node_list_or_master_addr_is_refused():
    env = {k: v for k, v in SRUN.items() if "NODELIST" not in k}
    with pytest.raises(LaunchError, match="MASTER_ADDR is not set"):
        launch_env(env)


def test_python_inside_a_multi_task_allocation_without_srun_is_refused():
    """`python train.py` in an sbatch script of 8 tasks: one process would train alone."""
    with pytest.raises(LaunchError, match="not started by srun"):
        launch_env({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "8", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"})


def test_mpirun_variables_are_used_and_a_missing_master_addr_is_named():
    ompi = {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1"}
    with pytest.raises(LaunchError, match=r"Open MPI.*MASTER_ADDR is not set.*-x MASTER_ADDR"):
        launch_env(ompi)
    got = launch_env({**ompi, "MASTER_ADDR": "n0"})
    assert (got.rank, got.world_size, got.local_rank, got.master_port) == (3, 4, 1, 29500)
    hydra = {"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALRANKID": "1", "MASTER_ADDR": "n0"}
    assert launch_env(hydra).rank == 1
    with pytest.raises(LaunchError, match="MPI_LOCALRANKID is not"):
        launch_env({"PMI_SIZE": "2", "PMI_RANK": "1", "MASTER_ADDR": "n0"})
    assert launch_env({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})


def test_slurm_hostlists():
    assert first_host("gpu[003-004,9],cpu1") == "gpu003"
    assert first_host("n[1-2]-ib[3-4]") == "n1-ib3"
    assert first_host("node7,node8") == "node7"


# Two processes that know only their launcher's variables form one group of two.
_JOIN = """
from datetime import timedelta
import torch, torch.distributed as dist
from stare_tir.learner.distributed import init_process_group
launch = init_process_group("gloo", timedelta(seconds=60))
x = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(x)
print(f"JOINED rank={dist.get_rank()} world={dist.get_world_size()} local={launch.local_rank} sum={x.item():.0f}")
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env() -> dict[str, str]:
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SLURM_", "OMPI_", "PMI_"))}


def _run_two(envs: list[dict[str, str]]) -> list[str]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _JOIN],
            env={**_clean_env(), **e},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for e in envs
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-3000:]
        outs.append(next(line for line in out.splitlines() if line.startswith("JOINED")))
    return outs


@pytest.mark.parametrize("launcher", ["srun", "mpirun"])
def test_two_processes_started_like_srun_or_mpirun_form_one_group(launcher):
    port = str(_free_port())
    if launcher == "srun":
        base = {"SLURM_JOB_ID": "7", "SLURM_STEP_NUM_TASKS": "2", "SLURM_NTASKS": "2", "MASTER_PORT": port}
        base["SLURM_STEP_NODELIST"] = "127.0.0.1"  # the first node's name resolves to this machine
        envs = [{**base, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)} for r in (0, 1)]
    else:
        base = {"OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
        envs = [{**base, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_RANK": str(r)} for r in (0, 1)]
    assert _run_two(envs) == [f"JOINED rank={r} world=2 local={r} sum=3" for r in (0, 1)]


def test_train_cli_refuses_a_slurm_allocation_without_srun_in_one_line():
    env = {**_clean_env(), "SLURM_JOB_ID": "9", "SLURM_NTASKS": "4", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    res = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_tir.py"), "trainer.steps=1"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    first = res.stderr.splitlines()[0]
    assert first.startswith("error: this Slurm allocation has 4 tasks") and "srun" in first


def test_a_rank_that_cannot_see_its_gpu_is_refused(monkeypatch):
    """srun --gpus-per-task: each task sees one GPU, but DeepSpeed selects cuda:LOCAL_RANK."""
    import torch

    from stare_tir.learner.distributed import cuda_device_index

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert cuda_device_index(launch_env({**SRUN, "SLURM_LOCALID": "0"})) == 0
    with pytest.raises(LaunchError, match=r"LOCAL_RANK=3 but this process sees 1 CUDA device.*--gpus-per-node"):
        cuda_device_index(launch_env(SRUN))


def test_entry_points_export_the_srun_rank_before_anything_names_a_per_rank_file(monkeypatch):
    """Per-rank logs (train.rank<N>.log) and rank-0-only files read RANK: under srun it must be
    there from the start, or every task would take itself for rank 0 and write train.log."""
    import argparse

    from stare_tir.app.cli import run_cli

    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        # setenv first: delenv of an absent key records nothing, so what run_cli exports would stay
        # in this worker's environment (a later in-process ZeRO-3 Init then saw WORLD_SIZE=8, and
        # every later subprocess waited for a rendezvous at gpu007).
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    for key, value in {**SRUN, "SLURM_PROCID": "5", "SLURM_LOCALID": "1"}.items():
        monkeypatch.setenv(key, value)
    seen = {}

    def main(args):
        seen.update({k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR")})
        return 0

    assert run_cli(main, argparse.Namespace(debug=False)) == 0
    assert seen == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "gpu007"}
