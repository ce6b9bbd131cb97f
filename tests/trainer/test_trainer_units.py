"""Pieces of the RL step, with small fakes: what reaches the loss, and how STARE is wired."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stare_tir.algos.methods.clip_cov import ClipCovConfig
from stare_tir.algos.methods.stapo import StapoConfig
from stare_tir.algos.methods.stare import Stare
from stare_tir.algos.stare import StareConfig, stare_token_weights
from stare_tir.algos.token_methods import RunMethods
from stare_tir.algos.verl_partition import VerlPartitionConfig
from stare_tir.rollout.backends.base import BackendBase
from stare_tir.rollout.engine import RolloutEngine
from stare_tir.rollout.trajectory import Trajectory
from stare_tir.train_config import AlgoConfig
from stare_tir.trainer import (
    collect_batch,
    drop_for_update,
    group_advantages,
    informative_groups,
    prepare_update,
)
from stare_tir.trainer.shaping import StepBatch


class NullBackend(BackendBase):
    """A backend of the rank's own that takes every push and generates nothing."""

    def update_weights(self, named_tensors, version=None) -> None:
        for _ in named_tensors:
            pass


def traj(
    group: int, reward: float, *, sandbox_error: bool = False, void: int = 0, finish: str = "answer", n_model: int = 3
) -> Trajectory:
    t = Trajectory(
        prompt_ids=[1, 2],
        group_id=group,
        reward=reward,
        sandbox_error=sandbox_error,
        void_turns=void,
        finish_reason=finish,
    )
    t.append([5] * n_model, [-0.5] * n_model, "model")
    t.append([7, 7], None, "obs")
    t.append([6], [-1.0], "model")
    return t


class OneRankLearner:
    """The collective helpers of Learner for a single process."""

    rank, world_size = 0, 1

    def all_reduce_sum(self, x):
        return x.clone()

    def all_gather_flat(self, x):
        return x.reshape(-1).clone(), slice(0, x.numel())

    def shard(self, items):
        return list(items)

    def micro_batch_plan(self, trajs):
        return [list(range(len(trajs)))[:2], list(range(len(trajs)))[2:]]


def shaped(learner, trajs, adv, lps, ents, algo, methods=None, seed=0, entropy=0.0, **kw):
    """prepare_update of these trajectories as a step's batch, with the run's token methods (fresh ones,
    having seen no entropy, unless given)."""
    methods = RunMethods() if methods is None else methods
    batch = StepBatch(list(trajs), list(trajs), {"entropy/batch": entropy}, list(adv), [0.0] * len(trajs), lps, ents)
    return prepare_update(learner, batch, algo, methods.resolve(algo.token_methods, algo.methods), seed, **kw)


def observed(algo, entropy):
    """The run's token methods after one step's batch entropy (STARE's gate set from it)."""
    methods = RunMethods()
    methods.observe(algo.token_methods, algo.methods, entropy)
    return methods


def test_sandbox_errors_and_filters_are_dropped_and_counted():
    trajs = [
        traj(0, 1.0),
        traj(0, -1.0, sandbox_error=True),
        traj(1, -1.0, void=1),
        traj(1, 1.0, finish="max_tokens"),
        traj(2, 0.0, finish="error"),
    ]
    kept, counts = drop_for_update(trajs, AlgoConfig(void_turns="drop", filter_overlong=True))
    assert kept == [trajs[0]]
    assert counts == {"sandbox_error": 1, "rollout_error": 1, "void_turn": 1, "overlong": 1}
    kept, counts = drop_for_update(trajs, AlgoConfig())
    assert trajs[1] not in kept and trajs[4] not in kept and len(kept) == 3


def test_informative_groups_need_two_members_and_different_rewards():
    trajs = [traj(0, 1.0), traj(0, 1.0), traj(1, 1.0), traj(1, -1.0), traj(2, -1.0)]
    groups = informative_groups(trajs)
    assert [[t.group_id for t in g] for g in groups] == [[1, 1]]


