"""Weights from the learner to the rollout backend, and colocated servers' memory around it."""

from __future__ import annotations

import torch

from stare_tir.trainer.run import Run


def sync_weights(run: Run) -> None:
    """Push the learner's weights to the rollout backend, with exactly one pusher per server.

    Every rank iterates `export_weights` (a collective under ZeRO-3). A backend of its own (HF,
    in process) is updated by each rank; servers shared by all ranks (SGLang) are updated by
    rank 0 alone while the others wait in the all-reduce below, which also carries rank 0's
    failure to every rank (no rank is left waiting on a push that died). No generation runs
    during a sync by construction: every rank has finished its rollouts of this step (they end
    inside `collect_batch`) before any rank reaches the update.
    """
    learner, backend = run.learner, run.backend
    pusher = backend is not None and (learner.rank == 0 or not getattr(backend, "shared_by_ranks", False))
    colocated = pusher and getattr(getattr(backend, "cfg", None), "colocate", False)
    error = None
    try:
        if colocated:
            backend.resume_memory_occupation(["weights"])  # KV cache stays free until after the push
        weights = learner.export_weights()
        if pusher:
            backend.update_weights(weights)
        else:
            for _ in weights:  # other ranks still take part in the gathers
                pass
    except Exception as exc:  # re-raised on this rank below, after telling the others
        error = exc
    failed = learner.all_reduce_sum(torch.tensor([float(error is not None)])).item()
    if error is not None:
        raise error
    if failed:
        raise RuntimeError("weight sync failed on rank 0 (see its log); stopping every rank")


def _on_pusher(run: Run, method: str) -> None:
    """Call `backend.<method>()` on the one rank that controls shared servers; others wait."""
    backend = run.backend
    if backend is None or not getattr(getattr(backend, "cfg", None), "colocate", False):
        return
    if run.learner.rank == 0:
        getattr(backend, method)()
    run.learner.all_reduce_sum(torch.zeros(1))  # the barrier: no rank runs ahead of the servers


def release_rollout_memory(run: Run) -> None:
    """Colocated layout (rollout.sglang.colocate): SGLang frees weights and KV cache on the
    shared GPUs before the learner recomputes and updates."""
    _on_pusher(run, "release_memory_occupation")


def resume_rollout_memory(run: Run) -> None:
    """Colocated layout: restore whatever is still released (the KV cache after a push; all of
    it when the step pushed nothing), before the next rollouts."""
    _on_pusher(run, "resume_memory_occupation")
