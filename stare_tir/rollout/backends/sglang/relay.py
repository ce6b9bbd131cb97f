"""Colocated tensor sync from every trainer rank: TP rank r of a server reads its weights from the
trainer rank on its own GPU, not from rank 0's.

What it mirrors: sglang python/sglang/srt/weight_sync/utils.py `update_weights`, which verl calls
per bucket on every rank of the inference TP mesh (volcengine/verl
verl/workers/rollout/sglang_rollout/sglang_rollout.py `update_weights`; the trainer process on GPU
r is that mesh's local rank r). Each rank serializes its own copy of the bucket
(`MultiprocessingSerializer`: CUDA-IPC handles on its GPU), `dist.gather_object` brings them to
the mesh's first rank, and that rank sends the request. Two differences:
- Upstream wraps every tensor in `LocalSerializedTensor(values=[one handle per TP rank])` and sends
  the same list to every TP rank; the model runner opens `values[tp_rank]`. Here payload
  `serialized_named_tensors[r]`, which only TP rank r opens (managers/tp_worker.py: each rank
  deserializes `serialized_named_tensors[self.tp_rank]`), is the payload of the trainer rank on TP
  rank r's GPU: the same effect with plain tensors (no sglang import in the trainer).
- Upstream's mesh makes trainer rank and TP rank coincide by construction. Here it is established
  (`map_sources`): trainer rank k reports the UUID of its CUDA device (cuda:LOCAL_RANK,
  `learner.distributed.cuda_device_index`), each server's TP rank r runs on the GPU that
  `devices.server_gpus` reads (base_gpu_id + r * gpu_id_step of the server's visible GPUs), and
  TP rank r's source is the trainer rank with that UUID. A colocated launch (torchrun
  --nproc_per_node N; a server --tp T --base-gpu-id b) puts trainer local rank g on GPU g, so
  TP rank r's source is local rank b + r. When any TP rank has no source (more TP ranks than
  trainer ranks on the node, a server on GPUs no trainer rank uses, a GPU that cannot be read, a
  learner on the CPU), every payload is rank 0's, as before, and one line says why.

The protocol, per bucket, on every rank in the same order (`TensorRelay.run`): serialize this
rank's payloads (one per TP rank it feeds: usually one; none for a rank whose GPU hosts no TP
rank) -> gather_object to rank 0 -> rank 0 POSTs every server's request, only when every rank
serialized -> all_reduce of a failure flag. The all_reduce keeps each rank's tensors, which its
handles point at, referenced until rank 0's POSTs have answered (the servers have copied from that
memory), and it stops every rank at the same bucket after any failure: a rank whose serialize
failed raises its own error, rank 0 raises the refusal (or names the rank that could not
serialize), the others return; then every rank drains `export_weights` and meets the others in
`weight_sync.agree`. Rank 0 failing before its first bucket (a refused session, resuming the
weights' memory) would leave the others in the first gather: `finish` joins that bucket with a
stop flag instead. After `run` or `finish` the relay is spent on that rank, so no rank enters the
protocol twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol

from stare_tir.rollout.backends._weights import buckets, serialize_named_tensors
from stare_tir.rollout.backends.sglang.devices import norm_uuid

if TYPE_CHECKING:
    import torch

    from stare_tir.rollout.backends.sglang.layout import ServerLayout


class Ranks(Protocol):
    """The trainer's collectives the relay needs (the learner has them)."""

    rank: int
    world_size: int

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor: ...

    def gather_object(self, obj: Any) -> list[Any] | None: ...


