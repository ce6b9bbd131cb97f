"""Learner numerics on CPU (gloo, 1 process): recompute pass, update, loss scale, skips, export."""

from __future__ import annotations

import math

import pytest
import torch


def _learner(path: str, **kw):
    from stare_tir.learner import Learner, LearnerConfig

    base = dict(zero_stage=2, lr=1e-3, micro_batch_tokens=64, grad_clip=1.0)
    base.update(kw)
    return Learner(path, LearnerConfig(**base))


def _reference_logprobs(model, trajs, temperature: float = 1.0):
    """Full-vocabulary log-softmax of a plain HF forward, one sequence at a time."""
    lps, ents = [], []
    for t in trajs:
        ids = torch.tensor([t.prompt_ids + t.response_ids])
        logits = model(ids).logits[0, len(t.prompt_ids) - 1 : -1].float() / temperature  # [R, V]
        lsm = torch.log_softmax(logits, -1)
        m = torch.tensor(t.loss_mask, dtype=torch.float32)
        lps.append(lsm.gather(1, torch.tensor(t.response_ids)[:, None])[:, 0] * m)
        ents.append(-(lsm.exp() * lsm).sum(-1) * m)
    return lps, ents


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _assert_adam_steps_agree(a: dict, b: dict, lr: float, tol: float, max_outliers: int = 8) -> None:
    """Weights after one AdamW step from the same start agree, up to Adam's ill-conditioned elements.

    Adam's first step moves each weight by lr * g / (|g| + eps): where |g| is near eps (1e-8), the
    gradient's float noise (summation order differs between micro-batch splits, ZeRO stages and
    kernel versions) changes that element's step by up to lr. Such elements are few; every other
    weight must agree to `tol`, and none may differ by more than Adam's bound of ~lr per step.
    """
    assert a.keys() == b.keys()
    outliers = 0
    for k in a:
        diff = (a[k].double() - b[k].double()).abs()
        assert float(diff.max()) <= 2.0 * lr, f"{k}: {float(diff.max())} exceeds Adam's one-step bound"
        outliers += int((diff > tol).sum())
    assert outliers <= max_outliers, f"{outliers} weights differ by more than {tol}"


def test_recompute_pass_matches_full_logits(tiny_path, worker, vocab):
    from transformers import AutoModelForCausalLM

    trajs = worker.make_trajs(12, seed=3, vocab=vocab)
    learner = _learner(tiny_path, zero_stage=0, micro_batch_tokens=40, temperature=0.7, logprob_chunk_size=7)
    assert len(learner.micro_batch_plan(trajs, forward_only=True)) > 1  # several padded micro-batches
    lps, ents = learner.compute_logprobs_entropy(trajs)
    ref = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    with torch.no_grad():
        rlps, rents = _reference_logprobs(ref, trajs, temperature=0.7)
    for t, lp, ent, rlp, rent in zip(trajs, lps, ents, rlps, rents):
        assert lp.shape == (len(t.response_ids),) and ent.shape == lp.shape
        masked = torch.tensor(t.loss_mask) == 0
        assert torch.all(lp[masked] == 0) and torch.all(ent[masked] == 0)  # rollout_logprobs convention
        torch.testing.assert_close(lp, rlp, rtol=0, atol=2e-5)
        torch.testing.assert_close(ent, rent, rtol=0, atol=2e-5)


def test_update_matches_plain_torch_and_lowers_loss(tiny_path, worker, vocab):
    """One step equals a hand-written token-mean surrogate + AdamW step: DeepSpeed neither divides
    by the micro-batch count nor rescales; the next evaluation of the surrogate is lower."""
    from transformers import AutoModelForCausalLM

    trajs = worker.make_trajs(16, seed=0, vocab=vocab)
    advs = worker.make_advantages(16, seed=0)
    learner = _learner(tiny_path, lr=1e-2, grad_clip=0.0, weight_decay=0.01)
    old, _ = learner.compute_logprobs_entropy(trajs)
    before = {k: v.clone() for k, v in learner.export_weights()}
    m1 = learner.train_step(trajs, advs, None, old)
    assert m1["micro_batches"] > 1 and m1["step_skipped"] == 0

    ref = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.01)
    lps, _ = _reference_logprobs(ref, trajs)
    n_tok = sum(sum(t.loss_mask) for t in trajs)
    loss = (
        sum(-(a * torch.exp(lp - o) * torch.tensor(t.loss_mask)).sum() for a, lp, o, t in zip(advs, lps, old, trajs))
        / n_tok
    )
    loss.backward()
    gnorm = torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf"))
    opt.step()
    assert m1["tokens"] == n_tok
    assert m1["loss"] == pytest.approx(float(loss.detach()), rel=1e-5)
    assert m1["grad_norm"] == pytest.approx(float(gnorm), rel=1e-5)
    after = {k: v.clone() for k, v in learner.export_weights()}
    # Adam turns gradient noise of ~1e-8 into ~lr * 1e-3 differences; every weight moved ~lr.
    _assert_adam_steps_agree(after, dict(ref.named_parameters()), lr=1e-2, tol=2e-4)
    assert _max_diff(after, before) > 5e-3

    m2 = learner.train_step(trajs, advs, None, old)  # same old log-probs: the surrogate improved
    assert m2["loss"] < m1["loss"] - 0.05


