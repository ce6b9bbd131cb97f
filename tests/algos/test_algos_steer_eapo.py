"""STEER's and EAPO's weights against their formulas, their neutral settings, the initial entropy in
EAPO's state, verl's mini-batch layout, the consecutive mini-batch cut and the new config keys."""

from __future__ import annotations

import math

import pytest
import torch

from stare_tir.algos.methods.eapo import Eapo, EapoConfig
from stare_tir.algos.methods.steer import SteerConfig, steer
from stare_tir.algos.token_methods import TokenInputs
from stare_tir.algos.verl_partition import verl_micro_batches, verl_mini_batches
from stare_tir.config import ConfigError, load_config
from stare_tir.train_config import TrainConfig


def _inputs(n: int = 64, seed: int = 0) -> TokenInputs:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, 5, generator=g) * 2
    logp_all = torch.log_softmax(logits, -1)
    lp = logp_all[:, 0]
    ent = -(logp_all.exp() * logp_all).sum(-1)
    adv = torch.randn(n, generator=g).sign() * torch.rand(n, generator=g)
    old = lp + 0.05 * torch.randn(n, generator=g)
    return TokenInputs(lp, ent, adv, None, old)


def _omega(t: TokenInputs) -> torch.Tensor:
    """The paper's Omega_t = |A / pi_old * pi (1 - pi) (log pi + H)|, written out in float64."""
    p = t.logprobs.double().exp()
    return (t.advantages.double() / t.old_logprobs.double().exp() * p * (1 - p) * (p.log() + t.entropy.double())).abs()


def test_steer_exponential_follows_its_formula_and_floors_the_largest_omega():
    t = _inputs()
    e = steer(t, SteerConfig())  # the authors' run: exponential, w_min 0.8
    om = _omega(t)
    k = -math.log(0.8) / max(float(om.max()), 0.02)
    want = torch.exp(-k * om).clamp(0.8, 1.0).float()
    assert torch.allclose(e.weights, want, atol=1e-6)
    assert e.weights.min() >= 0.8 and e.weights.max() <= 1.0 and bool((e.weights < 1.0).any())
    if float(om.max()) >= 0.02:  # the token of largest Omega gets w_min
        assert float(e.weights[int(om.argmax())]) == pytest.approx(0.8, abs=1e-6)
    assert torch.equal(e.selected, e.weights != 1.0)


def test_steer_linear_maps_omegas_range_onto_w_max_to_w_min():
    t = _inputs(seed=1)
    e = steer(t, SteerConfig(mode="linear", w_min=0.8, w_max=1.2))
    om = _omega(t)
    assert float(e.weights[int(om.argmin())]) == pytest.approx(1.2, abs=1e-6)
    assert float(e.weights[int(om.argmax())]) == pytest.approx(0.8, abs=1e-6)
    # all-equal Omega (A = 0 everywhere): the midpoint
    flat = steer(TokenInputs(t.logprobs, t.entropy, torch.zeros_like(t.advantages)), SteerConfig("linear", 0.8, 1.2))
    assert torch.allclose(flat.weights, torch.full_like(flat.weights, 1.0))


@pytest.mark.parametrize("mode", ["exponential", "linear"])
def test_steer_neutral_weights_are_exactly_one(mode):
    e = steer(_inputs(seed=2), SteerConfig(mode=mode, w_min=1.0, w_max=1.0))
    assert bool((e.weights == 1.0).all()) and not bool(e.selected.any())


def test_steer_without_old_logprobs_uses_the_current_ones():
    t = _inputs(seed=3)
    same = TokenInputs(t.logprobs, t.entropy, t.advantages, None, t.logprobs.clone())
    assert torch.equal(steer(TokenInputs(t.logprobs, t.entropy, t.advantages), SteerConfig()).weights,
                       steer(same, SteerConfig()).weights)  # fmt: skip


def test_steer_refuses_bad_settings():
    with pytest.raises(ValueError, match="w_min"):
        SteerConfig(w_min=0.0)
    with pytest.raises(ValueError, match="w_min"):
        SteerConfig(w_min=1.0, w_max=0.9)
    with pytest.raises(ValueError, match="mode"):
        SteerConfig(mode="cubic")


