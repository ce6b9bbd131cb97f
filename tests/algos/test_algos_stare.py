"""STARE token weights and controller: exact selection (ties, tiny sets, large inputs on the
sampled path), C2 semantics, GRPO equivalence when off, batch vs micro-batch scope; CPU only."""

import pytest
import torch

from stare_tir.algos import stare as S
from stare_tir.algos.policy_loss import LossInputs, clip_loss
from stare_tir.algos.stare import (
    StareConfig,
    StareController,
    num_selected,
    stare_token_weights,
    stare_token_weights_scoped,
)


def _reference(s, a, top_p, w, m, variant, mask=None):
    """Definition by full stable sort: highest surprisal first, lower index first on ties."""
    om = torch.ones(s.numel())
    keep = torch.ones(s.numel(), dtype=torch.bool) if mask is None else mask.bool()
    for sign, wt in ((1, w), (-1, m)):
        if sign < 0 and variant != "C2":
            continue
        c = torch.nonzero((a > 0 if sign > 0 else a < 0) & keep).squeeze(1)
        if c.numel() == 0:
            continue
        k = num_selected(top_p, c.numel())
        order = torch.sort(-s[c], stable=True).indices
        om[c[order[:k]]] = wt
    return om


def test_num_selected():
    assert num_selected(0.1, 30) == 3  # float 0.1 * 30 = 3.0000000000000004 must not become 4
    assert num_selected(0.1, 31) == 4
    assert num_selected(0.1, 10) == 1
    assert num_selected(0.1, 1) == 1  # at least one when non-empty
    assert num_selected(0.1, 0) == 0
    assert num_selected(0.25, 9) == 3
    assert num_selected(1.0, 7) == 7


# idx:        0    1    2    3    4    5    6    7    8
S_HAND = [0.1, 2.0, 0.5, 3.0, 1.0, 4.0, 0.2, 0.3, 9.0]
A_HAND = [1.0, 1.0, 1.0, 1.0, -1.0, -1.0, -1.0, -1.0, 0.0]


def test_hand_computed_o1_and_c2():
    s, a = torch.tensor(S_HAND), torch.tensor(A_HAND)
    om, met = stare_token_weights(s, a, top_p=0.25, w=1.5, m=0.5, variant="O1")
    # T+ = {0,1,2,3}, k = 1 -> token 3 (s = 3.0); token 8 has the top surprisal but A = 0
    assert om.tolist() == [1, 1, 1, 1.5, 1, 1, 1, 1, 1]
    assert met["stare/cand_pos_ratio"] == pytest.approx(4 / 9)
    assert met["stare/cand_neg_ratio"] == pytest.approx(4 / 9)
    assert met["stare/reweighted_frac"] == pytest.approx(1 / 9)
    assert met["stare/mean_weight"] == pytest.approx(9.5 / 9)
    om2, met2 = stare_token_weights(s, a, top_p=0.5, w=1.5, m=0.5, variant="C2")
    # k = 2 in each: T+ -> {3, 1}, T- -> {5, 4}
    assert om2.tolist() == [1, 1.5, 1, 1.5, 0.5, 0.5, 1, 1, 1]
    assert met2["stare/selected_pos"] == 2 and met2["stare/selected_neg"] == 2
    assert met2["stare/mean_weight"] == pytest.approx((5 + 3 + 1) / 9)


def test_c2_attenuates_only_l_minus():
    torch.manual_seed(0)
    s = torch.rand(500) * 4
    a = torch.randn(50, 1).expand(50, 10).reshape(-1).contiguous()
    a[::7] = 0.0
    o1, _ = stare_token_weights(s, a, top_p=0.2, w=1.2, m=0.7, variant="O1")
    c2, _ = stare_token_weights(s, a, top_p=0.2, w=1.2, m=0.7, variant="C2")
    changed = c2 != o1
    assert changed.sum() == num_selected(0.2, int((a < 0).sum()))
    assert torch.all(c2[changed] == 0.7)
    assert torch.all(a[changed] < 0)
    assert torch.all(c2[a >= 0] == o1[a >= 0])
    # the attenuated ones are the most surprising negative tokens
    assert s[changed].min() >= s[(a < 0) & ~changed].max()


