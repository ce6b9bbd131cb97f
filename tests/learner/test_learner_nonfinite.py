"""Non-finite steps (CPU, gloo, 1 process): skipped by the learner itself.

A non-finite loss on every path (stage x dtype x offload) is in test_learner_paths.py. Here: a
non-finite gradient behind a finite loss (caught by the gradient-norm bound), and the bf16
accumulation dtype without ZeRO.
"""

from __future__ import annotations

import math

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
    """The fp32 master weights (wherever DeepSpeed keeps them: at ZeRO-3 the torch optimizer holds
    no parameters between steps) and every Adam state tensor."""
    from stare_tir.learner.step_guard import master_weights

    opt = learner._base_optimizer
    out = master_weights(learner.engine.optimizer, learner.model.parameters())
    for st in opt.state.values():
        out += [torch.as_tensor(v).detach().clone() for _, v in sorted(st.items())]
    return out


def _step(learner, trajs, advs) -> dict:
    old, _ = learner.compute_logprobs_entropy(trajs)
    return learner.train_step(trajs, advs, None, old)


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
