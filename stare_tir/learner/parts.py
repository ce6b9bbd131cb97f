"""Parts of the learner that need no engine: the module DeepSpeed wraps, the LR schedule."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

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


def has_dropout(module: nn.Module, config: Any = None) -> bool:
    """Whether a forward in train mode can differ from one in eval mode: an nn.Dropout with p > 0
    in `module`, or a positive *dropout probability in the HF `config` (attention dropout is a
    functional call there, not a module)."""
    from torch import nn

    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in module.modules()):
        return True
    probs = [v for k, v in vars(config).items() if k.endswith("dropout")] if config is not None else []
    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in probs)


class RlStepClock:
    """The RL step (0-based) the learning rate is computed from under learner.schedule_unit = rl_step:
    the trainer sets it at the start of every step (`begin_rl_step`). A separate object, not state
    of the LR scheduler, so that a checkpoint's scheduler state never overrides the step being run."""

    __slots__ = ("step",)

    def __init__(self) -> None:
        self.step = 0


def lr_lambda(
    warmup_steps: int,
    total_steps: int,
    schedule: str,
    min_lr_ratio: float,
    unit: str = "optimizer_step",
    clock: RlStepClock | None = None,
) -> Callable[[int], float]:
    """Multiplier of the peak lr for torch's LambdaLR, which calls it with the optimizer step count k.

    unit optimizer_step: at optimizer step k (0-based) linear warm-up (k + 1) / warmup_steps, then
    `schedule` (constant, linear or cosine decay to min_lr_ratio at total_steps).
    unit rl_step: the same shape over the RL step t of `clock`, whatever k, with verl's warm-up
    t / warmup_steps from 0 (volcengine/verl@07584894 (v0.4.0) verl/utils/torch_functional.py
    `get_constant_schedule_with_warmup`, stepped once per `update_actor` in
    verl/workers/fsdp_workers.py): every mini-batch of RL step t trains at the same lr, the first RL
    step at lr 0."""
    if unit not in ("optimizer_step", "rl_step"):
        raise ValueError(f"unit={unit!r}: optimizer_step or rl_step")
    if unit == "rl_step" and clock is None:
        raise ValueError("unit=rl_step needs the RL step clock the trainer advances")

    def f(k: int) -> float:
        if unit == "rl_step":
            t = clock.step  # type: ignore[union-attr]
            if t < warmup_steps:
                return t / warmup_steps
        else:
            t = k
            if t < warmup_steps:
                return (t + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (t - warmup_steps) / max(1, total_steps - warmup_steps))
        decay = 1.0 - frac if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * frac))
        return min_lr_ratio + (1.0 - min_lr_ratio) * decay

    return f


def begin_rl_step(scheduler: Any, clock: RlStepClock, step: int, unit: str) -> None:
    """Start RL step `step` (0-based): under unit rl_step, set the clock and the optimizer's lr to the
    schedule's value at it (LambdaLR would only apply it at its next step(), after the first
    mini-batch). Under optimizer_step nothing changes."""
    if unit != "rl_step":
        return
    clock.step = step
    lrs = [base * fn(scheduler.last_epoch) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    scheduler._last_lr = lrs