def test_group_advantages_are_normalised_per_group():
    trajs = [traj(0, 1.0), traj(0, -1.0), traj(1, 1.0), traj(1, 1.0)]
    adv, metrics = group_advantages(trajs, "grpo")
    assert adv[0] == pytest.approx(-adv[1]) and adv[0] > 0
    assert adv[2] == adv[3] == 0.0 and metrics["adv/zero_var_groups"] == 1.0


def test_stare_off_gate_means_plain_grpo_and_batch_scope_selects_globally():
    trajs = [traj(0, 1.0, n_model=4), traj(0, -1.0, n_model=4), traj(1, 1.0, n_model=4)]
    adv = [1.0, -1.0, 0.5]
    # Distinct surprisals on model tokens; observation tokens hold 0 like the recompute pass.
    old_lp = []
    for k, t in enumerate(trajs):
        lp = torch.tensor([-(0.1 * (j + 1) + k) for j in range(len(t.response_ids))])
        old_lp.append(lp * torch.tensor(t.loss_mask, dtype=torch.float32))
    ent = [torch.full_like(lp, 0.5) for lp in old_lp]
    learner = OneRankLearner()
    algo = AlgoConfig()  # algo.name=stare: the token method `stare`, target entropy 0.3
    assert algo.token_methods == ["stare"]
    inputs = shaped(learner, trajs, adv, old_lp, ent, algo, observed(algo, 0.5))  # above target: gate off
    # Gate off: exactly what GRPO-ds gets (no weights, the same trajectories and advantages).
    assert inputs.token_weights is None and inputs.trajs == trajs and inputs.advantages == adv
    assert inputs.old_logprobs is old_lp and inputs.metrics["algo/selected_frac"] == 0.0
    assert inputs.metrics["stare/gate_on"] == 0.0 and inputs.metrics["stare/reweighted_frac"] == 0.0
    assert "algo/stare/selected_frac" not in inputs.metrics  # STARE logs its own stare/* metrics

    algo = AlgoConfig(stare=StareConfig(top_p=0.2, variant="C2", w=1.5, m=0.5))
    inputs = shaped(learner, trajs, adv, old_lp, ent, algo, observed(algo, 0.1))  # below target: gate on
    omega = inputs.token_weights
    assert inputs.metrics["stare/gate_on"] == 1.0
    flat_s = torch.cat([-x for x in old_lp])
    flat_a = torch.cat([torch.full_like(x, a) for x, a in zip(old_lp, adv)])
    flat_m = torch.cat([torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs])
    expected, _ = stare_token_weights(flat_s, flat_a, mask=flat_m, top_p=0.2, w=1.5, m=0.5, variant="C2")
    assert torch.equal(torch.cat(omega), expected) and torch.equal(torch.cat(inputs.token_weights), expected)
    # Observation tokens are never reweighted.
    for t, w in zip(trajs, omega):
        assert torch.all(w[torch.tensor(t.loss_mask) == 0] == 1.0)
    assert (torch.cat(omega) == 1.5).any() and (torch.cat(omega) == 0.5).any()
    n_sel = int(((expected != 1.0) & flat_m).sum())
    assert inputs.metrics["algo/selected_frac"] == pytest.approx(n_sel / int(flat_m.sum()))


def test_stare_disabled_is_grpo_ds_and_logs_nothing_of_stare():
    trajs = [traj(0, 1.0, n_model=4), traj(0, -1.0, n_model=4)]
    lps, ents = recompute(trajs)
    algo = AlgoConfig(stare=StareConfig(enabled=False))
    assert algo.token_methods == ["stare"]
    methods = observed(algo, 0.0)  # below the target: the gate would be on
    inputs = shaped(OneRankLearner(), trajs, [1.0, -1.0], lps, ents, algo, methods)
    assert inputs.token_weights is None and not any(k.startswith("stare/") for k in inputs.metrics)
    assert methods.get("stare").state_dict()["steps"] == 0  # its controller never moved


