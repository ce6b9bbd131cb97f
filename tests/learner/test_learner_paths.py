"""Every DeepSpeed path the learner offers (CPU, gloo, 1 process, the installed DeepSpeed):
ZeRO 0-3 x fp32/bf16 x no offload / optimizer offloaded (ZeRO 1-3) / parameters offloaded too
(ZeRO-3). Each path takes the same sequence of steps:

  A  a normal step                      applied, finite
  Z  all advantages zero (plain GRPO when every group ties): zero gradient, applied, norm 0
  N  one NaN advantage                  skipped; weights, fp32 masters and Adam state bit-identical
  B, C  normal steps                    bit-identical to a learner that never saw N

and A/B's losses and gradient norms equal those of plain ZeRO-0 fp32 (to float32 rounding for
fp32 paths, to bf16 rounding for bf16 ones): no path drops a micro-batch's gradient. Bugs these
caught on some DeepSpeed versions: BF16_Optimizer asserting on a zero or skipped norm (ZeRO-1 bf16,
< 0.19.8), ZeRO-2 offload training on the last micro-batch only (< 0.19.0), a NaN kept in the fp32
accumulation buffer after a skipped offload step so that every later step is skipped (0.19.8,
fixed in the learner: step_guard.discard_partition_gradients).
"""

from __future__ import annotations

import math

import pytest
import torch

OFFLOAD_OPT = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
OFFLOAD_ALL = {"zero_optimization": {"offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}
PATHS = [
    (stage, dtype, offload)
    for dtype in ("fp32", "bf16")
    for stage, offload in [(0, "none"), (1, "none"), (2, "none"), (3, "none"), (1, "opt"), (2, "opt"), (3, "opt")]
    + [(3, "opt+param")]
]


def _learner(path: str, stage: int, dtype: str, offload: str):
    from stare_tir.learner import Learner, LearnerConfig

    ds = {"none": {}, "opt": OFFLOAD_OPT, "opt+param": OFFLOAD_ALL}[offload]
    return Learner(
        path,
        LearnerConfig(
            zero_stage=stage,
            dtype=dtype,
            # DeepSpeed 0.19 accumulates bf16 gradients in bf16 only without ZeRO (the learner says so)
            grad_accum_dtype="bf16" if (stage, dtype) == (0, "bf16") else "fp32",
            lr=1e-2,
            micro_batch_tokens=48,  # several micro-batches per step
            lr_scheduler="linear",  # the lr changes every applied step: a schedule that moved on
            warmup_steps=4,  # the skipped step shows in the next one
            total_steps=8,
            zero3_persistence_threshold=0,
            deepspeed=ds,
        ),
    )


def _state(learner) -> list[torch.Tensor]:
    """bf16/fp32 weights, the fp32 masters wherever DeepSpeed keeps them, and the Adam state."""
    from stare_tir.learner.step_guard import master_weights

    out = [v.clone() for _, v in learner.export_weights()]
    out += master_weights(learner.engine.optimizer, learner.model.parameters())
    for st in learner._base_optimizer.state.values():
        out += [torch.as_tensor(v).detach().clone() for _, v in sorted(st.items())]
    return out


class Steps:
    def __init__(self, worker, vocab):
        self.trajs = worker.make_trajs(6, seed=11, vocab=vocab, max_resp=16)
        self.advs = worker.make_advantages(6, seed=11)
        self.zero = [0.0] * 6
        self.nan = list(self.advs)
        self.nan[4] = float("nan")

    def take(self, learner, advs) -> dict:
        old, _ = learner.compute_logprobs_entropy(self.trajs)
        return learner.train_step(self.trajs, advs, None, old)


@pytest.fixture(scope="module")
def reference(tiny_path, worker, vocab):
    """Plain ZeRO-0 fp32 (torch AdamW on the module's own parameters): A, Z, B."""
    steps = Steps(worker, vocab)
    ref = _learner(tiny_path, 0, "fp32", "none")
    return [steps.take(ref, a) for a in (steps.advs, steps.zero, steps.advs)]


@pytest.mark.parametrize(("stage", "dtype", "offload"), PATHS)
def test_path_steps_zero_gradient_skips_and_recovers(tiny_path, worker, vocab, reference, stage, dtype, offload):
    steps = Steps(worker, vocab)
    a = _learner(tiny_path, stage, dtype, offload)
    assert a.bf16 == (dtype == "bf16") and a.engine.zero_optimization_stage() == stage
    assert a.engine.zero_cpu_offload() == (offload != "none")
    if offload != "none":  # the offloaded optimizer steps with torch's fused CPU kernel
        assert a._base_optimizer.param_groups[0]["fused"] is True
    assert len(a.micro_batch_plan(steps.trajs)) > 1

    first = steps.take(a, steps.advs)
    zero = steps.take(a, steps.zero)
    assert first["step_skipped"] == zero["step_skipped"] == 0
    assert zero["grad_norm"] == 0.0 and zero["loss"] == 0.0  # applied (Adam and the schedule advance)
    before, lr = _state(a), a.scheduler.get_last_lr()
    bad = steps.take(a, steps.nan)
    assert bad["step_skipped"] == 1 and bad["nonfinite_loss"] == 1 and math.isnan(bad["grad_norm"])
    after = _state(a)
    assert len(after) == len(before) and all(torch.equal(x, y) for x, y in zip(before, after))
    assert a.scheduler.get_last_lr() == lr and (a.steps_applied, a.steps_skipped) == (2, 1)
    later = [steps.take(a, steps.advs) for _ in range(2)]

    b = _learner(tiny_path, stage, dtype, offload)  # never sees the NaN
    clean = [steps.take(b, adv) for adv in (steps.advs, steps.zero, steps.advs, steps.advs)][2:]
    for got, want in zip(later, clean):
        assert got["step_skipped"] == want["step_skipped"] == 0
        assert math.isfinite(got["grad_norm"]) and got["grad_norm"] == want["grad_norm"]
        assert got["loss"] == want["loss"] and got["lr"] == want["lr"]
    assert all(torch.equal(x, y) for x, y in zip(_state(a), _state(b)))

    # The same numbers as plain ZeRO-0 fp32: every micro-batch's gradient reached the step.
    tol = 1e-5 if dtype == "fp32" else 2e-2
    for got, want in ((first, reference[0]), (later[0], reference[2])):
        assert got["grad_norm"] == pytest.approx(want["grad_norm"], rel=tol)
        assert got["loss"] == pytest.approx(want["loss"], rel=tol, abs=1e-6)
