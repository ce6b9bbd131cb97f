"""Every baseline preset trains the tiny config for real (DeepSpeed learner, HF rollouts, local sandbox)
and logs algo/selected_frac; so do the official recipe's options (verl scope and aggregation, ratio 1).

One short SFT, then one learner and one rollout engine for all of them: each method takes the next
steps of the same run, so the whole test costs one start-up."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
from pathlib import Path

import pytest
import torch

from stare_tir.app.pipeline import sft_stage
from stare_tir.config import load_config
from stare_tir.model import resolve_model_path
from stare_tir.train_config import TrainConfig
from stare_tir.trainer import build_run, close_run, rl_step

ROOT = Path(__file__).resolve().parents[2]
# (overrides, the method's own selected-fraction key or None)
RUNS = {
    "dapo": (["algo.name=dapo"], None),
    "kl_cov": (["algo.name=kl_cov"], "algo/kl_cov/selected_frac"),
    "clip_cov": (["algo.name=clip_cov"], "algo/clip_cov/selected_frac"),
    "entropy_80_20": (["algo.name=entropy_80_20"], "algo/entropy_80_20/selected_frac"),
    "entropy_adv": (["algo.name=entropy_adv"], "algo/entropy_adv/selected_frac"),
    "stapo": (["algo.name=stapo"], "algo/stapo/selected_frac"),
    # KL-Cov's penalty acts from the second pass over a batch: through its named term `kl_cov`.
    "kl_cov_2ep": (["algo.name=kl_cov", "algo.ppo_epochs=2", "algo.kl_cov.ratio=0.2"], "algo/kl_cov/selected_frac"),
    "official": (
        [
            "algo.name=stare",
            "algo.stare.target_entropy=100",
            "algo.scope=verl",
            "algo.loss_agg=verl",
            "algo.verl_partition.ranks=2",
            "algo.verl_partition.token_budget=160",
            "algo.ratio_one_on_policy=true",
            "algo.void_turns=mask",
            "algo.dual_clip_c=10",
        ],
        "stare/reweighted_frac",
    ),
}


def missing_from_metrics_doc(keys) -> str:
    """tests/core/test_core_metrics_doc.py's check (tests are no package: load it by path)."""
    spec = importlib.util.spec_from_file_location("metrics_doc", ROOT / "tests" / "core" / "test_core_metrics_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.missing_from_doc(keys)


def first_weight(run) -> torch.Tensor:
    return next(run.learner.model.parameters()).detach().clone()


@pytest.mark.slow
def test_every_baseline_trains_the_tiny_config_and_logs_selected_frac(tmp_path, tiny_run):
    tiny = ROOT / "configs" / "tiny_cpu.yaml"
    fast = tiny_run("algo.dynamic_sampling_rounds=3")
    cfg = load_config(TrainConfig, tiny, [*fast, f"trainer.run_dir={tmp_path}"])
    model, _ = sft_stage(cfg, resolve_model_path(cfg.model), tmp_path)
    run = build_run(cfg, model, tmp_path / "rl")
    step, trained = 0, {}
    try:
        for name, (overrides, own_key) in RUNS.items():
            run.cfg = dataclasses.replace(run.cfg, algo=load_config(TrainConfig, tiny, [*fast, *overrides]).algo)
            for _ in range(3):  # a step may find no informative group; the next one will
                step += 1
                before = first_weight(run)
                m = rl_step(run, step)
                if m.get("update/skipped_empty"):
                    continue
                assert 0.0 <= m["algo/selected_frac"] <= 1.0, (name, m["algo/selected_frac"])
                assert math.isfinite(m["update/loss"]) and m["update/synced"] == 1.0, (name, m)
                assert not torch.equal(before, first_weight(run)), name  # it trained
                if own_key is not None:
                    assert own_key in m, (name, sorted(k for k in m if k.startswith("algo")))
                trained[name] = m
                break
        # The learner hands per-token KL coefficients to the loss: with A = 0 and old = current - 0.5,
        # KL-Cov's penalty on every token is the whole loss, 0.5 (and 0 without the coefficients).
        from stare_tir.algos.policy_loss import POLICY_LOSSES, Clip
        from stare_tir.rollout.trajectory import Trajectory

        trajs = []
        for k in range(3):
            t = Trajectory(prompt_ids=[1, 2, 3])
            t.append([5 + k, 6, 7], [-1.0] * 3, "model")
            t.append([9], None, "obs")
            t.append([8], [-1.0], "model")
            trajs.append(t)
        old = [
            lp - 0.5 * torch.tensor(t.loss_mask) for lp, t in zip(run.learner.compute_logprobs_entropy(trajs)[0], trajs)
        ]
        ones = [torch.tensor(t.loss_mask, dtype=torch.float32) for t in trajs]
        kw = dict(loss_fn=POLICY_LOSSES.get("kl_cov"), clip=Clip(low=0.2, high=0.28))
        penalised = run.learner.train_step(trajs, [0.0] * 3, None, old, terms={"kl_cov": ones}, **kw)
        plain = run.learner.train_step(trajs, [0.0] * 3, None, old, **kw)
        assert plain["loss"] == 0.0 and penalised["loss"] == pytest.approx(0.5, abs=1e-3)
    finally:
        close_run(run)
    assert set(trained) == set(RUNS), f"no update for {set(RUNS) - set(trained)}"
    assert trained["dapo"]["batch/prompts"] >= 12  # 3 x the 4 groups in its first round
    assert trained["entropy_80_20"]["algo/entropy_80_20/selected_frac"] == pytest.approx(0.2, abs=0.02)
    assert trained["entropy_adv"]["algo/selected_frac"] > 0.5  # most tokens get the entropy bonus
    assert trained["kl_cov_2ep"]["algo/kl_cov/selected_frac"] > 0.1
    assert trained["official"]["stare/reweighted_frac"] > 0
    # ratio_one_on_policy: old = the update's own log-probs, so the ratio is exactly 1 everywhere.
    off = trained["official"]
    assert off["update/pg/ratio_max"] == 1.0 and off["update/pg/approx_kl"] == 0.0
    assert off["update/pg/clipfrac_high"] == off["update/pg/clipfrac_low"] == 0.0
    # Every key the methods wrote is described in docs/metrics.md.
    keys = {k for m in trained.values() for k in m}
    assert not missing_from_metrics_doc(keys), missing_from_metrics_doc(keys)
