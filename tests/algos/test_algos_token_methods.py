"""Property tests of the STARE paper's baselines (stare_tir/algos/methods/) through the real loss:
each reduces to GRPO-ds bit for bit when its selection is empty or its coefficient 0, selects exactly
the stated count, gives silenced tokens exactly zero gradient, keeps the signs of shaped advantages.
CPU only."""

from __future__ import annotations

import math

import pytest
import torch

from stare_tir.algos.advantage import overlong_penalty
from stare_tir.algos.methods.clip_cov import ClipCovConfig, clip_cov
from stare_tir.algos.methods.entropy_80_20 import TopEntropyConfig, entropy_80_20
from stare_tir.algos.methods.entropy_adv import EntropyAdvConfig, entropy_adv
from stare_tir.algos.methods.kl_cov import KLCovConfig, kl_cov
from stare_tir.algos.methods.stapo import StapoConfig, stapo
from stare_tir.algos.policy_loss import POLICY_LOSSES, Clip, LossInputs, clip_loss
from stare_tir.algos.token_methods import TOKEN_METHODS, RunMethods, TokenEffect, TokenInputs, combine_effects

B, T = 6, 40


def batch(seed: int = 0, on_policy: bool = False):
    """Per-token log-probs (with grad), old log-probs, entropies, advantages and a ragged loss mask."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 4  # [B, T]
    logp = (old if on_policy else old + 0.1 * torch.randn(B, T, generator=g)).clone().requires_grad_()
    ent = torch.rand(B, T, generator=g) * 2
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()  # one advantage per sequence
    lengths = torch.randint(T // 2, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None, :] < lengths[:, None]).float()
    return logp, old, ent, adv, mask


def flat(x, mask):
    return x.detach()[mask.bool()]


def run_effect(effect: TokenEffect, logp, old, adv, mask, loss="clip", **kw):
    """Feed a method's effect into the loss as the trainer does (shaped advantages, weights, narrowed
    mask, KL coefficients); returns (loss, gradient of the log-probs)."""
    m = mask.bool()
    a = adv.clone()
    new_mask = mask.clone()
    weights, terms = None, {}
    if effect.advantages is not None:
        a[m] = effect.advantages.to(a.dtype)
    if effect.keep is not None:
        keep = torch.ones_like(m)
        keep[m] = effect.keep
        new_mask = mask * keep
    if effect.weights is not None:
        weights = torch.ones_like(adv)
        weights[m] = effect.weights
    for name, term in (effect.terms or {}).items():
        terms[name] = torch.zeros_like(adv)
        terms[name][m] = term
    logp.grad = None
    out, _ = POLICY_LOSSES.get(loss)(
        LossInputs(logp, old, a, new_mask, clip=Clip(low=0.2, high=0.28), token_weights=weights, terms=terms, **kw)
    )
    out.backward()
    return out.detach(), logp.grad.clone()


def grpo_ds(logp, old, adv, mask):
    logp.grad = None
    out, _ = clip_loss(LossInputs(logp, old, adv, mask, clip=Clip(low=0.2, high=0.28)))
    out.backward()
    return out.detach(), logp.grad.clone()


NEUTRAL = {
    "kl_cov": {"coef": 0.0},
    "clip_cov": {"lb": 1e6, "ub": 2e6},  # a covariance window nothing falls into
    "entropy_80_20": {"top_frac": 1.0},
    "entropy_adv": {"alpha": 0.0},
    "stapo": {"prob_max": 0.0},
    "steer": {"w_min": 1.0, "w_max": 1.0},  # every weight clamped to 1
    "eapo": {},  # no initial entropy yet (the first step): w = 1
    "stare": {"w": 1.0, "m": 1.0},  # omega of exactly 1 on L+ and L-
}


@pytest.mark.parametrize("name", sorted(TOKEN_METHODS.names()))
def test_each_method_is_grpo_ds_bit_for_bit_when_its_selection_is_empty_or_coefficient_zero(name):
    logp, old, ent, adv, mask = batch(1)
    settings = TOKEN_METHODS.config_of(name)(**NEUTRAL[name])
    method = RunMethods().get(name, settings)  # a stateful method: a fresh instance
    effect = method(TokenInputs(flat(old, mask), flat(ent, mask), flat(adv, mask)), settings)
    assert not effect.selected.any() or name == "entropy_80_20"  # 80/20 at 100% keeps (selects) all
    assert effect.keep is None and effect.terms is None
    if effect.weights is not None:  # STEER at w_min = w_max = 1: weights of exactly 1
        assert torch.equal(effect.weights, torch.ones_like(effect.weights))
    if effect.advantages is not None:  # entropy_adv with alpha 0: the same bits
        assert torch.equal(effect.advantages, flat(adv, mask))
    ref = grpo_ds(logp, old, adv, mask)
    got = run_effect(effect, logp, old, adv, mask)
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])


def test_kl_cov_loss_equals_grpo_ds_at_ratio_one_and_is_unclipped_elsewhere():
    # First (on-policy) update: rho = 1 exactly, where the clip and the dual clip are inactive.
    logp, old, ent, adv, mask = batch(2, on_policy=True)
    ref = grpo_ds(logp, old, adv, mask)
    got = run_effect(
        TokenEffect(selected=torch.zeros(int(mask.sum()), dtype=torch.bool)), logp, old, adv, mask, "kl_cov"
    )
    assert torch.equal(ref[0], got[0]) and torch.equal(ref[1], got[1])
    # Off-policy: the unclipped surrogate -A rho, token-mean.
    logp, old, ent, adv, mask = batch(3)
    loss, _ = POLICY_LOSSES.get("kl_cov")(LossInputs(logp, old, adv, mask, clip=Clip(dual_c=3.0)))
    expected = (-adv * torch.exp(logp - old) * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_kl_cov_selects_exactly_the_top_k_covariance_tokens_and_penalises_them():
    logp, old, ent, adv, mask = batch(4)
    lp, a = flat(old, mask), flat(adv, mask)
    n = lp.numel()
    e = kl_cov(TokenInputs(lp, flat(ent, mask), a), KLCovConfig(ratio=0.05, coef=0.7))
    k = max(1, int(n * 0.05))  # verl truncates
    assert int(e.selected.sum()) == k
    cov = (a.double() - a.double().mean()) * (lp.double() - lp.double().mean())
    assert cov[e.selected].min() >= cov[~e.selected].max()
    assert torch.equal(e.terms["kl_cov"], e.selected.float() * 0.7)
    # The penalty's gradient on a selected token is coef * sign(logp - old) on top of -A rho.
    _, g_pen = run_effect(e, logp, old, adv, mask, "kl_cov")
    _, g_plain = run_effect(TokenEffect(selected=torch.zeros_like(e.selected)), logp, old, adv, mask, "kl_cov")
    diff = (g_pen - g_plain)[mask.bool()] * mask.sum()
    sign = torch.sign(flat(logp, mask) - lp)
    assert torch.allclose(diff[e.selected], 0.7 * sign[e.selected], atol=1e-5)
    assert torch.equal(diff[~e.selected], torch.zeros_like(diff[~e.selected]))


def test_clip_cov_draws_exactly_its_count_inside_the_window_and_silences_them():
    logp, old, ent, adv, mask = batch(5)
    adv = adv * 4  # covariances of a few units, so the (1, 5) window holds candidates
    lp, a = flat(old, mask), flat(adv, mask)
    cov = (a.double() - a.double().mean()) * (lp.double() - lp.double().mean())
    cand = (cov > 1.0) & (cov < 5.0)
    assert cand.sum() > 3
    g = torch.Generator().manual_seed(0)
    e = clip_cov(TokenInputs(lp, flat(ent, mask), a, g), ClipCovConfig(ratio=0.02))
    assert int(e.selected.sum()) == min(max(1, int(lp.numel() * 0.02)), int(cand.sum()))
    assert not (e.selected & ~cand).any()
    again = clip_cov(TokenInputs(lp, flat(ent, mask), a, torch.Generator().manual_seed(0)), ClipCovConfig(ratio=0.02))
    assert torch.equal(again.selected, e.selected)  # seeded per step: a resumed run draws the same
    many = clip_cov(TokenInputs(lp, flat(ent, mask), a, g), ClipCovConfig(ratio=1.0))
    assert torch.equal(many.selected, cand)  # the count is capped by the candidates
    # Silenced: exactly zero gradient, while the token-mean keeps its normaliser (verl's corr = 0).
    loss, grad = run_effect(e, logp, old, adv, mask)
    assert torch.all(grad[mask.bool()][e.selected] == 0.0)
    assert torch.all(grad[mask.bool()][~e.selected] != 0.0)
    # The normaliser still counts them: the loss is GRPO-ds's with those tokens' terms set to 0.
    w = torch.ones_like(adv)
    w[mask.bool()] = (~e.selected).float()
    ref, _ = clip_loss(LossInputs(logp.detach(), old, adv * w, mask, clip=Clip(low=0.2, high=0.28)))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)


def test_80_20_keeps_exactly_the_ceiling_of_20_percent_and_renormalises_over_them():
    ent = torch.tensor([0.5, 0.1, 0.9, 0.3, 0.7] * 3)  # 15 tokens: 0.2 * 15 is 3 (float: 3.0000000000000004)
    e = entropy_80_20(TokenInputs(torch.zeros(15), ent, torch.ones(15)), TopEntropyConfig(top_frac=0.2))
    assert int(e.keep.sum()) == 3 and torch.equal(e.selected, e.keep)
    assert torch.equal(torch.nonzero(e.keep).squeeze(1), torch.tensor([2, 7, 12]))  # ties: lowest positions
    logp, old, ent, adv, mask = batch(6)
    e = entropy_80_20(TokenInputs(flat(old, mask), flat(ent, mask), flat(adv, mask)), TopEntropyConfig())
    n = int(mask.sum())
    assert int(e.keep.sum()) == math.ceil(0.2 * n - 1e-9)
    loss, grad = run_effect(e, logp, old, adv, mask)
    g = grad[mask.bool()]
    assert torch.all(g[~e.keep] == 0.0) and torch.all(g[e.keep] != 0.0)
    # The loss is the token-mean over the kept tokens only.
    sub = mask.clone()
    sub[mask.bool()] = e.keep.float()
    ref, _ = clip_loss(LossInputs(logp.detach(), old, adv, sub, clip=Clip(low=0.2, high=0.28)))
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)


def test_entropy_advantage_formula_and_signs():
    a = torch.tensor([2.0, -2.0, 0.5, -0.5, 0.0, 1e-6, -3.0])
    h = torch.tensor([1.0, 1.0, 5.0, 5.0, 3.0, 2.0, 0.0])
    e = entropy_adv(TokenInputs(torch.zeros(7), h, a), EntropyAdvConfig(alpha=0.4, kappa=2.0))
    expected = a + torch.minimum(0.4 * h, a.abs() / 2.0)
    assert torch.equal(e.advantages, expected)
    assert torch.equal(torch.sign(e.advantages), torch.sign(a))  # A = 0 stays 0
    assert torch.equal(e.selected, torch.tensor([True, True, True, True, False, True, False]))
    g = torch.Generator().manual_seed(7)
    a = torch.randn(10_000, generator=g) * 3
    e = entropy_adv(TokenInputs(torch.zeros_like(a), torch.rand(10_000, generator=g) * 20, a), EntropyAdvConfig())
    assert torch.equal(torch.sign(e.advantages), torch.sign(a))
    assert (e.advantages.abs() <= a.abs() * 1.5 + 1e-6).all() and (e.advantages - a >= 0).all()


def test_stapo_silences_exactly_the_positive_low_probability_low_entropy_tokens():
    logp, old, ent, adv, mask = batch(8)
    lp, h, a = flat(old, mask), flat(ent, mask), flat(adv, mask)
    lp = lp.clone()
    lp[::7] = -6.0  # p = 0.0025 < 0.01
    tau = float(torch.quantile(h.double(), 0.3))
    e = stapo(TokenInputs(lp, h, a), StapoConfig(prob_max=0.01, entropy_quantile=0.3))
    brute = (a > 0) & (lp.exp() < 0.01) & (h.double() < tau)
    assert brute.any() and torch.equal(e.selected, brute) and torch.equal(e.keep, ~brute)
    e_abs = stapo(TokenInputs(lp, h, a), StapoConfig(prob_max=0.01, entropy_max=1.0))
    assert torch.equal(e_abs.selected, (a > 0) & (lp.exp() < 0.01) & (h < 1.0))
    old2 = old.clone()
    old2[mask.bool()] = lp
    loss, grad = run_effect(e, logp, old2, adv, mask)
    assert torch.all(grad[mask.bool()][e.selected] == 0.0)
    # The rest: GRPO-ds over the remaining tokens (renormalised), bit for bit.
    sub = mask.clone()
    sub[mask.bool()] = (~e.selected).float()
    ref_loss, ref_grad = grpo_ds(logp, old2, adv, sub)
    assert torch.equal(loss, ref_loss) and torch.equal(grad, ref_grad)


def test_methods_compose_in_order():
    logp, old, ent, adv, mask = batch(9)
    lp, h, a = flat(old, mask), flat(ent, mask), flat(adv, mask)
    first = entropy_adv(TokenInputs(lp, h, a), EntropyAdvConfig())
    second = entropy_80_20(TokenInputs(lp, h, first.advantages), TopEntropyConfig())
    third = clip_cov(
        TokenInputs(lp, h, first.advantages * 4, torch.Generator().manual_seed(1)), ClipCovConfig(ratio=0.05)
    )
    both = combine_effects([first, second, third], a)
    assert torch.equal(both.advantages, first.advantages)
    assert torch.equal(both.keep, second.keep) and torch.equal(both.weights, third.weights)
    assert torch.equal(both.selected, first.selected | second.selected | third.selected)


def test_dapo_overlong_penalty_follows_its_formula():
    lengths = torch.tensor([0, 100, 128, 129, 144, 160])
    p = overlong_penalty(lengths, max_len=160, buffer=32, factor=1.0)
    assert p.tolist() == pytest.approx([0.0, 0.0, 0.0, -1 / 32, -0.5, -1.0])
    assert overlong_penalty(lengths, 160, 32, factor=0.5)[-1].item() == -0.5
    with pytest.raises(ValueError, match="overlong buffer"):
        overlong_penalty(lengths, 160, 0)


def test_unknown_method_lists_the_registered_ones():
    with pytest.raises(ValueError, match=r"'ppo': unknown token method; choose one of .*clip_cov.*stapo"):
        TOKEN_METHODS.get("ppo")
