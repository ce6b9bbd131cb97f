"""Non-finite optimizer steps, decided by the learner before DeepSpeed's `engine.step()`.

Why not leave it to DeepSpeed. Whether DeepSpeed skips a step with NaN/inf gradients depends on
the ZeRO stage, the dtype and the version (deepspeed/runtime/zero/stage3.py checks overflow in
`_overflow_check_and_loss_scale_update` only when `self.dtype == torch.float16`; the later
`is_invalid_grad_norm` check in `step()` is recent; stage_1_and_2.py's `step()` skips a bf16 step
only under `check_grad_overflow`). With DeepSpeed 0.19.6, bf16 ZeRO-3 applied a NaN step and every
weight became NaN. So the learner decides, from numbers it computes itself on every rank:

- the loss of each micro-batch is finite (a flag per rank), and
- a bound on the global gradient norm is finite and small enough that DeepSpeed's fp32
  sum-of-squares cannot overflow. `GradNormBound` hooks every trainable parameter
  (`Tensor.register_hook`: it sees each gradient before autograd accumulates it, so before any
  DeepSpeed hook moves it into ZeRO buffers) and adds the L2 norm of each contribution. The
  gradient the optimizer sees is (1/world) * the sum of all contributions of all ranks, so by the
  triangle inequality its norm, and every element of it, is at most sum/world.

Both are all-reduced with the step's other sums, so every rank takes the same decision.

How a step is skipped. `frozen_update` makes the torch optimizer's and the LR scheduler's `step()`
no-ops (both objects are ours: we pass them to `deepspeed.initialize`), then the learner calls
`engine.step()` as usual. DeepSpeed runs its normal end-of-step path, which is what discards the
accumulated gradients in every stage (ZeRO-3 resets `micro_step_id` and its `averaged_gradients`,
stage 1/2 their partition buffers, stage 0 `zero_grad()`), and copies the fp32 master weights,
which the no-op left untouched, back into the bf16 weights: bit-identical. The Adam moments and
step count are untouched, and the learning-rate schedule does not advance (it counts applied
updates; DeepSpeed likewise does not step the scheduler on an fp16 overflow). What this relies on
is the public contract of `deepspeed.initialize(optimizer=..., lr_scheduler=...)`: the engine
updates weights through the optimizer's `step()` and advances the schedule through the
scheduler's `step()`; plus one repair, `discard_partition_gradients`, for a buffer DeepSpeed 0.19.8
keeps across a skipped step (ZeRO-1/2 with offload_optimizer and fp32 accumulation).
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, Iterable, Iterator

if TYPE_CHECKING:
    from torch import Tensor, nn

# A global gradient norm at or above this squares to inf in float32 (DeepSpeed sums squares in
# fp32): treated like a non-finite gradient. sqrt(float32 max) = 1.8e19.
NORM_LIMIT = math.sqrt(3.4028234663852886e38)


class GradNormBound:
    """Per-rank sum of the L2 norms of every gradient contribution since the last `reset()`.

    Lives on the training device and is only added to inside the hooks, so it costs no host sync;
    the learner reads it once per step, in the all-reduce it already does.
    """

    def __init__(self, params: Iterable[nn.Parameter], device: Any) -> None:
        import torch

        self.total = torch.zeros((), dtype=torch.float32, device=device)
        self._handles = [p.register_hook(self._add) for p in params if p.requires_grad]

    def _add(self, grad: Tensor) -> None:
        import torch

        # dtype=float32: a bf16 gradient is reduced in fp32, as DeepSpeed's norm is.
        self.total.add_(torch.linalg.vector_norm(grad, dtype=torch.float32).to(self.total.device))

    def reset(self) -> None:
        self.total.zero_()

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []


def step_is_finite(nonfinite_loss: float, norm_bound: float) -> bool:
    """The skip decision from the all-reduced numbers (the same on every rank).

    nonfinite_loss: sum over ranks of the per-rank "a micro-batch loss was not finite" flags.
    norm_bound: the all-reduced `GradNormBound` sum divided by the world size.
    """
    return nonfinite_loss == 0 and norm_bound < NORM_LIMIT  # False for NaN too


def discard_partition_gradients(zero_optimizer: Any) -> None:
    """After a skipped step, drop the gradient partitions a ZeRO-1/2 optimizer still holds.

    deepspeed/runtime/zero/stage_1_and_2.py `step()`: when its own norm check finds the skipped
    step's NaN, the non-offload branch sets every `averaged_gradients[k]` and `all_grad_tensors[k]`
    to None, but the cpu_offload branch only calls `reset_cpu_buffers()`. With fp32 gradient
    accumulation under bf16 those entries are persistent fp32 buffers that the next backward adds
    into (`_build_compact_grad_partition_buffer` is built only while the entry is None), so the NaN
    stays and every later step is skipped (0.19.8). An applied step leaves both at None, so this
    restores exactly the state after a normal step. A no-op for optimizers without these
    attributes (ZeRO-3 resets its own; stage 0 and BF16_Optimizer have none).
    """
    for name in ("averaged_gradients", "all_grad_tensors"):
        buffers = getattr(zero_optimizer, name, None)
        if isinstance(buffers, dict):
            for key in buffers:
                buffers[key] = None


def master_weights(zero_optimizer: Any, module_params: Iterable[Tensor]) -> list[Tensor]:
    """Copies of the fp32 master weights the optimizer updates, wherever DeepSpeed keeps them.

    ZeRO-3 (stage3.py `fp32_partitioned_groups_flat`; its base optimizer holds no parameters
    between steps), ZeRO-1/2 (stage_1_and_2.py `single_partition_of_fp32_groups`), bf16 ZeRO-1
    (bf16_optimizer.py `fp32_groups_flat_partition`), bf16 stage 0 (the unfused optimizer's
    `fp32_groups`); fp32 stage 0 updates the module's own parameters. For tests and checks that a
    skipped step leaves the masters bit-identical.
    """
    for name in ("fp32_partitioned_groups_flat", "single_partition_of_fp32_groups", "fp32_groups_flat_partition"):
        groups = getattr(zero_optimizer, name, None)
        if groups:
            return [t.detach().clone() for t in groups]
    groups = getattr(zero_optimizer, "fp32_groups", None)
    if groups:
        return [t.detach().clone() for group in groups for t in group]
    return [p.detach().clone() for p in module_params]


def _noop_step(*args: Any, **kwargs: Any) -> None:
    return None


@contextlib.contextmanager
def frozen_update(optimizer: Any, scheduler: Any = None) -> Iterator[None]:
    """Within the block, `optimizer.step()` and `scheduler.step()` do nothing.

    Instance attributes shadow the class methods; torch's LRScheduler already wraps the
    optimizer's `step` as an instance attribute, so the previous attribute (if any) is restored.
    """
    missing = object()
    saved = [(obj, vars(obj).get("step", missing)) for obj in (optimizer, scheduler) if obj is not None]
    for obj, _ in saved:
        obj.step = _noop_step
    try:
        yield
    finally:
        for obj, prev in saved:
            if prev is missing:
                del obj.step
            else:
                obj.step = prev
