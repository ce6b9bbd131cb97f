"""Weight sync and empty-step guards of the RL loop, with small fakes (no processes, no servers).

The same rules under `torchrun` against SGLang stand-ins: test_sglang_two_ranks.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stare_tir.data import PromptSampler
from stare_tir.rollout.backends.base import BackendBase
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
from stare_tir.trainer.weight_sync import restore_release_state, resync_stale_servers


class NullBackend(BackendBase):
    """A backend of the rank's own that takes every push and generates nothing."""

    def update_weights(self, named_tensors, version=None) -> None:
        for _ in named_tensors:
            pass


class FakeLearner:
    """Collective helpers of one rank of a `world_size` run; all_reduce adds `peer_sum` (what the
    other ranks contribute) to this rank's value. `export_weights` counts the tensors taken from
    it, as a ZeRO-3 export counts its all-gathers (every rank must take all of them)."""

    def __init__(self, rank: int = 0, world_size: int = 2, peer_sum: float = 0.0, n_weights: int = 4) -> None:
        self.rank, self.world_size, self.peer_sum = rank, world_size, peer_sum
        self.reduces = 0
        self.exported = 0
        self.gathered = 0
        self.n_weights = n_weights
        self.steps_applied = 3

    def all_reduce_sum(self, x):
        self.reduces += 1
        return x + self.peer_sum

    def shard(self, items):
        return list(items)

    def export_weights(self):
        self.exported += 1
        for i in range(self.n_weights):
            self.gathered += 1  # one all-gather per parameter under ZeRO-3
            yield f"w{i}", torch.zeros(2)


class SharedBackend(BackendBase):
    """Servers shared by all ranks (like SGLang): only one rank may push. `fail_after`: the push
    raises after taking that many tensors (a refused bucket)."""

    shared_by_ranks = True

    def __init__(self, fail_after: int | None = None) -> None:
        self.pushes, self.fail_after = 0, fail_after
        self.versions: list = []
        self.expected = None
        self.accepted = None
        self.learner = None  # set by tests that check when the version was accepted

    def update_weights(self, named, version=None):
        for i, _ in enumerate(named):
            if self.fail_after is not None and i + 1 >= self.fail_after:
                raise RuntimeError("server refused the update")
        self.pushes += 1
        self.versions.append(version)

    def expect_version(self, version):
        self.expected = version

    def accept_version(self, version):
        self.accepted = (version, self.learner.reduces if self.learner else None)


class OwnBackend(SharedBackend):
    """A backend inside each rank's process (like HF): every rank updates its own."""

    shared_by_ranks = False


def _run(learner, backend, cfg=None, engine=None, run_dir=None) -> Run:
    cfg = cfg or TrainConfig()
    return Run(
        cfg=cfg,
        run_dir=run_dir,
        learner=learner,
        parts=SimpleNamespace(engine=engine, backend=backend, tokenizer=None),
        sampler=PromptSampler([{"id": "a"}], seed=0),
        eval_problems=[],
        log=None,
    )


@pytest.mark.parametrize(
    ("rank", "backend_cls", "pushes"), [(0, SharedBackend, 1), (1, SharedBackend, 0), (1, OwnBackend, 1)]
)
def test_one_pusher_for_shared_servers_every_rank_for_its_own(rank, backend_cls, pushes):
    learner, backend = FakeLearner(rank=rank), backend_cls()
    backend.learner = learner
    sync_weights(_run(learner, backend))
    assert backend.pushes == pushes
    shared = backend_cls is SharedBackend
    assert learner.exported == 1 and learner.reduces == 1 + shared  # every rank gathers and waits
    # a non-pushing rank accepts the version before the barrier that lets rank 0 push (and pause)
    assert backend.accepted == (("3", 0) if rank == 1 and shared else None)
    assert learner.gathered == learner.n_weights
    # the version names the weights (the learner's applied steps): pushed, or expected from rank 0
    assert backend.versions == ["3"] * pushes
    assert backend.expected == ("3" if rank == 1 and backend_cls is SharedBackend else None)


def test_a_failed_push_stops_every_rank_after_draining_the_export():
    """The pusher fails after the first tensor: it must still take every remaining tensor (under
    ZeRO-3 each is an all-gather the other ranks are waiting in), then every rank raises."""
    learner = FakeLearner(rank=0, n_weights=5)
    with pytest.raises(RuntimeError, match="refused"):  # the pusher raises its own error
        sync_weights(_run(learner, SharedBackend(fail_after=1)))
    assert learner.gathered == 5 and learner.reduces == 2  # drained, then met the others
    waiting = FakeLearner(rank=1, peer_sum=1.0, n_weights=5)
    with pytest.raises(RuntimeError, match="failed on another rank"):  # the waiting rank learns of it
        sync_weights(_run(waiting, SharedBackend()))
    assert waiting.gathered == 5


