"""Collectives over the learner's ranks: what the trainer and the weight sync exchange between
ranks (sums, maxima, variable-length gathers, pickled objects). `Learner` inherits them; they use
its `rank`, `world_size` and `device`, and are the identity with one process."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:  # torch is imported where used: the learner package stays light to import
    from torch import Tensor


class RankCollectives:
    rank: int
    world_size: int
    device: Any

    def all_reduce_sum(self, x: Tensor) -> Tensor:
        """Sum a tensor over ranks (returns a new CPU tensor; identity with one process)."""
        import torch.distributed as dist

        y = x.detach().to(self.device, copy=True)
        if self.world_size > 1:
            dist.all_reduce(y, op=dist.ReduceOp.SUM)
        return y.cpu()

    def all_reduce_max(self, x: Tensor) -> Tensor:
        import torch.distributed as dist

        y = x.detach().to(self.device, copy=True)
        if self.world_size > 1:
            dist.all_reduce(y, op=dist.ReduceOp.MAX)
        return y.cpu()

    def gather_object(self, obj: Any) -> list[Any] | None:
        """Every rank's picklable `obj` on rank 0, in rank order; None on the other ranks. Under
        NCCL the pickles travel through this rank's GPU (torch.distributed `gather_object`)."""
        import torch.distributed as dist

        if self.world_size == 1:
            return [obj]
        out: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0)
        return out

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj` on every rank, in rank order ([obj] with one process). Under
        NCCL the pickles travel through this rank's GPU (torch.distributed `all_gather_object`)."""
        import torch.distributed as dist

        if self.world_size == 1:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def all_gather_flat(self, x: Tensor) -> tuple[Tensor, slice]:
        """Concatenate every rank's 1-D tensor (lengths may differ), in rank order.

        Returns (global vector on CPU, the slice of it that is this rank's `x`). Used for STARE's
        batch scope: select over all response tokens of the step, keep this rank's slice.
        """
        import torch
        import torch.distributed as dist

        x = x.detach().reshape(-1)
        if self.world_size == 1:
            return x.cpu().clone(), slice(0, x.numel())
        n = torch.tensor([x.numel()], dtype=torch.long, device=self.device)
        sizes = [torch.zeros_like(n) for _ in range(self.world_size)]
        dist.all_gather(sizes, n)
        sizes_l = [int(s.item()) for s in sizes]
        buf = torch.zeros(max(sizes_l), dtype=x.dtype, device=self.device)  # pad to the longest
        buf[: x.numel()] = x.to(self.device)
        parts = [torch.empty_like(buf) for _ in range(self.world_size)]
        dist.all_gather(parts, buf)
        out = torch.cat([p[:s] for p, s in zip(parts, sizes_l)]).cpu()
        start = sum(sizes_l[: self.rank])
        return out, slice(start, start + sizes_l[self.rank])

    def shard(self, items: Sequence[Any]) -> list[Any]:
        """This rank's share of a list every rank holds in full (round robin)."""
        return list(items[self.rank :: self.world_size])

    # ------------------------------------------------------------------ micro-batches
