"""Weights from the learner to the rollout backend, and colocated servers' memory around it.

Every function here is collective: all ranks call it, in the same order. Servers shared by all
ranks (SGLang) are driven by rank 0 alone; a failure there is logged on rank 0 first, then
carried to every rank by an all-reduce, so every rank raises within the time of the failing call
(never the process-group timeout).

Weight version: the learner's count of applied optimizer steps (`steps_applied`). It names the
weights, not the push: a skipped update keeps it, a re-push of the same weights repeats it, and
a resumed run continues it (the learner's checkpoint holds it).
Every rank accepts the version being pushed before rank 0 starts the push (`accept_version`,
then one barrier): under asynchronous training the push pauses the servers mid-request and the
other ranks' requests resume on the new weights, answering with its version before those ranks
hear the push succeeded.

Colocated layout (rollout.sglang.colocate): the servers free their memory before the learner runs
(`release_rollout_memory`) and get it back only through a push (`sync_weights`: weights, push,
then KV cache), since released weights are undefined when resumed. `resume_rollout_memory` thus
pushes when the step did not. Which tags are released is kept in the run directory too
(`rollout_released.json`): a trainer restarted while the servers were released resumes exactly
those, and never resumes a tag that is not released (the scheduler raises on it).
"""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from loguru import logger

if TYPE_CHECKING:
    from stare_tir.trainer.run import Run

RELEASED_FILE = "rollout_released.json"


def weight_version(run: Run) -> str:
    return str(run.learner.steps_applied)


def agree(run: Run, error: BaseException | None, what: str) -> None:
    """Every rank learns whether any rank failed `what`; each raises (its own error, or one that
    points at rank 0's log). The failing rank logs its cause before anyone waits on it."""
    if error is not None:
        logger.opt(exception=error).error(f"{what} failed on rank {run.learner.rank}: {error}")
    failed = run.learner.all_reduce_sum(torch.tensor([float(error is not None)])).item()
    if error is not None:
        raise error
    if failed:
        raise RuntimeError(f"{what} failed on another rank (rank 0's log has the cause); stopping every rank")


def free_learner_memory() -> None:
    """Give cached learner memory back to the device before the servers take theirs again."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync_weights(run: Run) -> None:
    """Push the learner's weights to the rollout backend, with exactly one pusher per server.

    Every rank iterates `export_weights` to its end (a collective under ZeRO-3), also when the
    push failed part-way: the pusher then drains what is left, so the other ranks' all-gathers
    complete, and all meet in `agree`. A backend of its own (HF, in process) is updated by each
    rank. No generation runs during a sync: every rank has finished its rollouts of this step
    before any rank reaches the update.

    Colocated SGLang with tensor sync: every rank feeds rank 0's push through a relay (each
    serializes the bucket on its own GPU, rank 0 sends each TP rank the payload from its GPU;
    rollout/backends/sglang/relay.py). The relay stops every rank at the same bucket when any
    fails; a rank 0 failing before its first bucket still joins it (`finish`), so no rank is
    left in a gather.
    """
    learner, backend = run.learner, run.backend
    shared = backend.shared_by_ranks
    pusher = learner.rank == 0 or not shared
    version = weight_version(run)
    if shared and not pusher:
        # Under asynchronous training the push pauses the servers mid-request, and this rank's
        # requests resume on the new weights: it must accept their version before rank 0 pauses,
        # else it takes them for a restarted server's (a rollout error, and the same weights
        # pushed again). The barrier below orders every rank's acceptance before the push.
        backend.accept_version(version)
    if backend.colocated:
        free_learner_memory()
    if backend.colocated or (shared and learner.world_size > 1):
        learner.all_reduce_sum(torch.zeros(1))  # every rank's memory is free, its version accepted
    relay = backend.tensor_relay(learner) if shared and learner.world_size > 1 else None
    weights = learner.export_weights()
    error = None
    try:
        if pusher:
            if relay is not None:
                backend.update_weights(weights, version=version, relay=relay)
            else:
                backend.update_weights(weights, version=version)
        elif relay is not None:
            relay.run(weights, None)
    except Exception as exc:  # raised on every rank in `agree`, after the others are told
        error = exc
    finally:
        if relay is not None:
            relay.finish(weights)  # rank 0 failed before its first bucket: the others wait in it
        for _ in weights:  # the rest of the gathers, which the other ranks are waiting in
            pass
    agree(run, error, "weight sync")
    if shared and not pusher:
        backend.expect_version(version)
    run.rollout_released = False
    if learner.rank == 0 and backend.colocated:
        _write_released(run, {})


def release_rollout_memory(run: Run) -> None:
    """Colocated layout: the servers free weights, KV cache and CUDA graphs (once idle) before
    the learner recomputes and updates. From here on, only a push gives them memory back."""
    if not run.backend.colocated:
        return
    error = None
    if run.learner.rank == 0:
        try:
            run.backend.release_memory_occupation()
        except Exception as exc:
            error = exc
        finally:  # what was released, also when a later server failed
            _write_released(run, run.backend.released)
    agree(run, error, "releasing the rollout servers' memory")
    run.rollout_released = True


def resume_rollout_memory(run: Run) -> None:
    """Colocated layout: before the next rollouts, the servers hold the current weights and their
    memory. A step that pushed already resumed everything; one that did not (its update was
    skipped) pushes now: released weights come back undefined unless pushed again."""
    if run.backend.colocated and run.rollout_released:
        sync_weights(run)


def restore_release_state(run: Run) -> None:
    """At start: servers a previous trainer of this run directory released and never resumed
    are resumed by the first push (and only the tags it released). Colocated runs only."""
    if not run.backend.colocated:
        return
    released = _read_released(run) if run.learner.rank == 0 else {}
    if released:
        logger.warning(f"the rollout servers were left released by a previous trainer: {released}; resuming them")
        run.backend.adopt_released(released)
    run.rollout_released = bool(run.learner.all_reduce_sum(torch.tensor([float(bool(released))])).item())


def resync_stale_servers(run: Run) -> dict[str, float]:
    """Before a step's rollouts: a server that serves other weights than the last push (it
    restarted, and serves its start-up weights) gets the current weights again before it is
    used. Returns the step's metrics: servers found stale, answers discarded for their weights."""
    backend = run.backend
    if not backend.shared_by_ranks:
        return {}
    stale: list[str] = backend.stale_servers() if run.learner.rank == 0 else []
    answers = float(backend.take_stale_answers())
    counts = run.learner.all_reduce_sum(torch.tensor([float(len(stale)), answers], dtype=torch.float64))
    if counts[0] > 0 or counts[1] > 0:
        if stale:
            logger.warning(f"rollout servers {stale} serve other weights than version {backend.weight_version}")
        sync_weights(run)
    return {"weights/stale_servers": float(counts[0]), "weights/stale_answers": float(counts[1])}


def _released_path(run: Run) -> Path:
    return Path(run.run_dir) / RELEASED_FILE


def _read_released(run: Run) -> dict[str, list[str]]:
    path = _released_path(run)
    return json.loads(path.read_text()) if path.exists() else {}


def _write_released(run: Run, released: dict[str, list[str]]) -> None:
    path = _released_path(run)
    if not released:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(released))
    tmp.replace(path)  # atomic: a restart reads the old state or the new one
