"""Micro-batches for the learner: token-budget planning and right-padded tensors (pure, CPU).

Sequences (prompt + response) are right-padded into micro-batches whose padded size
(rows x longest row) stays within a token budget, longest first, so rows of similar length share
a micro-batch. With right padding and causal attention a real token never sees a pad, and
position ids are the plain 0..L-1 of each row. Each loss token (loss_mask == 1) is addressed by
(row, position of the hidden state that predicts it). The trainer also uses the plan for STARE's
micro_batch scope.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from torch import Tensor


def plan_micro_batches(lengths: Sequence[int], token_budget: int) -> list[list[int]]:
    """Group sequence indices into micro-batches with rows x longest <= token_budget.

    Longest first (stable for ties), greedy: similar lengths share a micro-batch, so padding stays
    small. A sequence longer than the budget is alone in its micro-batch. Deterministic.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    plan: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for i in order:
        new_max = max(cur_max, lengths[i])
        if cur and new_max * (len(cur) + 1) > token_budget:
            plan.append(cur)
            cur, cur_max = [], 0
            new_max = lengths[i]
        cur.append(i)
        cur_max = new_max
    if cur:
        plan.append(cur)
    return plan


def as_long_list(x: Any) -> list[int]:
    return x.tolist() if hasattr(x, "tolist") else list(x)  # tensor, array or list


@dataclass
class MicroBatch:
    """One right-padded micro-batch. Built on CPU, moved to the device before the forward."""

    input_ids: Tensor  # [B, L] long, pad id after each row's end
    attention_mask: Tensor  # [B, L] long, 1 on real tokens
    position_ids: Tensor  # [B, L] long, 0..L-1
    sel_rows: Tensor  # [N] long: row of each loss token
    sel_pos: Tensor  # [N] long: position whose hidden state predicts the loss token
    sel_resp: Tensor  # [N] long: index of the loss token inside its response
    targets: Tensor  # [N] long: the loss token ids
    mask: Tensor  # [B, R] float, 1 on loss tokens (R = longest response of the micro-batch)
    indices: list[int]  # positions of these rows in the caller's list
    num_tokens: int  # loss tokens N

    def to(self, device: Any) -> MicroBatch:
        moved = {k: (v if isinstance(v, (list, int)) else v.to(device)) for k, v in self.__dict__.items()}
        return MicroBatch(**moved)

    def per_token(self, values: Sequence[Any], default: float = 0.0) -> Tensor:
        """Per-row values (a float or a response-length vector) -> [B, R] float32 tensor."""
        import torch

        out = torch.full(self.mask.shape, float(default), dtype=torch.float32)  # [B, R]
        for row, i in enumerate(self.indices):
            v = values[i]
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out[row, : v.numel()] = v.detach().to(torch.float32).cpu()
            elif isinstance(v, (list, tuple)) or getattr(v, "ndim", 0) > 0:  # list or numpy vector
                t = torch.as_tensor(v, dtype=torch.float32)
                out[row, : t.numel()] = t
            else:
                out[row, :] = float(v)
        return out


def build_micro_batch(trajs: Sequence[Any], indices: list[int], pad_id: int) -> MicroBatch:
    import torch

    rows = []
    for i in indices:
        t = trajs[i]
        p, r, m = as_long_list(t.prompt_ids), as_long_list(t.response_ids), as_long_list(t.loss_mask)
        if not p:
            raise ValueError(f"trajectory {i}: empty prompt_ids (the first response token needs context)")
        if len(m) != len(r):
            raise ValueError(f"trajectory {i}: loss_mask has {len(m)} entries for {len(r)} response tokens")
        rows.append((p, r, m))
    b = len(rows)
    lmax = max(len(p) + len(r) for p, r, _ in rows)
    rmax = max(max(len(r) for _, r, _ in rows), 1)
    input_ids = torch.full((b, lmax), pad_id, dtype=torch.long)  # [B, L]
    attention_mask = torch.zeros((b, lmax), dtype=torch.long)  # [B, L]
    mask = torch.zeros((b, rmax), dtype=torch.float32)  # [B, R]
    sel_rows, sel_pos, sel_resp, targets = [], [], [], []
    for row, (p, r, m) in enumerate(rows):
        n = len(p) + len(r)
        input_ids[row, :n] = torch.tensor(p + r, dtype=torch.long)
        attention_mask[row, :n] = 1
        r_t = torch.tensor(r, dtype=torch.long)  # [r]
        js = torch.nonzero(torch.tensor(m, dtype=torch.bool)).squeeze(1)  # [n_loss] response indices
        mask[row, js] = 1.0
        sel_rows.append(torch.full_like(js, row))
        sel_pos.append(js + (len(p) - 1))  # the hidden state just before token j predicts it
        sel_resp.append(js)
        targets.append(r_t[js])
    position_ids = torch.arange(lmax, dtype=torch.long).expand(b, lmax).contiguous()  # [B, L]
    cat = lambda xs: torch.cat(xs).long()  # noqa: E731  [N]
    tgt = cat(targets)
    return MicroBatch(
        input_ids,
        attention_mask,
        position_ids,
        cat(sel_rows),
        cat(sel_pos),
        cat(sel_resp),
        tgt,
        mask,
        list(indices),
        int(tgt.numel()),
    )


def empty_micro_batch(pad_id: int) -> MicroBatch:
    """A 2-token, 1-target micro-batch whose loss is multiplied by 0: keeps collectives in step."""
    import torch

    z = torch.zeros(1, dtype=torch.long)
    return MicroBatch(
        input_ids=torch.full((1, 2), pad_id, dtype=torch.long),
        attention_mask=torch.ones(1, 2, dtype=torch.long),
        position_ids=torch.arange(2).view(1, 2),
        sel_rows=z,
        sel_pos=z.clone(),
        sel_resp=z.clone(),
        targets=torch.full((1,), pad_id, dtype=torch.long),
        mask=torch.zeros(1, 1),
        indices=[],
        num_tokens=0,
    )