def test_stare_lplus_s_gt_h_frac_counts_only_l_plus_tokens_above_their_entropy():
    from stare_tir.algos.token_methods import TokenInputs

    lp = torch.full((8,), -1.0)  # surprisal 1 everywhere: ties go to the lower positions
    adv = torch.tensor([1.0] * 4 + [-1.0] * 4)
    ent = torch.full((8,), 0.5)
    ent[0] = 2.0  # the first L+ token sits where entropy exceeds its surprisal
    for w, expected in ((1.5, 0.5), (1.0, None)):  # W = 1: L+ is not marked
        cfg = StareConfig(top_p=0.5, variant="C2", w=w, m=0.5, open_loop=True)
        stare = Stare(cfg)
        stare.observe(1.0)
        effect = stare(TokenInputs(lp, ent, adv), cfg)
        assert int(effect.selected.sum()) == (4 if w != 1.0 else 2)  # L+ = {0, 1}, L- = {4, 5}
        assert stare.step_metrics([effect])["stare/lplus_s_gt_h_frac"] == expected


class FakeEngine:
    configured = RolloutEngine.configured  # the real settings swap (collect_batch seeds each round)
    """Returns scripted trajectories per call; records what it was asked for."""

    def __init__(self, batches):
        self.batches = list(batches)
        self.calls = []

    def run(self, problems, n):
        self.calls.append((len(problems), n, self.cfg.seed))
        return self.batches.pop(0), {}


def test_dynamic_sampling_refills_and_never_keeps_sandbox_errors():
    from stare_tir.data import PromptSampler
    from stare_tir.train_config import TrainConfig

    cfg = TrainConfig()
    cfg.trainer.prompts_per_step = 2
    cfg.rollout.n_per_prompt = 2
    first = [
        traj(0, 1.0),
        traj(0, 1.0),  # equal rewards: not informative
        traj(1, 1.0),
        traj(1, -1.0, sandbox_error=True),
    ]  # one left after the drop
    second = [traj(0, 1.0), traj(0, -1.0), traj(1, -1.0), traj(1, 1.0)]
    engine = FakeEngine([first, second])
    engine.cfg = cfg.rollout
    run = SimpleNamespace(
        cfg=cfg,
        learner=OneRankLearner(),
        engine=engine,
        sampler=PromptSampler([{"id": str(i)} for i in range(10)], seed=0),
    )
    batch, rolled, metrics = collect_batch(run, step=1)
    assert len(engine.calls) == 2 and engine.calls[0][0] == 2 and engine.calls[1][0] == 2
    assert engine.calls[0][2] != engine.calls[1][2]  # every round samples with its own seed
    assert all(not t.sandbox_error for t in batch) and len(batch) == 4
    assert len(rolled) == 8
    assert metrics["dropped/sandbox_error"] == 1 and metrics["dropped/equal_reward_groups"] == 2
    assert len({t.group_id for t in batch}) == 2


class SkippingLearner(OneRankLearner):
    """A learner whose every update is non-finite (DeepSpeed skipped the step)."""

    def __init__(self):
        self.trained_on = []
        self.exports = 0

    def compute_logprobs_entropy(self, trajs):
        lps = [torch.full((len(t.response_ids),), -0.5) * torch.tensor(t.loss_mask) for t in trajs]
        return lps, [torch.full_like(lp, 0.2) for lp in lps]

    def train_step(self, trajs, advantages, omega, old_lp, **kw):
        self.trained_on.append(list(trajs))
        return {"loss": float("nan"), "step_skipped": 1.0}

    def export_weights(self):
        self.exports += 1
        return iter(())