def test_a_push_failing_before_it_starts_still_drains():
    """A push refused before any tensor is taken (a refused session, a failed group init, a
    foreign file in sync_dir): the export is still taken to its end."""

    class Refusing(SharedBackend):
        def update_weights(self, named, version=None):
            raise ValueError("begin_weight_update refused")

    learner = FakeLearner(rank=0, n_weights=3)
    with pytest.raises(ValueError, match="begin_weight_update"):
        sync_weights(_run(learner, Refusing()))
    assert learner.gathered == 3


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
    run = _run(FakeLearner(world_size=1), NullBackend(), cfg, engine)
    metrics = rl_step(run, 1)
    assert metrics["update/skipped_empty"] == 1.0 and run.empty_in_row == 1
    with pytest.raises(RuntimeError) as err:
        rl_step(run, 2)
    msg = str(err.value)
    assert "2 consecutive steps" in msg and "all rollouts failed" in msg
    assert "rollout_error=" in msg and "unexpected sampling_params" in msg


class ColocatedBackend(SharedBackend):
    """Records the order of memory and weight calls of a colocated SGLang server."""

    colocated = True

    def __init__(self) -> None:
        super().__init__()
        self.calls: list = []
        self._released: dict = {}

    @property
    def released(self):
        return {u: sorted(t) for u, t in self._released.items() if t}

    def adopt_released(self, released):
        self.calls.append(("adopt", released))
        self._released = {u: set(t) for u, t in released.items()}

    def release_memory_occupation(self, tags=None):
        self.calls.append(("release", tags))
        self._released = {"http://s": {"weights", "kv_cache", "cuda_graph"}}

    def update_weights(self, named, version=None):
        self.calls.append(("push", version))  # the real backend resumes weights, pushes, resumes the rest
        self._released = {}
        super().update_weights(named, version)


@pytest.mark.parametrize("rank", [0, 1])
def test_colocated_release_then_push_then_nothing_left_to_resume(rank, tmp_path):
    learner, backend = FakeLearner(rank=rank), ColocatedBackend()
    run = _run(learner, backend, run_dir=tmp_path)
    release_rollout_memory(run)
    assert run.rollout_released
    assert (tmp_path / "rollout_released.json").exists() == (rank == 0)  # a restart can resume it
    sync_weights(run)
    resume_rollout_memory(run)  # the push resumed everything: no second push
    assert backend.calls == ([("release", None), ("push", "3")] if rank == 0 else [])
    assert not run.rollout_released and not (tmp_path / "rollout_released.json").exists()
    assert learner.gathered == learner.n_weights  # rank 1 took part in the export


def test_colocated_step_that_pushed_nothing_pushes_before_the_servers_resume(tmp_path):
    """A skipped update (non-finite) pushes nothing, but the servers' weights were released:
    without a push they would resume undefined memory. resume_rollout_memory pushes them."""
    learner, backend = FakeLearner(rank=0), ColocatedBackend()
    run = _run(learner, backend, run_dir=tmp_path)
    release_rollout_memory(run)
    resume_rollout_memory(run)  # no sync_weights in between
    assert backend.calls == [("release", None), ("push", "3")]


def test_a_restarted_trainer_resumes_what_its_predecessor_released(tmp_path):
    first = _run(FakeLearner(rank=0), ColocatedBackend(), run_dir=tmp_path)
    release_rollout_memory(first)  # ... and the trainer dies here
    backend = ColocatedBackend()
    run = _run(FakeLearner(rank=0), backend, run_dir=tmp_path)
    restore_release_state(run)
    assert run.rollout_released
    assert backend.calls == [("adopt", {"http://s": ["cuda_graph", "kv_cache", "weights"]})]
    sync_weights(run)  # the first push resumes exactly those tags
    assert not (tmp_path / "rollout_released.json").exists()
    fresh = ColocatedBackend()
    restore_release_state(_run(FakeLearner(rank=0), fresh, run_dir=tmp_path))
    assert fresh.calls == []  # nothing left released: nothing is resumed (that would kill a server)


