"""STARE without the recompute pass on 2 real ranks (gloo, ZeRO-2, CPU): the shaping that runs between
the update's forward and its loss gathers the batch over the ranks (the gate's batch entropy, the
batch-global top-p), so 2 ranks take the step 1 rank takes with the recompute pass."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "recompute_free_worker.py"


def _distributed_test_module():
    spec = importlib.util.spec_from_file_location("learner_distributed_test", HERE / "test_learner_distributed.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_two_ranks_without_the_recompute_pass_take_the_step_of_one_with_it(tiny_path, tmp_path, monkeypatch):
    dist = _distributed_test_module()
    monkeypatch.setattr(dist, "WORKER", WORKER)
    results = {}
    for world, mode in ((1, "always"), (2, "auto")):
        out = tmp_path / f"world{world}_{mode}.pt"
        dist._launch(tiny_path, out, world, [mode])
        results[mode] = torch.load(out, weights_only=False)
    one, two = results["always"]["metrics"], results["auto"]["metrics"]
    assert one["stare/gate_on"] == two["stare/gate_on"] == 1.0
    assert two["stare/reweighted_frac"] == one["stare/reweighted_frac"] > 0  # the same tokens, over both ranks
    for key in ("update/loss", "entropy/batch"):  # global; mismatch/* is per rank
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    w1, w2 = results["always"]["weights"], results["auto"]["weights"]
    moved = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert moved < 1e-5, moved  # the tolerance of the 1-vs-2-rank learner test