def test_ties_exact_count_lower_index_first():
    a = torch.ones(5)
    om, _ = stare_token_weights(torch.tensor([5.0, 3.0, 3.0, 3.0, 1.0]), a, top_p=0.4, w=2.0)
    assert om.tolist() == [2, 2, 1, 1, 1]  # k = 2: token 0, then the first of the tied 3.0s
    om, _ = stare_token_weights(torch.full((10,), 0.7), a.new_ones(10), top_p=0.3, w=2.0)
    assert om.tolist() == [2, 2, 2] + [1] * 7


def test_tiny_and_empty_sets():
    s = torch.tensor([0.1, 0.2, 0.3])
    om, met = stare_token_weights(s, torch.tensor([-1.0, 2.0, -1.0]), top_p=0.1, w=1.3, variant="C2", m=0.8)
    assert om.tolist() == pytest.approx([1.0, 1.3, 0.8])  # |T+| = 1 -> selected; T-: 1 of 2
    om, met = stare_token_weights(s, torch.zeros(3), top_p=0.1, variant="C2")
    assert torch.equal(om, torch.ones(3))
    assert met["stare/reweighted_frac"] == 0.0
    om, met = stare_token_weights(torch.zeros(0), torch.zeros(0))
    assert om.numel() == 0 and met["stare/tokens"] == 0


def test_mask_excludes_tokens_and_counts():
    s = torch.tensor([[9.0, 1.0, 2.0], [8.0, 7.0, 0.5]])
    a = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = torch.tensor([[0, 1, 1], [1, 0, 1]])
    om, met = stare_token_weights(s, a, top_p=0.5, w=2.0, m=0.5, variant="C2", mask=mask)
    assert om.tolist() == [[1, 1, 2], [0.5, 1, 1]]
    assert met["stare/tokens"] == 4
    assert met["stare/cand_pos_ratio"] == 0.5


def test_weights_are_constants():
    s = torch.rand(20, requires_grad=True)
    om, _ = stare_token_weights(s, torch.randn(20))
    assert not om.requires_grad and om.grad_fn is None