def test_stale_servers_get_the_weights_again_before_the_step():
    class Restarted(SharedBackend):
        weight_version = "3"
        stale = 2

        def take_stale_answers(self):
            n, self.stale = self.stale, 0
            return n

        def stale_servers(self):
            return ["http://a"] if self.pushes == 0 else []

    learner, backend = FakeLearner(rank=0), Restarted()
    metrics = resync_stale_servers(_run(learner, backend))
    assert backend.pushes == 1 and metrics == {"weights/stale_servers": 1.0, "weights/stale_answers": 2.0}
    assert resync_stale_servers(_run(learner, backend)) == {"weights/stale_servers": 0.0, "weights/stale_answers": 0.0}
    assert backend.pushes == 1  # nothing stale: nothing pushed


def test_checkpoint_keeps_the_empty_step_count(tmp_path):
    """trainer.max_empty_steps counts across a resume (it was reset to 0 by every resume)."""
    from stare_tir.trainer.checkpoint import resume_from, save_checkpoint

    class CkptLearner(FakeLearner):
        def save_checkpoint(self, path, client_state):
            path.mkdir(parents=True)
            self.saved = client_state

        def load_checkpoint(self, path):
            return self.saved

    cfg = TrainConfig()
    learner = CkptLearner(rank=0, world_size=1)
    run = _run(learner, NullBackend(), cfg, run_dir=tmp_path)
    run.log = SimpleNamespace(truncate_after=lambda step: None)
    run.empty_in_row = 2
    save_checkpoint(run, 5)
    run.empty_in_row = 0
    resume_from(run, tmp_path / "checkpoints" / "step_000005")
    assert run.empty_in_row == 2 and run.step == 5


def test_checkpoint_restores_stares_controller_and_eapos_initial_entropy(tmp_path):
    """The token methods' state comes back from a checkpoint exactly: STARE's gate, W and M under the
    adaptive schedule, EAPO's initial entropy; also from a checkpoint written before each method kept
    its own (one `controller` entry), and into a method built only after the resume."""
    from stare_tir.config import load_config
    from stare_tir.trainer.checkpoint import resume_from, save_checkpoint

    class CkptLearner(FakeLearner):
        def save_checkpoint(self, path, client_state):
            path.mkdir(parents=True, exist_ok=True)
            self.saved = client_state

        def load_checkpoint(self, path):
            return self.saved

    overrides = ["algo.name=stare", "algo.token_methods=[eapo]", "algo.stare.adaptive=true"]
    cfg = load_config(TrainConfig, None, [*overrides, "algo.stare.adapt_rate=0.05", "algo.stare.variant=C2"])
    assert cfg.algo.token_methods == ["eapo", "stare"]  # STARE on top of the listed methods
    learner = CkptLearner(rank=0, world_size=1)

    def run_of():
        run = _run(learner, NullBackend(), cfg, run_dir=tmp_path)
        run.log = SimpleNamespace(truncate_after=lambda step: None)
        return run

    def observe(run, h):
        run.methods.observe(cfg.algo.token_methods, cfg.algo.methods, h)

    run = run_of()
    for h in (0.8, 0.1, 0.2):  # above the target (W down, M up), then below twice
        observe(run, h)
    stare, eapo = run.methods.get("stare"), run.methods.get("eapo")
    expected = stare.state_dict()
    assert expected["gate_on"] and expected["steps"] == 3 and eapo.initial_entropy == 0.8
    assert (stare.controller.w, stare.controller.m) == (pytest.approx(1.15), pytest.approx(0.85))
    save_checkpoint(run, 3)
    path = tmp_path / "checkpoints" / "step_000003"

    fresh = run_of()  # a new process: the methods built from the config before the resume
    fresh.methods.resolve(cfg.algo.token_methods, cfg.algo.methods)
    resume_from(fresh, path)
    assert fresh.methods.get("stare").state_dict() == expected
    assert fresh.methods.get("eapo").initial_entropy == 0.8
    observe(run, 0.5)
    observe(fresh, 0.5)  # and it goes on exactly as the uninterrupted one
    assert fresh.methods.state_dict() == run.methods.state_dict()

    old = {k: v for k, v in learner.saved.items() if k != "methods"}
    learner.saved = {**old, "controller": {**expected, "initial_entropy": 0.8}}  # today's older layout
    older = run_of()
    resume_from(older, path)  # the methods are built after it, on first use
    assert older.methods.get("stare", cfg.algo.stare).state_dict() == expected
    assert older.methods.get("eapo", cfg.algo.methods["eapo"]).initial_entropy == 0.8
