"""Process groups for the learner: who launched us, the group, its timeout, and RNG state.

Launchers. torchrun and DeepSpeed's launcher (`deepspeed`, pdsh, and its MPICH/Intel-MPI runners)
set RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT. `srun`, `mpirun` and DeepSpeed's
`--launcher openmpi|slurm` do not: they set their own variables, and DeepSpeed's answer
(`deepspeed/comm/comm.py: mpi_discovery`, through mpi4py) never runs here because the learner makes
the process group itself. So `launch_env` maps those variables to torch's, as `mpi_discovery`
does, and refuses with one line naming what is missing: a multi-process launch never turns into
N single-process runs.
"""

from __future__ import annotations

import logging
import os
import random
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

# torch.distributed's default port (torchrun --master_port, DeepSpeed's TORCH_DISTRIBUTED_DEFAULT_PORT).
DEFAULT_PORT = 29500


class LaunchError(ValueError):
    """A launch whose rank, size or rendezvous address cannot be told; the message names the fix."""


@dataclass(frozen=True)
class LaunchEnv:
    """This process's place in the job, in torch's env:// terms."""

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str  # what set the variables, for messages

    def as_environ(self) -> dict[str, str]:
        return {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }


# MPI launchers: (name, size variable, rank variable, local-rank variable). Open MPI's mpirun
# (also DeepSpeed's openmpi runner), MPICH/Intel MPI's Hydra (PMI_*, MPI_LOCALRANKID, as
# deepspeed/launcher/launcher_helper.py reads them), MVAPICH2.
MPI_LAUNCHERS = (
    ("mpirun (Open MPI)", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mpirun (MPICH / Intel MPI)", "PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID"),
    ("mpirun (MVAPICH2)", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_LOCAL_RANK"),
)
# Where a local rank may come from when a launcher sets RANK and WORLD_SIZE but not LOCAL_RANK.
LOCAL_RANK_VARS = (
    "LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
    "SLURM_LOCALID",
)


def _int(env: Mapping[str, str], name: str, launcher: str) -> int:
    value = env[name]
    try:
        return int(value)
    except ValueError:
        raise LaunchError(f"{launcher}: {name}={value!r} is not an integer") from None


def first_host(nodelist: str) -> str:
    """The first host of a Slurm hostlist: 'gpu[003-004,9],cpu1' -> 'gpu003' (padding kept)."""
    item = re.split(r",(?![^\[]*\])", nodelist.strip())[0]  # first entry outside brackets
    # every bracket group becomes the first number of its first range
    return re.sub(r"\[([^\]\-,]+)[^\]]*\]", r"\1", item)


def _rendezvous(env: Mapping[str, str], launcher: str, world_size: int, how: str) -> tuple[str, int]:
    """MASTER_ADDR and MASTER_PORT from the job's environment (a 1-process job needs none)."""
    addr = env.get("MASTER_ADDR", "")
    if not addr and world_size == 1:
        addr = "127.0.0.1"
    if not addr:
        raise LaunchError(f"{launcher} started {world_size} processes but MASTER_ADDR is not set: {how}")
    port = _int(env, "MASTER_PORT", launcher) if env.get("MASTER_PORT") else DEFAULT_PORT
    return addr, port


def _checked(rank: int, world: int, local: int, addr: str, port: int, launcher: str) -> LaunchEnv:
    if world < 1 or not 0 <= rank < world:
        raise LaunchError(f"{launcher}: rank {rank} of world size {world} is not a valid place in the job")
    if local < 0:
        raise LaunchError(f"{launcher}: local rank {local} is negative")
    return LaunchEnv(rank, world, local, addr, port, launcher)


def launch_env(env: Mapping[str, str]) -> LaunchEnv | None:
    """Rank, world size, local rank and rendezvous address from the launcher's variables.

    None when no launcher is recognised (a plain `python ...`: one process). Raises LaunchError,
    naming the missing variable and the fix, when a launcher's variables are incomplete.
    """
    if "RANK" in env or "WORLD_SIZE" in env:  # torchrun, deepspeed, DeepSpeed's MPICH/IMPI runners
        launcher = "torchrun-style launch (RANK/WORLD_SIZE)"
        for name in ("RANK", "WORLD_SIZE"):
            if name not in env:
                raise LaunchError(f"{launcher}: {name} is not set (a launcher sets RANK and WORLD_SIZE together)")
        rank, world = _int(env, "RANK", launcher), _int(env, "WORLD_SIZE", launcher)
        source = next((v for v in LOCAL_RANK_VARS if v in env), None)
        if source is None and world > 1:
            raise LaunchError(f"{launcher}: LOCAL_RANK is not set (the process's index on its node)")
        local = _int(env, source, launcher) if source else 0
        addr, port = _rendezvous(env, launcher, world, "set MASTER_ADDR and MASTER_PORT of rank 0's host")
        return _checked(rank, world, local, addr, port, launcher)

    for launcher, size_var, rank_var, local_var in MPI_LAUNCHERS:
        if size_var in env:
            missing = [v for v in (rank_var, local_var) if v not in env]
            if missing:
                raise LaunchError(f"{launcher}: {size_var} is set but {', '.join(missing)} is not")
            world = _int(env, size_var, launcher)
            addr, port = _rendezvous(
                env,
                launcher,
                world,
                "mpirun does not say which host is rank 0; pass it, e.g. mpirun -x MASTER_ADDR=<first host> "
                f"-x MASTER_PORT={DEFAULT_PORT} (Open MPI) or -genv MASTER_ADDR <first host> (MPICH)",
            )
            return _checked(_int(env, rank_var, launcher), world, _int(env, local_var, launcher), addr, port, launcher)

    if "SLURM_STEP_NUM_TASKS" in env:  # a task of an srun step
        launcher = "srun"
        missing = [v for v in ("SLURM_PROCID", "SLURM_LOCALID") if v not in env]
        if missing:
            raise LaunchError(f"{launcher}: SLURM_STEP_NUM_TASKS is set but {', '.join(missing)} is not")
        world = _int(env, "SLURM_STEP_NUM_TASKS", launcher)
        nodes = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST", "")
        with_addr = dict(env)
        if not with_addr.get("MASTER_ADDR") and nodes:
            with_addr["MASTER_ADDR"] = first_host(nodes)  # the step's first node runs task 0
        if not with_addr.get("MASTER_PORT") and env.get("SLURM_JOB_ID", "").isdigit():
            # a port per job: two jobs sharing a node do not meet at the same address
            with_addr["MASTER_PORT"] = str(20000 + int(env["SLURM_JOB_ID"]) % 10000)
        addr, port = _rendezvous(
            with_addr, launcher, world, "no SLURM_STEP_NODELIST either; export MASTER_ADDR=<first node>"
        )
        return _checked(
            _int(env, "SLURM_PROCID", launcher), world, _int(env, "SLURM_LOCALID", launcher), addr, port, launcher
        )
    tasks = env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")
    if tasks and tasks.isdigit() and int(tasks) > 1:
        raise LaunchError(
            f"this Slurm allocation has {tasks} tasks (SLURM_NTASKS) but this process was not started by "
            "srun (no SLURM_STEP_NUM_TASKS): start every rank with srun (or torchrun), not one python"
        )
    return None


def export_launch_env(env: os._Environ | dict | None = None) -> LaunchEnv | None:
    """Resolve `launch_env` and write RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT into the
    environment (as DeepSpeed's mpi_discovery does), so that everything after, the learner, the run
    directory's per-rank logs, DeepSpeed itself, sees one consistent answer. Idempotent."""
    env = os.environ if env is None else env
    resolved = launch_env(env)
    if resolved is not None:
        env.update(resolved.as_environ())
    return resolved


def cuda_device_index(launch: LaunchEnv | None) -> int:
    """The CUDA device of this rank: cuda:LOCAL_RANK, which DeepSpeed's engine also selects
    (engine.py `_set_distributed_vars`). Refused when the rank cannot see that device."""
    import torch

    local_rank, visible = (launch.local_rank if launch else 0), torch.cuda.device_count()
    if local_rank >= visible:
        raise LaunchError(
            f"LOCAL_RANK={local_rank} but this process sees {visible} CUDA device(s) "
            f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): let every rank "
            "see all GPUs of its node (srun --gpus-per-node, not --gpus-per-task)"
        )
    return local_rank


def init_process_group(backend: str, timeout: timedelta) -> LaunchEnv | None:
    """Join the launcher's process group, or make a 1-process one when started without a launcher.

    timeout bounds every collective of the default group (NCCL's watchdog, gloo's waits). A group
    that already exists is kept (its timeout cannot change); a different timeout is logged.
    Returns the launch (None: no launcher, one process).
    """
    import torch.distributed as dist

    launch = export_launch_env()
    if dist.is_initialized():
        current = process_group_timeout()
        if current is not None and current != timeout:
            logging.getLogger(__name__).warning(
                f"process group exists with timeout {current}; requested {timeout} is not applied"
            )
        return launch
    if launch is not None:
        dist.init_process_group(backend=backend, timeout=timeout)  # env://, exported above
    else:
        # An in-process store: a 1-process group needs no address, port or file. DeepSpeed's
        # engine still insists on LOCAL_RANK, which a launcher would have set.
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        os.environ.setdefault("LOCAL_RANK", "0")
    return launch


def give_deepspeed_groups_timeout(timeout: timedelta) -> None:
    """Make every process group DeepSpeed creates from now on use `timeout`.

    DeepSpeed creates its groups (the data-parallel clone of the world in
    `deepspeed/utils/groups.py: _clone_world_group`, ZeRO's and expert groups) through its comm
    backend's `new_group(ranks)` (`deepspeed/comm/torch.py: TorchBackend.new_group`), which calls
    `torch.distributed.new_group(ranks)` without a timeout: torch then uses its backend default
    (10 minutes for NCCL, 30 for gloo), not the default group's. The backend object is created by
    `deepspeed.init_distributed`; its `new_group` is replaced on that instance only.
    """
    import torch.distributed as dist
    from deepspeed import comm

    backend = comm.comm.cdb
    if backend is None:
        raise RuntimeError("deepspeed.init_distributed must run before give_deepspeed_groups_timeout")

    def new_group(ranks):
        return dist.new_group(ranks, timeout=timeout)

    backend.new_group = new_group


def group_timeout(group=None) -> timedelta | None:
    """The timeout a group's backend really uses (None if it cannot be read; private torch API).

    Read from the backend's options, not from our argument: this is what a test must see.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        return None
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    device = torch.device("cuda") if dist.get_backend(pg) == "nccl" else torch.device("cpu")
    try:
        return pg._get_backend(device).options._timeout
    except (AttributeError, RuntimeError):  # other torch versions may lack it
        return None


def process_group_timeout() -> timedelta | None:
    """The default group's timeout (see group_timeout)."""
    return group_timeout()


def all_group_timeouts() -> list[timedelta | None]:
    """The timeout of every process group this process holds, the default one included."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return []
    return [group_timeout(pg) for pg in list(dist.distributed_c10d._world.pg_map)]


def skip_shm_comm_build() -> None:
    """Keep DeepSpeed from compiling its CPU shared-memory all-reduce op on first use.

    DeepSpeed builds it (~40-60 s of g++ on a cold cache) when its comm backend is created, but only
    `inference_all_reduce` (tensor-parallel inference) ever uses it; training collectives go
    through torch.distributed (gloo) either way. Marking it incompatible makes DeepSpeed skip it.
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def seed_all(seed: int) -> None:
    """Seed every generator `rng_state` saves (python, numpy, torch and CUDA)."""
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict:
    import numpy as np
    import torch

    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict) -> None:
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