@pytest.mark.parametrize("kind", ["continuous", "coarse_ties", "all_tied", "masked"])
def test_large_inputs_match_definition(kind, monkeypatch):
    """N above the sampling threshold: the sampled path must give the definition's exact set."""
    g = torch.Generator().manual_seed(7)
    n = 8 * S._SAMPLE + 12345
    s = torch.rand(n, generator=g) * 3
    if kind == "coarse_ties":
        s = torch.round(s * 8) / 8  # tens of thousands of ties at every level
    if kind == "all_tied":
        s = torch.full((n,), 1.25)
    a = torch.randn(n // 64 + 1, 1, generator=g).expand(-1, 64).reshape(-1)[:n].contiguous()
    mask = (torch.rand(n, generator=g) < 0.7) if kind == "masked" else None
    calls = []
    real = S._select_sampled
    monkeypatch.setattr(S, "_select_sampled", lambda *x: calls.append(r := real(*x)) or r)
    om, met = stare_token_weights(s, a, top_p=0.1, w=1.1, m=0.9, variant="C2", mask=mask)
    assert len(calls) == 1 and len(calls[0]) == 2
    assert all(c is not None for c in calls[0])  # the fast path was really exercised
    assert torch.equal(om, _reference(s, a, 0.1, 1.1, 0.9, "C2", mask))
    keep = torch.ones(n, dtype=torch.bool) if mask is None else mask
    assert met["stare/selected_pos"] == num_selected(0.1, int(((a > 0) & keep).sum()))
    assert met["stare/cand_neg_ratio"] == int(((a < 0) & keep).sum()) / int(keep.sum())


def test_unlucky_sample_falls_back_with_same_result(monkeypatch):
    n = 8 * S._SAMPLE + 100
    g = torch.Generator().manual_seed(3)
    s = torch.rand(n, generator=g)
    s[S._sample_positions(n, s.device)] += 5.0  # the sample sees only the largest values
    a = torch.ones(n)
    calls = []
    real = S._select_sampled
    monkeypatch.setattr(S, "_select_sampled", lambda *x: calls.append(r := real(*x)) or r)
    om, _ = stare_token_weights(s, a, top_p=0.3, w=1.1)
    assert calls == [[None]]
    assert torch.equal(om, _reference(s, a, 0.3, 1.1, 0.9, "O1"))


def test_batch_scope_equals_concatenation_and_differs_from_micro_batch():
    # micro-batch 1 is all high-surprisal, micro-batch 2 all low: a per-micro-batch selection
    # picks tokens from both, the batch selection only from the first.
    s1, s2 = torch.tensor([[5.0, 6.0, 7.0, 8.0]]), torch.tensor([[0.1, 0.2, 0.3, 0.4, 0.5]])
    a1, a2 = torch.ones(1, 4), torch.ones(1, 5)
    om_b, met_b = stare_token_weights_scoped([s1, s2], [a1, a2], scope="batch", top_p=0.25, w=2.0)
    om_cat, met_cat = stare_token_weights(torch.cat([s1.flatten(), s2.flatten()]), torch.ones(9), top_p=0.25, w=2.0)
    assert torch.equal(torch.cat([om_b[0].flatten(), om_b[1].flatten()]), om_cat)
    assert met_b == met_cat
    assert om_b[0].shape == (1, 4) and om_b[1].shape == (1, 5)
    # k = ceil(0.25 * 9) = 3 over the batch; 1 of 4 and 2 of 5 per micro-batch
    assert om_b[0].tolist() == [[1, 2, 2, 2]] and om_b[1].tolist() == [[1, 1, 1, 1, 1]]
    om_m, met_m = stare_token_weights_scoped([s1, s2], [a1, a2], scope="micro_batch", top_p=0.25, w=2.0)
    assert om_m[0].tolist() == [[1, 1, 1, 2]] and om_m[1].tolist() == [[1, 1, 1, 2, 2]]
    assert met_m["stare/selected_pos"] == 3 and met_m["stare/tokens"] == 9


def test_batch_scope_random_micro_batches():
    g = torch.Generator().manual_seed(5)
    ss = [torch.rand(3, 40, generator=g) for _ in range(4)]
    aa = [torch.randn(3, 1, generator=g).expand(3, 40).contiguous() for _ in range(4)]
    om, _ = stare_token_weights_scoped(ss, aa, scope="batch", top_p=0.1, variant="C2")
    ref = _reference(torch.cat([x.flatten() for x in ss]), torch.cat([x.flatten() for x in aa]), 0.1, 1.1, 0.9, "C2")
    assert torch.equal(torch.cat([x.flatten() for x in om]), ref)


def _loss_and_grad(lp, old, adv, mask, weights):
    loss, _ = clip_loss(LossInputs(lp, old, adv, mask, token_weights=weights))
    return loss, torch.autograd.grad(loss, lp)[0]


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    lp = (-torch.rand(4, 16, generator=g) * 2).requires_grad_()
    old = lp.detach() + 0.2 * torch.randn(4, 16, generator=g)
    adv = torch.tensor([[1.5], [-0.5], [0.7], [-1.2]]).expand(4, 16).contiguous()
    return lp, old, adv, torch.ones(4, 16)


def test_gate_off_or_unit_weights_reproduce_grpo_exactly():
    lp, old, adv, mask = _batch()
    base_loss, base_grad = _loss_and_grad(lp, old, adv, mask, None)
    ctrl = StareController(target_entropy=0.3)
    assert ctrl.update(0.9) is False  # entropy above target: gate off -> no weights at all
    weights = stare_token_weights(-old, adv)[0] if ctrl.gate_on else None
    off_loss, off_grad = _loss_and_grad(lp, old, adv, mask, weights)
    assert torch.equal(off_loss, base_loss) and torch.equal(off_grad, base_grad)
    # STARE on but with W = M = 1: omega == 1 everywhere, still bit-identical to GRPO
    omega, _ = stare_token_weights(-old, adv, w=1.0, m=1.0, variant="C2", top_p=0.5)
    one_loss, one_grad = _loss_and_grad(lp, old, adv, mask, omega)
    assert torch.equal(one_loss, base_loss) and torch.equal(one_grad, base_grad)
    # and with the gate on the update does change (the checks above are not vacuous)
    assert ctrl.update(0.1) is True
    on_loss, on_grad = _loss_and_grad(lp, old, adv, mask, stare_token_weights(-old, adv)[0])
    assert not torch.equal(on_grad, base_grad)


def test_stare_preserves_gradient_sign_and_scales_selected_tokens():
    lp, old, adv, mask = _batch(1)
    _, g0 = _loss_and_grad(lp, old, adv, mask, None)
    omega, _ = stare_token_weights(-old, adv, top_p=0.3, w=1.4, m=0.6, variant="C2")
    _, g1 = _loss_and_grad(lp, old, adv, mask, omega)
    assert (g0 != 0).sum() > 20
    assert torch.equal(torch.sign(g1), torch.sign(g0))
    torch.testing.assert_close(g1, g0 * omega)
    sel = omega != 1
    live = sel & (g0 != 0)  # clipped tokens have no gradient to scale
    assert live.any() and torch.all(g1[live].abs() != g0[live].abs())


def test_controller_gate_and_open_loop():
    c = StareController(target_entropy=0.3)
    assert c.update(0.29) is True and c.gate_on
    assert c.update(0.3) is False  # strictly below the target
    assert c.update(0.5) is False
    o = StareController(target_entropy=0.3, open_loop=True)
    assert o.update(5.0) is True
    assert not c.gate_on and o.gate_on
    # One name per quantity: the trainer logs stare/gate_on and entropy/batch.
    assert "stare/gate" not in c.metrics() and "stare/batch_entropy" not in c.metrics()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_controller_keeps_its_state_on_a_nonfinite_entropy_and_counts_it(bad):
    c = StareController(target_entropy=0.3, w=1.1, m=0.9, adaptive=True, adapt_rate=0.05)
    assert c.update(0.1) is True
    before = (c.gate_on, c.w, c.m, c.last_entropy, c.steps)
    assert c.update(bad) is True  # no raise: the previous gate stands
    assert (c.gate_on, c.w, c.m, c.last_entropy, c.steps) == before
    assert c.metrics()["stare/nonfinite_entropy_steps"] == 1.0
    c.update(0.9)  # a finite entropy moves the controller again
    assert c.gate_on is False and c.steps == 2
    restored = StareController(target_entropy=0.3)
    restored.load_state_dict(c.state_dict())
    assert restored.nonfinite_entropy_steps == 1


def test_controller_adaptive_schedule():
    c = StareController(target_entropy=0.3, w=1.1, m=0.9, adaptive=True, adapt_rate=0.05, w_max=1.2, m_min=0.8)
    c.update(0.1)  # below target: W up, M down
    assert (c.w, c.m) == pytest.approx((1.15, 0.85))
    c.update(0.1)
    c.update(0.1)  # clipped at w_max / m_min
    assert (c.w, c.m) == pytest.approx((1.2, 0.8))
    c.update(0.3)  # sign(0) = 0: unchanged
    assert (c.w, c.m) == pytest.approx((1.2, 0.8))
    for _ in range(10):
        c.update(0.9)  # above target: W down to 1, M up to 1
    assert (c.w, c.m) == (1.0, 1.0)
    fixed = StareController(adaptive=False)
    fixed.update(0.0)
    assert (fixed.w, fixed.m) == (1.1, 0.9)


def test_controller_state_dict_roundtrip():
    c = StareController(adaptive=True, adapt_rate=0.1)
    c.update(0.05)
    state = c.state_dict()
    d = StareController(adaptive=True, adapt_rate=0.1)
    d.load_state_dict(state)
    assert (d.w, d.m, d.gate_on, d.steps, d.last_entropy) == (c.w, c.m, True, 1, 0.05)
    c.update(0.05)
    d.update(0.05)
    assert d.state_dict() == c.state_dict()
    with pytest.raises(KeyError, match="steps"):
        d.load_state_dict({"w": 1.0, "m": 1.0, "gate_on": False})


def test_config_validation_and_from_config():
    cfg = StareConfig(variant="C2", w=1.3, m=0.7, target_entropy=0.2, open_loop=True)
    c = StareController.from_config(cfg)
    assert (c.w, c.m, c.target_entropy, c.open_loop) == (1.3, 0.7, 0.2, True)
    for bad, field in (
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(variant="C3"), "variant"),
        (dict(w=0.9), "w="),
        (dict(m=0.0), "m="),
        (dict(m_min=0.0), "m_min"),
        (dict(w=2.5), "w="),
    ):
        with pytest.raises(ValueError, match=field):
            StareConfig(**bad)
    with pytest.raises(ValueError, match="m="):
        StareController(m=1.5)
    with pytest.raises(ValueError, match="variant"):
        stare_token_weights(torch.ones(2), torch.ones(2), variant="X")


