"""Clipped policy loss: hand-computed clipping, aggregation over the global batch, TIS, and
exact equality with token weights of one; CPU only."""

import math

import pytest
import torch

from stare_tir.algos.policy_loss import (
    POLICY_LOSSES,
    Clip,
    LossInputs,
    clip_loss,
    truncated_is_weights,
)


def _hand():
    # ratios 1, 1.5, 0.5, 5 with advantages +1, +1, -1, -1 (old logprobs 0)
    lp = torch.log(torch.tensor([[1.0, 1.5, 0.5, 5.0]], dtype=torch.float64)).requires_grad_()
    old = torch.zeros(1, 4, dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]], dtype=torch.float64)
    mask = torch.ones(1, 4, dtype=torch.float64)
    return lp, old, adv, mask


def test_hand_computed_clip_and_dual_clip():
    lp, old, adv, mask = _hand()
    loss, met = clip_loss(LossInputs(lp, old, adv, mask, clip=Clip(low=0.2, high=0.2, dual_c=3.0)))
    # per token: -1 (unclipped), -1.2 (high clip), 0.8 (low clip), 3 (dual clip: min(5, 3))
    assert loss.item() == pytest.approx((-1.0 - 1.2 + 0.8 + 3.0) / 4)
    assert met["pg/clipfrac_high"] == pytest.approx(0.25)
    assert met["pg/clipfrac_low"] == pytest.approx(0.25)
    assert met["pg/clipfrac_dual"] == pytest.approx(0.25)
    assert met["pg/num_tokens"] == 4
    assert met["pg/ratio_max"] == pytest.approx(5.0)
    # k1 = mean(old - new) and k3 = mean(rho - 1 - log rho)
    logs = [0.0, math.log(1.5), math.log(0.5), math.log(5.0)]
    assert met["pg/approx_kl_k1"] == pytest.approx(-sum(logs) / 4)
    assert met["pg/approx_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in logs) / 4)
    (g,) = torch.autograd.grad(loss, lp)
    # only the unclipped token has a gradient: d(-A * rho)/d logp = -A * rho = -1, over 4 tokens
    torch.testing.assert_close(g, torch.tensor([[-0.25, 0.0, 0.0, 0.0]], dtype=torch.float64))


def test_clip_higher_and_no_dual_clip():
    lp, old, adv, mask = _hand()
    loss, met = clip_loss(LossInputs(lp, old, adv, mask, clip=Clip(low=0.2, high=0.6, dual_c=None)))
    assert loss.item() == pytest.approx((-1.0 - 1.5 + 0.8 + 5.0) / 4)
    assert met["pg/clipfrac_high"] == 0.0
    assert met["pg/clipfrac_dual"] == 0.0
    (g,) = torch.autograd.grad(loss, lp)
    torch.testing.assert_close(g, torch.tensor([[-0.25, -1.5 / 4, 0.0, 5.0 / 4]], dtype=torch.float64))


def _rand_batch(b=3, t=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(b, t, generator=g) * 3).requires_grad_()
    old = lp.detach() + 0.3 * torch.randn(b, t, generator=g)
    adv = torch.randn(b, 1, generator=g).expand(b, t).contiguous()
    lengths = torch.tensor([7, 3, 5])[:b]
    mask = (torch.arange(t)[None, :] < lengths[:, None]).float()
    return lp, old, adv * mask, mask


def test_aggregation_modes_hand_computed():
    lp = torch.zeros(2, 3, requires_grad=True)  # ratio 1 everywhere: loss per token is -A
    old = torch.zeros(2, 3)
    adv = torch.tensor([[1.0, 1.0, 1.0], [4.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    tm, _ = clip_loss(LossInputs(lp, old, adv, mask, agg="token-mean"))
    sts, _ = clip_loss(LossInputs(lp, old, adv, mask, agg="seq-mean-token-sum"))
    stm, _ = clip_loss(LossInputs(lp, old, adv, mask, agg="seq-mean-token-mean"))
    assert tm.item() == pytest.approx(-(3 + 4) / 4)
    assert sts.item() == pytest.approx(-(3 + 4) / 2)
    assert stm.item() == pytest.approx(-(1 + 4) / 2)
    with pytest.raises(ValueError, match="agg"):
        clip_loss(LossInputs(lp, old, adv, mask, agg="sum"))


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batches_sum_to_global_loss_and_grad(agg):
    lp, old, adv, mask = _rand_batch()
    full, _ = clip_loss(LossInputs(lp, old, adv, mask, agg=agg))
    (g_full,) = torch.autograd.grad(full, lp)
    n_tok = float(mask.sum())
    n_seq = float((mask.sum(-1) > 0).sum())
    total = 0.0
    grads = []
    for rows in ([0], [1, 2]):  # uneven micro-batches: a per-micro-batch mean would differ
        sub = lp.detach()[rows].requires_grad_()
        part, _ = clip_loss(
            LossInputs(sub, old[rows], adv[rows], mask[rows], agg=agg, global_tokens=n_tok, global_seqs=n_seq)
        )
        total = total + part.item()
        grads.append(torch.autograd.grad(part, sub)[0])
    assert total == pytest.approx(full.item(), rel=1e-6)
    torch.testing.assert_close(torch.cat(grads), g_full)
    # and the global denominator matters: per-micro-batch token means would not add up
    if agg == "token-mean":
        local = sum(clip_loss(LossInputs(lp.detach()[r], old[r], adv[r], mask[r]))[0].item() for r in ([0], [1, 2]))
        assert local != pytest.approx(full.item(), rel=1e-3)


def test_token_weights_of_one_reproduce_grpo_bitwise():
    lp, old, adv, mask = _rand_batch(seed=3)
    for agg in ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean"):
        base, m0 = clip_loss(
            LossInputs(lp, old, adv, mask, agg=agg, global_tokens=11.0 if agg == "token-mean" else None)
        )
        (g0,) = torch.autograd.grad(base, lp)
        ones, m1 = clip_loss(
            LossInputs(
                lp,
                old,
                adv,
                mask,
                agg=agg,
                token_weights=torch.ones_like(adv),
                global_tokens=11.0 if agg == "token-mean" else None,
            )
        )
        (g1,) = torch.autograd.grad(ones, lp)
        assert torch.equal(base, ones)
        assert torch.equal(g0, g1)
        assert m0 == m1


def test_positive_token_weights_scale_gradients_and_keep_sign():
    lp, old, adv, mask = _rand_batch(seed=4)
    g = torch.Generator().manual_seed(1)
    omega = torch.rand(adv.shape, generator=g) * 2 + 0.05  # any positive weights
    base, _ = clip_loss(LossInputs(lp, old, adv, mask))
    (g0,) = torch.autograd.grad(base, lp)
    weighted, _ = clip_loss(LossInputs(lp, old, adv, mask, token_weights=omega))
    (g1,) = torch.autograd.grad(weighted, lp)
    assert (g0 != 0).sum() > 5  # the check below is not vacuous
    assert torch.equal(torch.sign(g1), torch.sign(g0))
    torch.testing.assert_close(g1, g0 * omega)


def test_truncated_is_weights_hand_computed():
    old = torch.log(torch.tensor([[0.5, 0.4, 0.3]]))
    roll = torch.log(torch.tensor([[1.0, 0.1, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    w = truncated_is_weights(old, roll, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[0.5, 2.0, 1.0]]))  # 0.5, min(4, 2), masked -> 1
    assert not w.requires_grad
    with pytest.raises(ValueError, match="cap"):
        truncated_is_weights(old, roll, mask, cap=0.0)


def test_tis_weights_scale_per_token_loss():
    lp = torch.zeros(1, 2, requires_grad=True)
    old = torch.zeros(1, 2)
    adv = torch.tensor([[1.0, -2.0]])
    mask = torch.ones(1, 2)
    tis = torch.tensor([[0.5, 2.0]])
    loss, met = clip_loss(LossInputs(lp, old, adv, mask, tis_weights=tis))
    assert loss.item() == pytest.approx((-1.0 * 0.5 + 2.0 * 2.0) / 2)
    assert met["pg/tis_mean"] == pytest.approx(1.25)


def test_registry_and_argument_checks():
    assert POLICY_LOSSES.get("clip") is clip_loss
    assert "clip" in POLICY_LOSSES
    with pytest.raises(ValueError, match="clip"):
        POLICY_LOSSES.get("nope")
    # the clip values are checked where they are built: Clip's constructor
    with pytest.raises(ValueError, match="dual_c"):
        Clip(dual_c=0.5)