def this_gpu() -> str | None:
    """The UUID of this process's CUDA device (where the learner's tensors are); None on the CPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)


def map_sources(
    layouts: list[ServerLayout], rank_gpus: list[str | None], server_gpus: list[tuple[list[str] | None, str]]
) -> tuple[list[list[int]] | None, str]:
    """sources[i][r]: the trainer rank on the GPU of server i's TP rank r; or (None, why) when some
    TP rank has none (then rank 0 serializes every payload). rank_gpus: each trainer rank's GPU
    UUID (None: not on a GPU); server_gpus: `devices.server_gpus` of each server."""
    if all(g is None for g in rank_gpus):
        return None, "the learner's weights are not on a GPU"
    where = {norm_uuid(g): k for k, g in reversed(list(enumerate(rank_gpus))) if g is not None}
    sources = []
    for lay, (gpus, why) in zip(layouts, server_gpus):
        if gpus is None:
            return None, why
        row = []
        for r, gpu in enumerate(gpus):
            if norm_uuid(gpu) not in where:
                return None, (
                    f"{lay.url} TP rank {r} runs on GPU {gpu}, where no trainer rank runs "
                    f"({len(rank_gpus)} trainer ranks for tp {lay.tp_size})"
                )
            row.append(where[norm_uuid(gpu)])
        sources.append(row)
    return sources, ""


def plan_relay(
    ranks: Ranks,
    sources_of: Callable[[list[str | None]], list[list[int]] | None] | None,
    bucket_bytes: int,
) -> TensorRelay | None:
    """Collective: every rank reports its GPU, rank 0 maps the servers' TP ranks to trainer ranks
    (`sources_of`, given on rank 0 only; None: no mapping, it has said why), and every rank learns
    how many payloads it serializes per bucket. None on every rank when there is no mapping."""
    import torch

    try:
        mine = this_gpu()
    except Exception:  # noqa: BLE001 - an unreadable device is no mapping, never a failed sync
        mine = None
    gathered = ranks.gather_object(mine)
    counts = torch.zeros(ranks.world_size + 1, dtype=torch.float64)
    sources = None
    if ranks.rank == 0:
        assert sources_of is not None and gathered is not None
        sources = sources_of(gathered)
        if sources is not None:
            counts[0] = 1.0
            for row in sources:
                for k in row:
                    counts[k + 1] += 1.0
    agreed = ranks.all_reduce_sum(counts)
    if agreed[0].item() == 0:
        return None
    return TensorRelay(ranks, int(agreed[ranks.rank + 1].item()), sources, bucket_bytes)


class TensorRelay:
    """One sync's bucket protocol (module docstring). sources: rank 0's map (server -> TP rank ->
    trainer rank); mine: how many payloads this rank serializes per bucket."""

    def __init__(self, ranks: Ranks, mine: int, sources: list[list[int]] | None, bucket_bytes: int) -> None:
        self.ranks, self.mine, self.bucket_bytes = ranks, mine, bucket_bytes
        self.sources = sources
        # rank 0: server -> TP rank -> (trainer rank, which of its payloads): a rank feeding two
        # TP ranks (two servers on its GPU) serializes twice, each payload opened exactly once
        self.picks: list[list[tuple[int, int]]] = []
        used: dict[int, int] = {}
        for row in sources or []:
            picks = []
            for k in row:
                picks.append((k, used.get(k, 0)))
                used[k] = used.get(k, 0) + 1
            self.picks.append(picks)
        self.spent = False

    def run(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], post: Callable[[list[list[str]]], None] | None
    ) -> None:
        """Every rank: the protocol over `named_tensors` to its end or the first failure. Rank 0
        gives `post` (every server's payloads, in TP rank order; it raises on a refusal). Raises
        this rank's failure (rank 0: also another rank's failed serialize, naming it); returns
        when another rank failed (the caller's `agree` reports it)."""
        if self.ranks.rank == 0 and post is None:
            raise ValueError("rank 0 posts the payloads: give `post`")
        self._loop(named_tensors, post, stop=False)

    def finish(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """After a failure before `run` (rank 0): join the first bucket with a stop flag, so the
        ranks waiting in its gather stop there. Nothing when `run` already ran."""
        if not self.spent:
            self._loop(named_tensors, None, stop=True)

    def _loop(self, named_tensors: Iterable[tuple[str, torch.Tensor]], post: Callable | None, stop: bool) -> None:
        import torch

        self.spent = True  # never twice: a second pass would meet the others at a later bucket
        for index, (bucket, _last) in enumerate(buckets(named_tensors, self.bucket_bytes), 1):
            error: BaseException | None = None
            status: tuple[str, Any] = ("stop", None)
            if not stop:
                try:
                    status = ("ok", [serialize_named_tensors(bucket) for _ in range(self.mine)])
                except Exception as exc:  # noqa: BLE001 - carried to every rank below
                    error, status = exc, ("error", f"{type(exc).__name__}: {exc}")
            gathered = self.ranks.gather_object(status)
            if self.ranks.rank == 0 and error is None and not stop:
                error = self._post(gathered, post, index)
            # the keep-alive and the stop: this rank's bucket (its handles' memory) is held until
            # every server has answered this bucket's POST
            failed = self.ranks.all_reduce_sum(torch.tensor([float(error is not None or stop)]))
            if failed.item() > 0:
                if error is not None:
                    raise error
                return

    def _post(self, gathered: list[Any] | None, post: Callable | None, index: int) -> BaseException | None:
        assert gathered is not None and post is not None
        for k, (kind, what) in enumerate(gathered):
            if kind != "ok":
                return RuntimeError(f"trainer rank {k} could not serialize weight bucket {index}: {what}")
        try:
            post([[gathered[k][1][j] for k, j in picks] for picks in self.picks])
        except Exception as exc:  # noqa: BLE001 - carried to every rank by the caller
            return exc
        return None