def test_large_top_p_uses_full_set(monkeypatch):
    # P = 0.99: the threshold sits too deep in the sample to bound, so no side is sampled
    n = 8 * S._SAMPLE + 7
    g = torch.Generator().manual_seed(11)
    s, a = torch.rand(n, generator=g), torch.randn(n, generator=g)
    calls = []
    real = S._select_sampled
    monkeypatch.setattr(S, "_select_sampled", lambda *x: calls.append(r := real(*x)) or r)
    om, _ = stare_token_weights(s, a, top_p=0.99, variant="C2")
    assert calls == [[None, None]]
    assert torch.equal(om, _reference(s, a, 0.99, 1.1, 0.9, "C2"))


def test_banded_selection_matches_plain_selection_for_any_t_hi():
    g = torch.Generator().manual_seed(2)
    vals = torch.round(torch.rand(500, generator=g) * 40) / 4  # many ties
    k = 120
    expected = set(S._top_positions(vals, k).tolist())
    kth = torch.sort(vals, descending=True).values[k - 1].item()
    n_above = int((vals > kth).sum())
    assert 0 < n_above < k  # ties straddle the threshold: the tie-break is exercised
    assert len(expected) == k and expected == set(torch.sort(-vals, stable=True).indices[:k].tolist())
    hi_vals = sorted(set(vals.tolist()))
    for t_hi in [None, kth - 2.0, kth - 0.25, kth, kth + 0.25, kth + 3.0] + hi_vals[::7]:
        got = S._top_positions_banded(vals, k, None if t_hi is None else torch.tensor(t_hi))
        assert got.numel() == k and set(got.tolist()) == expected, t_hi
    # distinct values: t_hi just below the k-th largest leaves exactly k above it
    distinct = torch.randperm(500, generator=g).float()
    t_exact = torch.tensor(500.0 - k - 1)  # the (k + 1)-th largest value
    got = S._top_positions_banded(distinct, k, t_exact)
    assert set(got.tolist()) == set(torch.nonzero(distinct >= 500 - k).squeeze(1).tolist())