def test_nonfinite_steps_are_skipped_then_stop_the_run_with_a_clear_error(tmp_path):
    from stare_tir.data import PromptSampler
    from stare_tir.train_config import TrainConfig
    from stare_tir.trainer import Run, rl_step

    cfg = TrainConfig()
    cfg.trainer.prompts_per_step = 1
    cfg.trainer.max_nonfinite_steps = 2
    cfg.rollout.n_per_prompt = 2
    batches = [[traj(0, 1.0), traj(0, -1.0, sandbox_error=True), traj(0, -1.0)] for _ in range(2)]
    engine = FakeEngine(batches)
    engine.cfg = cfg.rollout
    learner = SkippingLearner()
    run = Run(
        cfg=cfg,
        run_dir=tmp_path,
        learner=learner,
        parts=SimpleNamespace(engine=engine, backend=NullBackend(), tokenizer=None),
        sampler=PromptSampler([{"id": "a"}], seed=0),
        eval_problems=[],
        log=None,
    )
    metrics = rl_step(run, 1)
    assert metrics["update/nonfinite_in_row"] == 1.0 and run.nonfinite_in_row == 1
    assert learner.exports == 0 and metrics["update/synced"] == 0  # unchanged weights are not synced
    # The trajectory whose sandbox failed never reached the loss.
    assert all(not t.sandbox_error for t in learner.trained_on[0]) and len(learner.trained_on[0]) == 2
    with pytest.raises(FloatingPointError, match="2 consecutive steps"):
        rl_step(run, 2)


def test_rollout_means_are_weighted_over_ranks_finish_reasons_included():
    from stare_tir.rollout.engine import rollout_stats
    from stare_tir.trainer import global_means

    # Keys are sorted before the reduction: "finish/eos" < "reward/mean".
    class TwoRanks(OneRankLearner):
        world_size = 2

        def all_reduce_sum(self, x):  # the other rank: 3 trajectories, reward mean 1.0, none ended at eos
            return x + torch.tensor([0.0 * 3, 1.0 * 3, 3.0], dtype=x.dtype)

    out = global_means(TwoRanks(), {"reward/mean": -1.0, "finish/eos": 1.0}, count=1)
    assert out["reward/mean"] == pytest.approx((-1.0 + 3.0) / 4)
    assert out["finish/eos"] == pytest.approx(1 / 4)

    # Same key set whatever the trajectories (a rank with other finish reasons reduces the same keys).
    a = rollout_stats([traj(0, 1.0, finish="answer")])
    b = rollout_stats([traj(0, 1.0, finish="eos"), traj(1, -1.0, finish="max_tokens")])
    assert a.keys() == b.keys() and a["finish/answer"] == 1.0 and b["finish/eos"] == 0.5
    slow, fast = traj(0, -1.0), traj(1, 1.0)  # grading time and timeouts (reward info) per step
    slow.info.update(grade_s=3.0, grade_timeout=True)
    fast.info.update(grade_s=0.001, grade_timeout=False)
    c = rollout_stats([slow, fast])
    assert c["grade/seconds"] == pytest.approx(1.5005) and c["grade/timeout_rate"] == 0.5


# ----------------------------------------------------------------------------- the baselines' wiring


def recompute(trajs, seed=0):
    """Log-probs and entropies shaped like the recompute pass's (0 on tool-output tokens)."""
    g = torch.Generator().manual_seed(seed)
    lps, ents = [], []
    for t in trajs:
        m = torch.tensor(t.loss_mask, dtype=torch.float32)
        lps.append(-torch.rand(len(t.response_ids), generator=g) * 3 * m)
        ents.append(torch.rand(len(t.response_ids), generator=g) * m)
    return lps, ents


def test_void_turn_mask_zeroes_the_loss_mask_and_leaves_the_groups_other_advantages():
    trajs = [traj(0, 1.0), traj(0, -1.0, void=1), traj(0, -1.0), traj(1, 1.0), traj(1, -1.0)]
    lps, ents = recompute(trajs)
    keep_adv, _ = group_advantages(trajs, "grpo")
    inputs = shaped(OneRankLearner(), trajs, keep_adv, lps, ents, AlgoConfig(void_turns="mask"), seed=0)
    # The void trajectory stays in its group's statistics: every other advantage is unchanged ...
    assert inputs.advantages == keep_adv
    # ... and none of its tokens reaches the loss; the others keep their masks (same objects).
    assert sum(inputs.trajs[1].loss_mask) == 0 and trajs[1].loss_mask != inputs.trajs[1].loss_mask
    assert all(inputs.trajs[i] is trajs[i] for i in (0, 2, 3, 4))
    n_loss = sum(sum(t.loss_mask) for t in trajs)
    assert inputs.metrics["algo/void_masked"] == 1.0
    assert inputs.metrics["algo/selected_frac"] == pytest.approx(sum(trajs[1].loss_mask) / n_loss)
    # Dropping it instead (algo.void_turns=drop) changes its group's statistics.
    kept, counts = drop_for_update(trajs, AlgoConfig(void_turns="drop"))
    drop_adv, _ = group_advantages(kept, "grpo")
    assert counts["void_turn"] == 1 and drop_adv[0] != pytest.approx(keep_adv[0])