def test_eapo_weights_positive_samples_by_the_entropy_ratio():
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0, -0.5])
    z = torch.zeros(5)

    def w(h_t, h_0, **kw):
        method = Eapo(EapoConfig(**kw))
        method.observe(h_0)  # the first step's entropy is H_0
        return method(TokenInputs(z, z, adv, batch_entropy=h_t), EapoConfig(**kw)).weights

    assert torch.equal(w(0.4, 0.4), torch.ones(5))  # H_t = H_0: the first step is GRPO-ds
    falling = w(0.2, 0.4)
    assert torch.allclose(falling, torch.tensor([0.5, 1.0, 0.5, 1.0, 1.0]))  # down while entropy falls
    assert torch.allclose(w(0.6, 0.4), torch.tensor([1.5, 1.0, 1.5, 1.0, 1.0]))  # up while it rises
    assert torch.allclose(w(0.6, 0.4, alpha=2.0, w_max=2.0), torch.tensor([2.0, 1.0, 2.0, 1.0, 1.0]))
    assert torch.equal(w(0.2, 0.4, alpha=0.0), torch.ones(5))  # alpha = 0: neutral
    none = Eapo()(TokenInputs(z, z, adv), EapoConfig())  # no entropies given: no change
    assert none.weights is None and not bool(none.selected.any())


def test_eapo_keeps_the_first_finite_entropy_in_its_state():
    c = Eapo()
    c.observe(float("nan"))
    assert c.initial_entropy is None
    c.observe(0.7)
    c.observe(0.3)
    assert c.initial_entropy == 0.7
    d = Eapo()
    d.load_state_dict(c.state_dict())
    assert d.initial_entropy == 0.7
    d.load_state_dict({})  # a state without it (a run that had not measured one)
    assert d.initial_entropy is None


def test_verl_mini_batches_of_one_is_the_one_mini_batch_layout_and_k_cuts_every_rank():
    g = torch.Generator().manual_seed(0)
    lens = (torch.randint(50, 400, (64,), generator=g)).tolist()
    assert verl_mini_batches(lens, 4, 1200, 1) == [verl_micro_batches(lens, 4, 1200)]
    layout = verl_mini_batches(lens, 4, 1200, 4)
    seen = sorted(i for mini in layout for rank in mini for mb in rank for i in mb)
    assert seen == list(range(64))  # disjoint, covering
    assert all(sum(len(mb) for mb in rank) == 4 for mini in layout for rank in mini)  # 16 per rank / 4
    with pytest.raises(ValueError, match="n_mini"):
        verl_mini_batches(lens, 4, 1200, 0)


def test_consecutive_runs_cut_evenly():
    from stare_tir.trainer.mini_batches import consecutive_runs

    assert consecutive_runs(10, 4) == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    assert consecutive_runs(2, 4) == [[0], [1], [], []]


def test_mini_batch_size_and_presets_in_the_config():
    cfg = load_config(TrainConfig, None, ["trainer.prompts_per_step=16", "algo.ppo_mini_batch_size=4"])
    assert cfg.algo.mini_batches(16) == 4
    assert load_config(TrainConfig, None, []).algo.mini_batches(16) == 1
    with pytest.raises(ConfigError, match="does not divide trainer.prompts_per_step=16"):
        load_config(TrainConfig, None, ["trainer.prompts_per_step=16", "algo.ppo_mini_batch_size=3"])
    steer_cfg = load_config(TrainConfig, None, ["algo.name=steer"]).algo
    assert steer_cfg.token_methods == ["steer"] and steer_cfg.scope == "micro_batch"
    assert steer_cfg.methods["steer"] == SteerConfig()
    assert load_config(TrainConfig, None, ["algo.name=steer", "algo.scope=batch"]).algo.scope == "batch"
    justrl = load_config(TrainConfig, None, ["algo.name=justrl"]).algo
    grpo_ds = load_config(TrainConfig, None, ["algo.name=grpo_ds"]).algo
    assert not justrl.dynamic_sampling and justrl.clip_high == 0.28 and justrl.token_methods == []
    assert not justrl.overlong_penalty.enabled and not justrl.filter_overlong
    # its neutral setting: with dynamic sampling back on it is GRPO-ds
    back = load_config(TrainConfig, None, ["algo.name=justrl", "algo.dynamic_sampling=true"]).algo
    assert {**vars(back), "name": ""} == {**vars(grpo_ds), "name": ""}
    assert load_config(TrainConfig, None, ["algo.name=eapo"]).algo.token_methods == ["eapo"]
