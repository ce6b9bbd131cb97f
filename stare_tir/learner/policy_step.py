"""The policy loss of one update micro-batch, and the forward's values per trajectory (pure, torch).

`policy_loss_fn` turns `Learner.train_step`'s per-trajectory arguments into the function the
optimizer step calls on each micro-batch's log-probs; `scatter_rows` turns a micro-batch's per-token
log-probs and entropies back into one tensor per trajectory (the recompute pass's layout, and the
update forward's own values when the recompute pass is skipped).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

from stare_tir.learner.micro_batch import MicroBatch, as_long_list, build_micro_batch

if TYPE_CHECKING:
    from torch import Tensor

    from stare_tir.algos.policy_loss import Clip, LossInputs


def policy_loss_fn(
    device: Any,
    trajs: Sequence[Any],
    advantages: Sequence[float | Tensor],
    token_weights: Sequence[Tensor] | None,
    old_logprobs: Sequence[Tensor] | None,
    clip: Clip | None,
    loss_agg: str,
    tis_cap: float | None,
    loss_fn: Callable[[LossInputs], tuple[Tensor, dict]] | None,
    terms: dict[str, Sequence[Tensor]] | None,
) -> Callable[..., tuple[Tensor, dict]]:
    """The per-micro-batch policy loss of `Learner.train_step`'s arguments (checked against len(trajs)):
    (micro-batch, its log-probs [N], global token and sequence counts) -> (loss, metrics)."""
    import torch

    from stare_tir.algos.policy_loss import Clip, LossInputs, clip_loss, truncated_is_weights

    pg_loss = loss_fn if loss_fn is not None else clip_loss
    clip = clip if clip is not None else Clip()
    n = len(trajs)
    named = (
        ("advantages", advantages),
        ("token_weights", token_weights),
        ("old_logprobs", old_logprobs),
        *((f"terms[{name!r}]", v) for name, v in (terms or {}).items()),
    )
    for name, v in named:
        if v is not None and len(v) != n:
            raise ValueError(f"{name}: {len(v)} entries for {n} trajectories")
    rollout_lp = [t.rollout_logprobs for t in trajs] if tis_cap is not None else None

    def mb_loss(mb: MicroBatch, logp: Tensor, denom_tok: float, denom_seq: float) -> tuple[Tensor, dict]:
        lp = torch.zeros(mb.mask.shape, dtype=torch.float32, device=device)  # [B, R]
        lp = lp.index_put((mb.sel_rows, mb.sel_resp), logp.float())
        mask = mb.mask
        old = mb.per_token(old_logprobs).to(device) if old_logprobs is not None else lp.detach()
        tis = None
        if rollout_lp is not None:
            tis = truncated_is_weights(old, mb.per_token(rollout_lp).to(device), mask, tis_cap)
        return pg_loss(
            LossInputs(
                logprobs=lp,
                old_logprobs=old,
                advantages=mb.per_token(advantages).to(device) * mask,
                mask=mask,
                clip=clip,
                token_weights=mb.per_token(token_weights, 1.0).to(device) if token_weights is not None else None,
                tis_weights=tis,
                terms={name: mb.per_token(v).to(device) for name, v in (terms or {}).items()},
                agg=loss_agg,
                global_tokens=denom_tok,
                global_seqs=denom_seq,
            )
        )

    return mb_loss


def scatter_rows(mb: MicroBatch, trajs: Sequence[Any], lp: Tensor, ent: Tensor, logps: list, ents: list) -> None:
    """A micro-batch's per-token log-probs and entropies [N] -> per trajectory (float32, CPU, one
    value per response token, 0.0 where loss_mask == 0) into logps[i] and ents[i]."""
    import torch

    idx = (mb.sel_rows.cpu(), mb.sel_resp.cpu())
    lp_rows = torch.zeros(mb.mask.shape).index_put(idx, lp.detach().float().cpu())  # [B, R]
    ent_rows = torch.zeros(mb.mask.shape).index_put(idx, ent.detach().float().cpu())  # [B, R]
    for row, i in enumerate(mb.indices):
        n = len(as_long_list(trajs[i].response_ids))
        logps[i], ents[i] = lp_rows[row, :n].clone(), ent_rows[row, :n].clone()


def narrow_forward(mb: MicroBatch, logp: Tensor, trajs: Sequence[Any], pad_id: int) -> tuple[MicroBatch, Tensor]:
    """The micro-batch of `trajs` (the same rows, loss masks possibly narrowed by shaping) and the
    forward's log-probs [N] at its selected tokens [N'] (N' <= N); unchanged when nothing is selected."""
    import torch

    if not mb.indices:
        return mb, logp
    new = build_micro_batch(trajs, mb.indices, pad_id)
    rows = torch.zeros(mb.mask.shape, dtype=logp.dtype, device=logp.device)  # [B, R]
    rows = rows.index_put((mb.sel_rows.to(logp.device), mb.sel_resp.to(logp.device)), logp)
    return new, rows[new.sel_rows.to(logp.device), new.sel_resp.to(logp.device)]  # [N']
