"""Non-finite steps under bf16 ZeRO-2/3 (CPU, gloo, 1 process): skipped by the learner itself.

A skipped step must leave the weights, the fp32 master weights and the Adam state bit-identical,
must not advance the learning-rate schedule, and must discard the gradients DeepSpeed accumulated
(ZeRO-3 keeps them in its own partition buffers): the next finite step then equals the step of a
learner that never saw the bad batch. bf16 is slow on these CPUs: tiny model, few tokens.
"""

from __future__ import annotations

import math

import pytest
import torch


def _learner(path: str, **kw):
    from stare_tir.learner import Learner, LearnerConfig

    # Linear warm-up: the learning rate changes every applied step, so a schedule that advanced
    # on the skipped step shows in the next step's update.
    base = dict(
        zero_stage=3,
        dtype="bf16",
        lr=1e-2,
        micro_batch_tokens=48,
        grad_clip=1.0,
        lr_scheduler="linear",
        warmup_steps=4,
        total_steps=8,
        zero3_persistence_threshold=0,
    )
    base.update(kw)
    return Learner(path, LearnerConfig(**base))


def _weights(learner) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in learner.export_weights()}


def _optimizer_state(learner) -> list[torch.Tensor]:
    """The fp32 master weights and every Adam state tensor held by the torch optimizer."""
    opt = learner._base_optimizer
    out = [p.detach().clone() for g in opt.param_groups for p in g["params"]]
    for st in opt.state.values():
        out += [torch.as_tensor(v).detach().clone() for _, v in sorted(st.items())]
    return out


def _step(learner, trajs, advs) -> dict:
    old, _ = learner.compute_logprobs_entropy(trajs)
    return learner.train_step(trajs, advs, None, old)


@pytest.mark.parametrize("stage", [2, 3])
def test_bf16_nonfinite_micro_batch_is_skipped_and_leaves_no_trace(tiny_path, worker, vocab, stage):
    trajs = worker.make_trajs(6, seed=11, vocab=vocab, max_resp=16)
    advs = worker.make_advantages(6, seed=11)
    bad = list(advs)
    bad[4] = float("nan")  # one trajectory's advantage: one micro-batch's loss is NaN

    a = _learner(tiny_path, zero_stage=stage)
    assert a.bf16 and next(a.model.parameters()).dtype == torch.bfloat16
    # fp32 accumulation reached DeepSpeed and the ZeRO optimizer that sums the micro-batches.
    assert a.engine.config["data_types"]["grad_accum_dtype"] == "fp32"
    assert a.engine.get_data_types() == (torch.bfloat16, torch.float32)
    assert a.engine.optimizer.gradient_accumulation_dtype == torch.float32

    first = _step(a, trajs, advs)  # a real step first: Adam moments and the schedule are non-trivial
    assert first["step_skipped"] == 0 and len(a.micro_batch_plan(trajs)) > 1
    w0, s0, lr0 = _weights(a), _optimizer_state(a), a.scheduler.get_last_lr()

    m = _step(a, trajs, bad)
    assert m["step_skipped"] == 1 and m["nonfinite_loss"] == 1 and math.isnan(m["grad_norm"])
    assert (a.steps_applied, a.steps_skipped) == (1, 1)
    w1, s1 = _weights(a), _optimizer_state(a)
    assert all(torch.equal(w1[k], w0[k]) for k in w0)  # bf16 weights bit-identical
    assert len(s1) == len(s0) and all(torch.equal(x, y) for x, y in zip(s0, s1))  # fp32 masters + Adam
    assert a.scheduler.get_last_lr() == lr0  # the schedule counts applied steps only

    after_skip = _step(a, trajs, advs)
    b = _learner(tiny_path, zero_stage=stage)  # never sees the bad batch
    _step(b, trajs, advs)
    clean = _step(b, trajs, advs)
    assert after_skip["step_skipped"] == clean["step_skipped"] == 0
    assert after_skip["lr"] == clean["lr"] and after_skip["lr"] != first["lr"]
    # Stale NaN gradients left in ZeRO's buffers would make these NaN or different.
    assert after_skip["grad_norm"] == clean["grad_norm"] and math.isfinite(clean["grad_norm"])
    wa, wb = _weights(a), _weights(b)
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert max(float((wa[k].float() - w0[k].float()).abs().max()) for k in wa) > 1e-3  # it did move


class _NanBackward(torch.autograd.Function):
    """Identity forward, NaN gradient: a non-finite gradient behind a finite loss."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return torch.full_like(grad, float("nan"))


def test_nonfinite_gradient_with_finite_loss_is_skipped(tiny_path, worker, vocab):
    """The gradient-norm bound catches what the loss check cannot (fp32 ZeRO-3: same code path)."""
    trajs = worker.make_trajs(6, seed=12, vocab=vocab, max_resp=16)
    advs = worker.make_advantages(6, seed=12)
    learner = _learner(tiny_path, dtype="fp32")
    w0, s0 = _weights(learner), _optimizer_state(learner)
    layer = learner.model.model.layers[0]
    handle = layer.register_forward_hook(
        lambda mod, inp, out: (
            (_NanBackward.apply(out[0]), *out[1:]) if isinstance(out, tuple) else _NanBackward.apply(out)
        )
    )
    try:
        m = _step(learner, trajs, advs)
    finally:
        handle.remove()
    assert math.isfinite(m["loss"]) and m["nonfinite_loss"] == 0
    assert m["step_skipped"] == 1 and not math.isfinite(m["grad_norm_bound"])
    assert all(torch.equal(v, w0[k]) for k, v in learner.export_weights())
    assert all(torch.equal(x, y) for x, y in zip(s0, _optimizer_state(learner)))
    m = _step(learner, trajs, advs)  # the hook is gone: a normal step, bounded by the bound
    assert m["step_skipped"] == 0 and 0 < m["grad_norm"] <= m["grad_norm_bound"] * (1 + 1e-5)


def test_stage0_bf16_accumulation_dtype_is_honoured_or_refused_with_the_fix(tiny_path):
    """Without ZeRO, DeepSpeed takes one accumulation dtype under bf16 (which one depends on its
    version): the learner either runs with exactly the requested one or names the way out."""
    built = []
    for accum in ("fp32", "bf16"):
        try:
            learner = _learner(tiny_path, zero_stage=0, grad_accum_dtype=accum)
        except ValueError as e:
            assert "learner.zero_stage=1" in str(e) and f"learner.grad_accum_dtype={accum}" in str(e)
            continue
        want = torch.float32 if accum == "fp32" else torch.bfloat16
        assert learner.engine.get_data_types() == (torch.bfloat16, want)
        built.append(accum)
    assert len(built) == 1, built
