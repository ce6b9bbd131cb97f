"""Weight sync and empty-step guards of the RL loop, with small fakes (no processes, no servers).

The same rules under `torchrun` against SGLang stand-ins: test_sglang_two_ranks.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stare_tir.algos.stare import StareController
from stare_tir.data import PromptSampler
from stare_tir.rollout.engine import RolloutEngine
from stare_tir.rollout.trajectory import Trajectory
from stare_tir.trainer import (
    Run,
    TrainConfig,
    release_rollout_memory,
    resume_rollout_memory,
    rl_step,
    sync_weights,
)


class FakeLearner:
    """Collective helpers of one rank of a `world_size` run; all_reduce adds `peer_sum` (what the
    other ranks contribute) to this rank's value."""

    def __init__(self, rank: int = 0, world_size: int = 2, peer_sum: float = 0.0) -> None:
        self.rank, self.world_size, self.peer_sum = rank, world_size, peer_sum
        self.reduces = 0
        self.exported = 0

    def all_reduce_sum(self, x):
        self.reduces += 1
        return x + self.peer_sum

    def shard(self, items):
        return list(items)

    def export_weights(self):
        self.exported += 1
        yield "w", torch.zeros(2)


class SharedBackend:
    """Servers shared by all ranks (like SGLang): only one rank may push."""

    shared_by_ranks = True

    def __init__(self, fail: bool = False) -> None:
        self.pushes, self.fail = 0, fail

    def update_weights(self, named):
        list(named)
        if self.fail:
            raise RuntimeError("server refused the update")
        self.pushes += 1


class OwnBackend(SharedBackend):
    """A backend inside each rank's process (like HF): every rank updates its own."""

    shared_by_ranks = False


def _run(learner, backend, cfg=None, engine=None) -> Run:
    cfg = cfg or TrainConfig()
    return Run(
        cfg=cfg,
        run_dir=None,
        learner=learner,
        parts=SimpleNamespace(engine=engine, backend=backend, tokenizer=None),
        controller=StareController.from_config(cfg.algo.stare),
        sampler=PromptSampler([{"id": "a"}], seed=0),
        eval_problems=[],
        log=None,
    )


@pytest.mark.parametrize(
    ("rank", "backend_cls", "pushes"), [(0, SharedBackend, 1), (1, SharedBackend, 0), (1, OwnBackend, 1)]
)
def test_one_pusher_for_shared_servers_every_rank_for_its_own(rank, backend_cls, pushes):
    learner, backend = FakeLearner(rank=rank), backend_cls()
    sync_weights(_run(learner, backend))
    assert backend.pushes == pushes
    assert learner.exported == 1 and learner.reduces == 1  # every rank gathers and waits


def test_a_failed_push_stops_every_rank():
    with pytest.raises(RuntimeError, match="refused"):  # the pusher raises its own error
        sync_weights(_run(FakeLearner(rank=0), SharedBackend(fail=True)))
    with pytest.raises(RuntimeError, match="failed on rank 0"):  # the waiting rank learns of it
        sync_weights(_run(FakeLearner(rank=1, peer_sum=1.0), SharedBackend()))


class FakeEngine:
    configured = RolloutEngine.configured  # the real settings swap (collect_batch seeds each round)

    def __init__(self, batches):
        self.batches = list(batches)

    def run(self, problems, n):
        return self.batches.pop(0), {}


def _failed(group: int) -> Trajectory:
    t = Trajectory(
        prompt_ids=[1, 2],
        group_id=group,
        finish_reason="error",
        info={"error": "HTTPError: 400 unexpected sampling_params"},
    )
    t.append([5], [-0.5], "model")
    return t


def test_consecutive_empty_steps_stop_the_run_naming_the_cause():
    cfg = TrainConfig()
    cfg.trainer.prompts_per_step = 1
    cfg.trainer.max_empty_steps = 2
    cfg.rollout.n_per_prompt = 2
    engine = FakeEngine([[_failed(0), _failed(0)] for _ in range(cfg.algo.dynamic_sampling_rounds * 2)])
    engine.cfg = cfg.rollout
    run = _run(FakeLearner(world_size=1), None, cfg, engine)
    metrics = rl_step(run, 1)
    assert metrics["update/skipped_empty"] == 1.0 and run.empty_in_row == 1
    with pytest.raises(RuntimeError) as err:
        rl_step(run, 2)
    msg = str(err.value)
    assert "2 consecutive steps" in msg and "all rollouts failed" in msg
    assert "rollout_error=" in msg and "unexpected sampling_params" in msg


class ColocatedBackend(SharedBackend):
    """Records the order of memory and weight calls of a colocated SGLang server."""

    def __init__(self) -> None:
        super().__init__()
        self.cfg = type("Cfg", (), {"colocate": True})()
        self.calls: list = []

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release", tags))

    def resume_memory_occupation(self, tags=None):
        self.calls.append(("resume", tags))

    def update_weights(self, named):
        self.calls.append(("push", None))
        super().update_weights(named)


@pytest.mark.parametrize("rank", [0, 1])
def test_colocated_servers_release_for_the_learner_and_resume_weights_before_the_push(rank):
    learner, backend = FakeLearner(rank=rank), ColocatedBackend()
    run = _run(learner, backend)
    release_rollout_memory(run)
    sync_weights(run)
    resume_rollout_memory(run)
    want = [("release", None), ("resume", ["weights"]), ("push", None), ("resume", None)]
    assert backend.calls == (want if rank == 0 else [])  # rank 1 only waits
    assert learner.reduces == 3  # ... at a barrier after each phase
