"""Parts of the learner that need no engine: the module DeepSpeed wraps, the LR schedule."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from torch import Tensor, nn


def token_logprob_model(lm: nn.Module, temperature: float, chunk_size: int) -> nn.Module:
    """Wrap a causal LM as a module returning log pi(target) (and entropy) at selected positions.

    Full logits are never formed. Wrapping lets the lm_head weight be used outside
    lm_head.forward() while ZeRO-3 still gathers it (registered as an external parameter of this
    module) and reduces its gradient.
    """
    from torch import nn

    from stare_tir.algos.logprobs import logprobs_and_entropy

    class TokenLogprobModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(
            self,
            input_ids: Tensor,
            attention_mask: Tensor,
            position_ids: Tensor,
            sel_rows: Tensor,
            sel_pos: Tensor,
            targets: Tensor,
            with_entropy: bool = False,
        ) -> tuple[Tensor, Tensor | None]:
            out = self.lm.base_model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
            )
            hidden = out.last_hidden_state[sel_rows, sel_pos]  # [N, H]
            head = self.lm.get_output_embeddings()
            return logprobs_and_entropy(
                hidden,
                head.weight,
                targets,
                temperature=temperature,
                chunk_size=chunk_size,
                lm_head_bias=getattr(head, "bias", None),
                with_entropy=with_entropy,
            )

    return TokenLogprobModel()


def lr_lambda(warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float) -> Callable[[int], float]:
    """Multiplier of the peak lr at optimizer step k (0-based): linear warm-up, then `schedule`
    (constant, linear or cosine decay to min_lr_ratio at total_steps)."""

    def f(k: int) -> float:
        if k < warmup_steps:
            return (k + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (k - warmup_steps) / max(1, total_steps - warmup_steps))
        decay = 1.0 - frac if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
        return min_lr_ratio + (1.0 - min_lr_ratio) * decay

    return f
