"""A token method, an advantage estimator and a policy loss of one's own: a plugin.

    stare-train --plugin docs/examples/my_methods.py algo.name=my_pos_scale algo.my_pos_scale.scale=1.5
    stare-train --plugin docs/examples/my_methods.py algo.advantage=rank algo.policy_loss=plain_pg

Each is a plain function registered under a name where it is defined; importing this file (the
`--plugin` flag, or `plugins: [docs/examples/my_methods.py]` in a config) is all it takes. torch is
imported inside the functions, so reading the names (config validation, `--help`) stays light.
"""

from __future__ import annotations

from dataclasses import dataclass

from stare_tir.algos.advantage import ADVANTAGE_ESTIMATORS
from stare_tir.algos.policy_loss import POLICY_LOSSES, LossInputs, aggregate
from stare_tir.algos.token_methods import TOKEN_METHODS, TokenEffect, TokenInputs


@dataclass
class MyPosScaleConfig:
    # Factor on the advantage of every token of a trajectory with a positive advantage
    # (1 leaves the update unchanged). Settings are `algo.my_pos_scale.*`, listed by --help.
    scale: float = 2.0

    def __post_init__(self) -> None:
        if self.scale <= 0:
            raise ValueError(f"scale={self.scale!r}: must be > 0")


@TOKEN_METHODS.register("my_pos_scale", config=MyPosScaleConfig)
def my_pos_scale(t: TokenInputs, cfg: MyPosScaleConfig) -> TokenEffect:
    """Scale positive advantages by a constant: A' = scale * A where A > 0."""
    positive = t.advantages > 0  # [N]
    scaled = t.advantages * (1.0 + (cfg.scale - 1.0) * positive.to(t.advantages.dtype))  # [N]
    return TokenEffect(selected=positive, advantages=scaled)


@ADVANTAGE_ESTIMATORS.register("rank")
def rank_advantages(rewards, group_ids):
    """Each trajectory's reward rank inside its group, centred and scaled to [-1, 1] (ties share
    their mean rank); a group of equal rewards gets 0. rewards, group_ids: [N]."""
    import torch

    adv = torch.zeros_like(rewards, dtype=torch.float32)  # [N]
    for g in torch.unique(group_ids):
        idx = torch.nonzero(group_ids == g).squeeze(1)
        r = rewards[idx].float()
        below = (r[None, :] < r[:, None]).sum(1).float()  # [n] rewards strictly below each
        equal = (r[None, :] == r[:, None]).sum(1).float()
        rank = below + (equal - 1) / 2  # mean rank of ties, 0 .. n-1
        n = idx.numel()
        adv[idx] = (2 * rank / (n - 1) - 1) if n > 1 else 0.0
    return adv, {"adv/rank_groups": float(torch.unique(group_ids).numel())}


@POLICY_LOSSES.register("plain_pg")
def plain_pg_loss(x: LossInputs):
    """The unclipped policy gradient -A * rho (rho = pi / pi_old), token weights applied,
    aggregated as algo.loss_agg says. x: per-token tensors [B, T]."""
    import torch

    ratio = torch.exp((x.logprobs - x.old_logprobs.detach()).clamp(-20.0, 20.0))  # [B, T]
    loss_tok = -x.advantages.detach() * ratio
    if x.token_weights is not None:
        loss_tok = loss_tok * x.token_weights.detach()
    loss = aggregate(loss_tok, x.mask, x.agg, x.global_tokens, x.global_seqs)
    return loss, {"loss/plain_pg": float(loss.detach())}