def test_token_mean_is_invariant_to_the_micro_batch_split(tiny_path, worker, vocab):
    from stare_tir.algos.policy_loss import Clip

    trajs = worker.make_trajs(16, seed=1, vocab=vocab)
    advs = worker.make_advantages(16, seed=1)
    out = {}
    for budget in (24, 100_000):
        learner = _learner(tiny_path, micro_batch_tokens=budget)
        old, _ = learner.compute_logprobs_entropy(trajs)
        m = learner.train_step(trajs, advs, None, old, clip=Clip(high=0.28))
        out[budget] = (m, {k: v.clone() for k, v in learner.export_weights()})
    (small, w_small), (big, w_big) = out[24], out[100_000]
    assert small["micro_batches"] >= 8 and big["micro_batches"] == 1
    assert small["loss"] == pytest.approx(big["loss"], rel=1e-6)
    assert small["grad_norm"] == pytest.approx(big["grad_norm"], rel=1e-5)
    assert small["tokens"] == big["tokens"]
    _assert_adam_steps_agree(w_small, w_big, lr=1e-3, tol=1e-5)


def test_omega_one_reproduces_no_stare_bit_for_bit(tiny_path, worker, vocab):
    trajs = worker.make_trajs(10, seed=2, vocab=vocab)
    advs = worker.make_advantages(10, seed=2)
    res = []
    for weights in (None, [torch.ones(len(t.response_ids)) for t in trajs]):
        learner = _learner(tiny_path)
        old, _ = learner.compute_logprobs_entropy(trajs)
        m = learner.train_step(trajs, advs, weights, old)
        res.append((m, {k: v.clone() for k, v in learner.export_weights()}))
    (m0, w0), (m1, w1) = res
    assert m0["loss"] == m1["loss"] and m0["grad_norm"] == m1["grad_norm"]
    assert all(torch.equal(w0[k], w1[k]) for k in w0)
    # ... and a real omega changes the update (the comparison above can fail).
    learner = _learner(tiny_path)
    old, _ = learner.compute_logprobs_entropy(trajs)
    m2 = learner.train_step(trajs, advs, [torch.full((len(t.response_ids),), 1.5) for t in trajs], old)
    assert m2["loss"] == pytest.approx(1.5 * m0["loss"], rel=1e-6)


@pytest.mark.parametrize("stage", [0, 2])
def test_nonfinite_loss_skips_the_step(tiny_path, worker, vocab, stage):
    trajs = worker.make_trajs(8, seed=4, vocab=vocab)
    advs = worker.make_advantages(8, seed=4)
    learner = _learner(tiny_path, zero_stage=stage)
    old, _ = learner.compute_logprobs_entropy(trajs)
    w0 = {k: v.clone() for k, v in learner.export_weights()}
    bad = list(advs)
    bad[5] = float("nan")
    m = learner.train_step(trajs, bad, None, old)
    assert m["step_skipped"] == 1 and not math.isfinite(m["grad_norm"])
    assert learner.steps_skipped == 1 and learner.steps_applied == 0
    assert all(torch.equal(v, w0[k]) for k, v in learner.export_weights())
    m = learner.train_step(trajs, advs, None, old)  # optimizer state was not poisoned
    assert m["step_skipped"] == 0 and math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
    w1 = {k: v.clone() for k, v in learner.export_weights()}
    assert all(torch.isfinite(v).all() for v in w1.values()) and _max_diff(w1, w0) > 1e-4


def test_zero3_export_and_save_hf_give_the_full_trained_weights(tiny_path, worker, vocab, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trajs = worker.make_trajs(8, seed=5, vocab=vocab)
    advs = worker.make_advantages(8, seed=5)
    exported = {}
    for stage in (0, 3):
        # Threshold 0: every tiny parameter is partitioned, so export really has to gather.
        learner = _learner(tiny_path, zero_stage=stage, zero3_persistence_threshold=0)
        old, _ = learner.compute_logprobs_entropy(trajs)
        learner.train_step(trajs, advs, None, old)
        exported[stage] = {k: v.clone() for k, v in learner.export_weights()}
        if stage == 0:  # stage 0 holds the weights itself: export is exactly its state
            sd = learner.model.state_dict()
            assert all(torch.equal(v, sd[k]) for k, v in exported[0].items())
    names = [n for n, _ in AutoModelForCausalLM.from_pretrained(tiny_path).named_parameters()]
    assert list(exported[3]) == names
    _assert_adam_steps_agree(exported[3], exported[0], lr=1e-3, tol=1e-6)

    learner.save_hf(tmp_path / "hf")  # the ZeRO-3 learner: gathered on save
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    assert all(torch.equal(p, exported[3][n]) for n, p in reloaded.named_parameters())
    tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert tok.eos_token == "<|im_end|>" and tok.chat_template


def test_exported_weights_feed_the_hf_rollout_backend(tiny_path, worker, vocab, tmp_path):
    """Weight sync: export_weights() names fit the backend, and save_hf() loads there too."""
    from stare_tir.rollout.backends.hf import HFBackend

    trajs = worker.make_trajs(6, seed=7, vocab=vocab)
    learner = _learner(tiny_path, lr=1e-2)
    old, _ = learner.compute_logprobs_entropy(trajs)
    learner.train_step(trajs, worker.make_advantages(6, seed=7), None, old)
    exported = {k: v.clone() for k, v in learner.export_weights()}

    backend = HFBackend(tiny_path)
    try:
        backend.update_weights(learner.export_weights())
        state = backend.model.state_dict()
        assert all(torch.equal(state[k], v) for k, v in exported.items())
        assert torch.equal(state["lm_head.weight"], exported["model.embed_tokens.weight"])  # tied head follows
    finally:
        backend.close()
    learner.save_hf(tmp_path / "hf")
    backend = HFBackend(tmp_path / "hf")
    try:
        assert all(torch.equal(backend.model.state_dict()[k], v) for k, v in exported.items())
    finally:
        backend.close()
