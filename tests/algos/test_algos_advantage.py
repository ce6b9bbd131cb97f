"""Group-normalized advantages (GRPO / Dr. GRPO): hand-computed cases; CPU only."""

import math

import pytest
import torch

from stare_tir.algos.advantage import (
    ADVANTAGE_ESTIMATORS,
    broadcast_to_tokens,
    compute_group_advantages,
)


def _case():
    # group 0: {1, 0, 1, 1}, mean 0.75, unbiased std sqrt((3 * 0.25^2 + 0.75^2) / 3) = 0.5
    # group 7: {0, 0} zero variance; group 3: single member (zero variance by definition)
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 5.0])
    groups = torch.tensor([0, 0, 0, 0, 7, 7, 3])
    return rewards, groups


def test_grpo_hand_computed():
    r, g = _case()
    adv, met = compute_group_advantages(r, g, norm_by_std=True, eps=0.0)
    # deviations 0.25, -0.75, 0.25, 0.25 divided by std 0.5
    torch.testing.assert_close(adv, torch.tensor([0.5, -1.5, 0.5, 0.5, 0.0, 0.0, 0.0]))
    assert met["adv/num_groups"] == 3
    assert met["adv/zero_var_groups"] == 2
    assert met["adv/zero_var_frac"] == pytest.approx(2 / 3)


def test_eps_enters_denominator():
    r, g = _case()
    adv, _ = compute_group_advantages(r, g, norm_by_std=True, eps=0.5)
    assert adv[1].item() == pytest.approx(-0.75 / 1.0)


def test_drgrpo_no_std():
    r, g = _case()
    adv, met = compute_group_advantages(r, g, norm_by_std=False)
    torch.testing.assert_close(adv, torch.tensor([0.25, -0.75, 0.25, 0.25, 0.0, 0.0, 0.0]))
    assert met["adv/zero_var_groups"] == 2


def test_zero_variance_is_exactly_zero():
    # 0.1 * 3 / 3 != 0.1 in float: a float std test could leave tiny non-zero advantages.
    r = torch.tensor([0.1, 0.1, 0.1, 1.0, -1.0])
    g = torch.tensor([4, 4, 4, 9, 9])
    adv, met = compute_group_advantages(r, g)
    assert torch.equal(adv[:3], torch.zeros(3))
    assert met["adv/zero_var_groups"] == 1
    assert adv[3].item() == pytest.approx(1 / math.sqrt(2), rel=1e-5)


def test_matches_torch_std_on_random_groups():
    torch.manual_seed(0)
    g = torch.randint(0, 5, (64,))
    r = torch.randn(64)
    adv, _ = compute_group_advantages(r, g, eps=1e-6)
    for k in g.unique():
        sel = g == k
        x = r[sel]
        torch.testing.assert_close(adv[sel], (x - x.mean()) / (x.std() + 1e-6))


def test_registry():
    r, g = _case()
    assert set(ADVANTAGE_ESTIMATORS.names()) >= {"grpo", "drgrpo"}
    torch.testing.assert_close(
        ADVANTAGE_ESTIMATORS.get("grpo")(r, g)[0], compute_group_advantages(r, g, norm_by_std=True)[0]
    )
    torch.testing.assert_close(
        ADVANTAGE_ESTIMATORS.get("drgrpo")(r, g)[0], compute_group_advantages(r, g, norm_by_std=False)[0]
    )
    with pytest.raises(ValueError, match="drgrpo"):
        ADVANTAGE_ESTIMATORS.get("nope")


def test_shape_errors():
    with pytest.raises(ValueError, match="1-D"):
        compute_group_advantages(torch.zeros(3), torch.zeros(4, dtype=torch.long))


def test_broadcast_to_tokens():
    adv = torch.tensor([2.0, -1.0])
    mask = torch.tensor([[1, 1, 0], [0, 1, 1]])
    assert torch.equal(broadcast_to_tokens(adv, mask), torch.tensor([[2.0, 2.0, 0.0], [0.0, -1.0, -1.0]]))