def test_token_methods_reach_the_learner_as_advantages_masks_weights_and_terms():
    trajs = [traj(g, r, n_model=8) for g in range(3) for r in (1.0, -1.0, -1.0)]
    lps, ents = recompute(trajs, seed=3)
    adv, _ = group_advantages(trajs, "grpo")
    learner = OneRankLearner()

    inp = shaped(learner, trajs, adv, lps, ents, AlgoConfig(name="entropy_adv"), seed=0)
    assert all(isinstance(a, torch.Tensor) for a in inp.advantages) and inp.token_weights is None
    for a, t, x in zip(inp.advantages, trajs, adv):
        model = torch.tensor(t.loss_mask, dtype=torch.bool)
        assert torch.all(torch.sign(a[model]) == torch.sign(torch.tensor(x)))

    inp = shaped(learner, trajs, adv, lps, ents, AlgoConfig(name="entropy_80_20"), seed=0)
    n_loss = sum(sum(t.loss_mask) for t in trajs)
    kept = sum(sum(t.loss_mask) for t in inp.trajs)
    assert kept == -(-2 * n_loss // 10) and inp.metrics["algo/entropy_80_20/selected_frac"] == kept / n_loss
    flat_ent = torch.cat(ents)[torch.cat([torch.tensor(t.loss_mask, dtype=torch.bool) for t in trajs])]
    kept_ent = torch.cat([e[torch.tensor(t.loss_mask, dtype=torch.bool)] for e, t in zip(ents, inp.trajs)])
    assert kept_ent.min() >= flat_ent.sort(descending=True).values[kept - 1]  # the highest entropies

    inp = shaped(learner, trajs, adv, lps, ents, AlgoConfig(name="kl_cov"), seed=0)
    coef = torch.cat(inp.terms["kl_cov"])
    assert int((coef > 0).sum()) == max(1, int(n_loss * 0.002)) and inp.token_weights is None

    algo = AlgoConfig(name="clip_cov", methods={"clip_cov": ClipCovConfig(ratio=0.1, lb=-10.0, ub=10.0)})
    a1 = shaped(learner, trajs, adv, lps, ents, algo, seed=5)
    a2 = shaped(learner, trajs, adv, lps, ents, algo, seed=5)
    w = torch.cat(a1.token_weights)
    assert int((w == 0).sum()) == int(n_loss * 0.1) and torch.equal(w, torch.cat(a2.token_weights))
    assert a1.trajs == trajs  # silenced, not removed: the normaliser still counts them


def test_verl_scope_and_aggregation_follow_verls_partition():
    from stare_tir.algos.verl_partition import verl_micro_batches
    from stare_tir.trainer import token_view

    trajs = []
    for g in range(4):
        for r in (1.0, -1.0):
            t = traj(g, r, n_model=3 + 5 * g)
            trajs.append(t)
    lps, ents = recompute(trajs, seed=1)
    adv, _ = group_advantages(trajs, "grpo")
    algo = AlgoConfig(scope="verl", loss_agg="verl", verl_partition=VerlPartitionConfig(ranks=2, token_budget=40))
    view = token_view(OneRankLearner(), trajs, adv, lps, ents, [torch.tensor(t.loss_mask) > 0 for t in trajs], algo)
    lens = [len(t.prompt_ids) + len(t.response_ids) for t in trajs]
    groups = [mb for rank in verl_micro_batches(lens, 2, 40) for mb in rank]
    assert len(groups) > 2
    pos = 0
    for i, t in enumerate(trajs):  # every token carries its trajectory's verl micro-batch
        gid = next(k for k, mb in enumerate(groups) if i in mb)
        assert torch.all(view.group[pos : pos + len(t.response_ids)] == gid)
        pos += len(t.response_ids)
    # loss_agg=verl: the learner's token-mean with these weights is verl's loss.
    from stare_tir.algos.policy_loss import LossInputs, clip_loss

    inp = shaped(OneRankLearner(), trajs, adv, lps, ents, algo, seed=0)
    r = max(len(t.response_ids) for t in trajs)

    def pad(xs, fill=0.0):
        return torch.stack([torch.cat([x, torch.full((r - len(x),), fill)]) for x in xs])

    mask = pad([torch.tensor(t.loss_mask, dtype=torch.float32) for t in trajs])
    logp, old = pad(lps) + 0.05 * mask, pad(lps)
    adv_tok = torch.tensor(adv)[:, None] * mask
    ours, _ = clip_loss(
        LossInputs(logp, old, adv_tok, mask, token_weights=pad(inp.token_weights, 1.0), global_tokens=float(mask.sum()))
    )
    verl = sum(
        len(mb) / len(trajs) * clip_loss(LossInputs(logp[mb], old[mb], adv_tok[mb], mask[mb]))[0] for mb in groups
    )
    assert ours.item() == pytest.approx(verl.item(), rel=1e-5)


def test_ratio_one_on_policy_hands_no_old_logprobs_and_folds_tis_into_the_weights():
    from stare_tir.algos.policy_loss import truncated_is_weights

    trajs = [traj(0, 1.0), traj(0, -1.0)]
    lps, ents = recompute(trajs)
    adv, _ = group_advantages(trajs, "grpo")
    inp = shaped(OneRankLearner(), trajs, adv, lps, ents, AlgoConfig(ratio_one_on_policy=True), seed=0)
    assert inp.old_logprobs is None and inp.token_weights is None
    algo = AlgoConfig(ratio_one_on_policy=True, tis_cap=2.0)
    inp = shaped(OneRankLearner(), trajs, adv, lps, ents, algo, seed=0)
    assert inp.tis_cap is None
    for w, t, lp in zip(inp.token_weights, trajs, lps):
        expected = truncated_is_weights(lp, torch.tensor(t.rollout_logprobs), torch.tensor(t.loss_mask), 2.0)
        assert torch.equal(w, expected)
    with pytest.raises(ValueError, match="ppo_epochs=1"):
        AlgoConfig(ratio_one_on_policy=True, ppo_epochs=2)


def test_dapo_overlong_penalty_shapes_rewards_after_the_informative_filter():
    from stare_tir.trainer import reward_penalties

    def long(group, reward, n):
        t = traj(group, reward, n_model=n)
        return t

    trajs = [long(0, -1.0, 10), long(0, -1.0, 150)]  # all wrong: not informative, whatever the lengths
    assert informative_groups(trajs) == []
    algo = AlgoConfig(name="dapo")
    pen = reward_penalties(trajs, algo, max_len=160)  # L_cache = 32: penalty from 128 tokens on
    assert pen[0] == 0.0 and pen[1] == pytest.approx(-(len(trajs[1].response_ids) - 128) / 32)
    assert reward_penalties(trajs, AlgoConfig(name="grpo_ds"), 160) == [0.0, 0.0]


class GroupsEngine:
    """Problems with an even id give informative groups (rewards 1, -1, ...), odd ones equal rewards.
    Records each call's problem ids and seed."""

    configured = RolloutEngine.configured

    def __init__(self, cfg):
        self.cfg = cfg
        self.calls = []

    def run(self, problems, n):
        self.calls.append(([p["id"] for p in problems], self.cfg.seed))
        out = []
        for gi, p in enumerate(problems):
            informative = int(p["id"]) % 2 == 0
            out += [traj(gi, 1.0 if (informative and s == 0) else -1.0) for s in range(n)]
        return out, {}


def sampling_run(k: int, want: int = 4, rounds: int = 3):
    from stare_tir.data import PromptSampler
    from stare_tir.train_config import TrainConfig

    cfg = TrainConfig()
    cfg.trainer.prompts_per_step = want
    cfg.rollout.n_per_prompt = 2
    cfg.algo.oversample = k
    cfg.algo.dynamic_sampling_rounds = rounds
    engine = GroupsEngine(cfg.rollout)
    sampler = PromptSampler([{"id": str(i)} for i in range(40)], seed=0)
    return SimpleNamespace(cfg=cfg, learner=OneRankLearner(), engine=engine, sampler=sampler)


def test_oversampling_fills_the_batch_behind_one_barrier_and_counts_the_leftover():
    run = sampling_run(k=3)  # 12 prompts for 4 groups; about half are informative
    batch, rolled, m = collect_batch(run, step=1)
    assert len(run.engine.calls) == 1 and m["batch/sampling_rounds"] == 1.0
    informative = sum(int(i) % 2 == 0 for i in run.engine.calls[0][0])
    assert m["batch/groups"] == 4 and m["batch/leftover_groups"] == informative - 4
    assert m["batch/prompts"] == 12 and len(rolled) == 24 and len(batch) == 8
    # The first informative groups, in prompt order, make the batch.
    ids = run.engine.calls[0][0]
    first = [ids.index(i) for i in ids if int(i) % 2 == 0][:4]
    assert sorted({t.group_id for t in batch}) == first

    run = sampling_run(k=1)  # without it: a barrier per refill round
    _, _, m = collect_batch(run, step=1)
    assert m["batch/sampling_rounds"] == len(run.engine.calls) > 1
    assert [len(c[0]) for c in run.engine.calls][0] == 4  # then only the missing groups
    assert m["batch/prompts"] == sum(len(c[0]) for c in run.engine.calls)


def test_sampling_rounds_count_the_rounds_that_ran():
    """A batch filled in round 1 reports 1 round (it reported 2: the loop's exit check counted)."""
    run = sampling_run(k=8, rounds=3)
    _, _, m = collect_batch(run, step=1)
    assert len(run.engine.calls) == 1 and m["batch/sampling_rounds"] == 1.0


def test_oversampling_resumes_exactly():
    straight = sampling_run(k=3)
    collect_batch(straight, step=1)
    state = straight.sampler.state_dict()
    b2, _, m2 = collect_batch(straight, step=2)

    resumed = sampling_run(k=3)  # a fresh process: the sampler from the checkpoint after step 1
    resumed.sampler.load_state_dict(state)
    r2, _, n2 = collect_batch(resumed, step=2)
    assert resumed.engine.calls == straight.engine.calls[1:]  # same prompts, same seeds
    assert [t.group_id for t in r2] == [t.group_id for t in b2] and m2 == n2


def test_official_recipe_and_baseline_configs_hold_their_values():
    from pathlib import Path

    from stare_tir.config import load_config
    from stare_tir.train_config import TrainConfig

    configs = Path(__file__).resolve().parents[2] / "configs"
    off = load_config(TrainConfig, configs / "retool_qwen2.5_7b_stare_official.yaml").algo
    assert (off.name, off.dual_clip_c, off.stare.w_max, off.loss_agg, off.scope) == ("stare", 10.0, 1.5, "verl", "verl")
    assert (off.verl_partition.ranks, off.verl_partition.token_budget) == (16, 8192)
    assert off.ratio_one_on_policy and not off.filter_overlong and not off.overlong_penalty.enabled
    assert (off.oversample, off.dynamic_sampling_rounds) == (3, 10)  # 192-prompt rounds, up to 10
    full = load_config(TrainConfig, configs / "retool_qwen2.5_7b_stare_official.yaml")
    assert full.trainer.prompts_per_step * off.oversample == 192 and full.rollout.n_per_prompt == 8
    # The official budget holds the longest prompt (1024) + response.
    assert 1024 + full.rollout.max_total_tokens <= off.verl_partition.token_budget
    for name, method in [
        ("dapo", []),
        ("kl_cov", ["kl_cov"]),
        ("clip_cov", ["clip_cov"]),
        ("entropy_80_20", ["entropy_80_20"]),
        ("entropy_adv", ["entropy_adv"]),
        ("stapo", ["stapo"]),
    ]:
        algo = load_config(TrainConfig, configs / f"retool_qwen2.5_7b_{name}.yaml").algo
        assert algo.name == name and algo.token_methods == method and algo.oversample == 3
    assert load_config(TrainConfig, configs / "retool_qwen2.5_7b_dapo.yaml").algo.overlong_penalty.enabled
    assert load_config(TrainConfig, configs / "retool_qwen2.5_7b_simpletir.yaml").algo.void_turns == "mask"
    for name in ("stare", "grpo_ds"):  # the 7B configs over-sample as the official recipe does
        assert load_config(TrainConfig, configs / f"retool_qwen2.5_7b_{name}.yaml").algo.oversample == 3


class ThreadRank(OneRankLearner):
    """One of `world` ranks simulated by threads: all-gather and all-reduce through a barrier."""

    def __init__(self, rank, world, shared, barrier):
        self.rank, self.world_size, self.shared, self.barrier = rank, world, shared, barrier

    def _exchange(self, x):
        self.barrier.wait()
        self.shared[self.rank] = x.clone()
        self.barrier.wait()
        parts = [self.shared[r] for r in range(self.world_size)]
        self.barrier.wait()
        return parts

    def all_reduce_sum(self, x):
        return sum(self._exchange(x))

    def all_gather_flat(self, x):
        parts = self._exchange(x.reshape(-1))
        start = sum(p.numel() for p in parts[: self.rank])
        return torch.cat(parts), slice(start, start + parts[self.rank].numel())


@pytest.mark.parametrize("scope", ["batch", "verl"])
def test_selections_do_not_depend_on_how_the_batch_is_split_over_ranks(scope):
    import threading

    trajs = [traj(g, r, n_model=2 + (3 * g + int(r > 0)) % 7) for g in range(6) for r in (1.0, -1.0, -1.0)]
    lps, ents = recompute(trajs, seed=4)
    adv, _ = group_advantages(trajs, "grpo")
    algo = AlgoConfig(
        name="stare",
        token_methods=["entropy_adv", "stapo", "kl_cov"],
        scope=scope,
        loss_agg="verl" if scope == "verl" else "token-mean",
        verl_partition=VerlPartitionConfig(ranks=3, token_budget=30),
        stare=StareConfig(top_p=0.3, variant="C2", w=1.5, m=0.5),
        methods={"stapo": StapoConfig(prob_max=0.2, entropy_quantile=0.5)},
    )
    assert algo.token_methods == ["entropy_adv", "stapo", "kl_cov", "stare"]  # STARE on top
    methods = observed(algo, 0.0)
    whole = shaped(OneRankLearner(), trajs, adv, lps, ents, algo, methods, seed=3)
    assert any((w != 1.0).any() for w in whole.token_weights)  # STARE (and verl's weights) acted
    assert any(a.loss_mask != b.loss_mask for a, b in zip(whole.trajs, trajs))  # STAPO silenced some

    halves = [list(range(0, 9)), list(range(9, 18))]  # rank-major: rank 0 holds the first half
    out, shared, barrier = {}, {}, threading.Barrier(2)

    def rank(r):
        idx = halves[r]
        out[r] = shaped(
            ThreadRank(r, 2, shared, barrier),
            [trajs[i] for i in idx],
            [adv[i] for i in idx],
            [lps[i] for i in idx],
            [ents[i] for i in idx],
            algo,
            methods,
            seed=3,
        )

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    split_w = out[0].token_weights + out[1].token_weights
    assert all(torch.equal(a, b) for a, b in zip(whole.token_weights, split_w))
    assert all(torch.equal(a, b) for a, b in zip(whole.advantages, out[0].advantages + out[1].advantages))
    assert [t.loss_mask for t in whole.trajs] == [t.loss_mask for t in out[0].trajs + out[1].trajs]
    whole_kl = whole.terms["kl_cov"]
    assert all(torch.equal(a, b) for a, b in zip(whole_kl, out[0].terms["kl_cov"] + out[1].terms["kl_cov"]))
    assert whole.metrics == out[0].metrics == out[1].metrics
