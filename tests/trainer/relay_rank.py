"""One trainer rank of test_sglang_relay_two_ranks.py: `sync_weights` of a colocated tensor sync
against a stand-in server, over a 2-process gloo group.

Real: `sync_weights`, `SGLangBackend` (its relay, push, sessions, flush, memory calls), the
learner's own collectives (`Learner.all_reduce_sum`, `Learner.gather_object`), the server's GPUs
as read from its process (/proc). Stood in: the learner's weights, which differ per rank here
(100 * rank + index) so the server can tell which rank serialized what (real ranks hold equal
weights), and this rank's GPU UUID (`relay.this_gpu`; CPU tensors travel by value, so only
provenance is observable on CPU).

Run: python relay_rank.py RANK PORT URL SCENARIO OUT_JSON RUN_DIR GPU_OF_RANK_0,GPU_OF_RANK_1
Scenarios: push (no fault), serialize_fails (rank 1's 2nd serialize raises), early_failure (rank
0 fails before its first bucket). The test sets server-side faults itself.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

N_WEIGHTS = 8
NUMEL = 4096  # 16 KB per tensor: two per bucket at BUCKET_MB
BUCKET_MB = 0.035


def weight(rank: int, index: int):
    import torch

    return torch.full((NUMEL,), float(100 * rank + index))


class RankLearner:
    """The learner's collectives (its own methods) around rank-dependent weights."""

    from stare_tir.learner.learner import Learner

    all_reduce_sum = Learner.all_reduce_sum
    gather_object = Learner.gather_object

    def __init__(self, rank: int, world_size: int) -> None:
        import torch

        self.rank, self.world_size = rank, world_size
        self.device = torch.device("cpu")
        self.steps_applied = 1
        self.exported = 0

    def export_weights(self):
        for i in range(N_WEIGHTS):
            self.exported += 1
            yield f"w{i}", weight(self.rank, i)


def main() -> None:
    rank, port, url, scenario, out, run_dir, gpus = sys.argv[1:8]
    rank, port = int(rank), int(port)
    import torch.distributed as dist

    from stare_tir.data import PromptSampler
    from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig
    from stare_tir.rollout.backends.sglang import relay as relay_mod
    from stare_tir.trainer import Run, TrainConfig, sync_weights

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=120)
    )
    relay_mod.this_gpu = lambda: gpus.split(",")[rank]  # this rank's GPU, as torch would report it
    if scenario == "serialize_fails" and rank == 1:
        real, calls = relay_mod.serialize_named_tensors, []

        def failing(bucket):
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("injected serialize failure on rank 1")
            return real(bucket)

        relay_mod.serialize_named_tensors = failing
    backend = SGLangBackend(
        [url], SGLangConfig(urls=[url], colocate=True, weight_sync="tensor", bucket_mb=BUCKET_MB, timeout_s=30)
    )
    if scenario == "early_failure" and rank == 0:

        def refused(tags=None):
            raise RuntimeError("injected: resuming the weights' memory failed")

        backend.resume_memory_occupation = refused
    learner = RankLearner(rank, 2)
    cfg = TrainConfig()
    run = Run(
        cfg=cfg,
        run_dir=Path(run_dir),
        learner=learner,
        parts=SimpleNamespace(engine=None, backend=backend, tokenizer=None),
        sampler=PromptSampler([{"id": "a"}], seed=0),
        eval_problems=[],
        log=None,
    )
    t0 = time.monotonic()
    error = None
    try:
        sync_weights(run)
    except Exception as exc:  # noqa: BLE001 - reported to the test
        error = f"{type(exc).__name__}: {exc}"
    result = {"error": error, "elapsed_s": time.monotonic() - t0, "exported": learner.exported}
    Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
