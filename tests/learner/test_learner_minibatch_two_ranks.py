"""Under verl's layout the mini-batches, their selection groups and aggregation are those of the
simulated partition, so 2 real ranks take the same mini-batch steps as 1 (gloo, ZeRO-2, CPU)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
WORKER = HERE / "minibatch_worker.py"


def _launch_helper():
    spec = importlib.util.spec_from_file_location("learner_distributed_test", HERE / "test_learner_distributed.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_two_ranks_take_the_same_mini_batch_steps_as_one(tiny_path, tmp_path, monkeypatch):
    dist = _launch_helper()
    monkeypatch.setattr(dist, "WORKER", WORKER)
    results = []
    for world in (1, 2):
        out = tmp_path / f"world{world}.pt"
        dist._launch(tiny_path, out, world, [])
        results.append(torch.load(out, weights_only=False))
    one, two = results
    assert one["applied"] == two["applied"] == 2
    assert one["selected"] == two["selected"]  # the same tokens kept
    w1, w2 = one["weights"], two["weights"]
    diff = max(float((w1[k] - w2[k]).abs().max()) for k in w1)
    assert diff < 1e-5, diff  # the tolerance of the 1-vs-2-rank learner test
    from transformers import AutoModelForCausalLM

    w0 = dict(AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32).named_parameters())
    assert max(float((w1[k] - w0[k]).abs().max()) for k in w1) > 1e-3  # not vacuous
