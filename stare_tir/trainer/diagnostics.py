"""Entropy diagnostics of one RL step: where the batch entropy sits, and what the update did to it.

Two questions a batch-mean entropy curve cannot answer on its own:
- Is the curve a change of mode or a change inside a mode? On a tool task the responses that call
  the tool and those that answer directly can sit at very different entropies, so the batch mean
  moves when the share of tool responses moves, even if neither mode's own entropy does.
  `entropy_by_tool_use` splits the token-mean by that.
- What did this step's update change? `entropy_after_update` recomputes the batch's entropy with
  the updated weights (one no-grad pass over the same tokens), so the update's own entropy change
  is measured on the same tokens rather than inferred from the next step's fresh rollouts. That
  pass costs about a tenth of a CPU step: it runs every trainer.diagnostics_every steps (off by
  default), timed as time/diagnostics.

Both reduce over all ranks (every rank must call them, with its own share of the batch).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def _entropy_sums(trajs: Sequence[Any], entropies: Sequence[torch.Tensor], keep: Sequence[bool]) -> torch.Tensor:
    """[sum of entropy, model-token count] over the trajectories with keep[i] true (this rank)."""
    total = torch.zeros(2, dtype=torch.float64)
    for t, ent, k in zip(trajs, entropies, keep):
        if not k:
            continue
        mask = torch.tensor(t.loss_mask, dtype=torch.float64)  # [T]
        total[0] += float((ent.double() * mask).sum())
        total[1] += float(mask.sum())
    return total


def entropy_by_tool_use(learner: Any, trajs: Sequence[Any], entropies: Sequence[torch.Tensor]) -> dict:
    """Token-mean entropy of responses with a tool call and of those without, and the share of
    model tokens written in responses with a tool call (the mix that gives the batch entropy:
    H_batch = frac * H_tool + (1 - frac) * H_direct). A side with no token is None."""
    tool = [t.tool_calls > 0 for t in trajs]
    sums = torch.cat(
        [_entropy_sums(trajs, entropies, tool), _entropy_sums(trajs, entropies, [not k for k in tool])]
    )  # [tool sum, tool count, direct sum, direct count]
    sums = learner.all_reduce_sum(sums)
    n = float(sums[1] + sums[3])
    return {
        "entropy/tool_responses": float(sums[0] / sums[1]) if sums[1] > 0 else None,
        "entropy/direct_responses": float(sums[2] / sums[3]) if sums[3] > 0 else None,
        "entropy/tool_token_frac": float(sums[1]) / n if n > 0 else None,
    }


def entropy_after_update(learner: Any, trajs: Sequence[Any], entropy_before: float) -> dict:
    """The batch's token-mean entropy under the updated weights (one no-grad pass over the same
    tokens) and its change from `entropy_before` (the recompute pass of this step)."""
    _, entropies = learner.compute_logprobs_entropy(trajs)
    total = learner.all_reduce_sum(_entropy_sums(trajs, entropies, [True] * len(trajs)))
    after = float(total[0] / total[1].clamp(min=1))
    return {"entropy/after_update": after, "entropy/update_change": after - entropy_before}
