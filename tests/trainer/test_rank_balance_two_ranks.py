"""Rank balancing on 2 CPU ranks (gloo, ZeRO-2, the tiny model): a step whose round-robin split
gives one rank every long response is balanced to within 5%, and the update (weights after the
step) is the one the unbalanced ranks take: the loss is normalised over all ranks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "rank_balance_worker.py"


def _launcher():
    """tests/learner/test_learner_distributed.py's `_launch` (ranks started as torchrun would)."""
    path = HERE.parent / "learner" / "test_learner_distributed.py"
    spec = importlib.util.spec_from_file_location("learner_distributed_test", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def tiny_path() -> str:
    from stare_tir.model import ensure_tiny_checkpoint

    return str(ensure_tiny_checkpoint())


def test_balanced_ranks_take_the_unbalanced_update(tiny_path, tmp_path, monkeypatch):
    dist = _launcher()
    monkeypatch.setattr(dist, "WORKER", WORKER)
    results = {}
    for mode in ("off", "on"):
        out = tmp_path / f"{mode}.pt"
        dist._launch(tiny_path, out, 2, ["--balance", mode])
        results[mode] = torch.load(out, weights_only=False)
    off, on = results["off"], results["on"]

    # The round-robin split is badly unbalanced; balancing evens it out, and logs both.
    before = on["metrics"]["balance/tokens_max_mean_before"]
    assert before > 1.5, before
    assert off["metrics"]["balance/tokens_max_mean_after"] == before  # off: measured, nothing moved
    assert off["metrics"]["balance/moved_trajectories"] == 0
    assert on["metrics"]["balance/tokens_max_mean_before"] == before
    assert on["metrics"]["balance/tokens_max_mean_after"] <= 1.05
    assert on["metrics"]["balance/moved_trajectories"] > 0
    loads = [sum(n for _, n, _, _ in held) for held in on["held"]]
    assert max(loads) / (sum(loads) / 2) == pytest.approx(on["metrics"]["balance/tokens_max_mean_after"])

    # Every trajectory kept its advantage and penalty, wherever it went.
    assert sorted(x for held in on["held"] for x in held) == sorted(x for held in off["held"] for x in held)
    assert any(p < 0 for held in on["held"] for _, _, _, p in held)  # some penalty really travelled

    # The same update: global loss, tokens, sequences, selected fraction, and the weights.
    m_off, m_on = off["metrics"], on["metrics"]
    assert off["applied"] == on["applied"] == 1
    assert m_on["update/tokens"] == m_off["update/tokens"] and m_on["update/sequences"] == m_off["update/sequences"]
    assert m_on["algo/selected_frac"] == pytest.approx(m_off["algo/selected_frac"], abs=1e-12)
    assert m_on["update/loss"] == pytest.approx(m_off["update/loss"], rel=1e-5, abs=1e-7)
    assert m_on["update/grad_norm"] == pytest.approx(m_off["update/grad_norm"], rel=1e-5)
    w_off, w_on = off["weights"], on["weights"]
    diff = max(float((w_off[k] - w_on[k]).abs().max()) for k in w_off)
    assert diff < 1e-5, diff  # the tolerance of the 1-vs-2-rank learner test
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)
    w0 = {k: v.detach() for k, v in model.named_parameters()}
    assert max(float((w_off[k] - w0[k]).abs().max()) for k in w_off) > 1e-3  # not vacuous
