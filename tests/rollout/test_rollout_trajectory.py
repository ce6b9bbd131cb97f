"""Trajectory: one append path keeps ids, mask and logprobs aligned; check() catches breakage."""

from __future__ import annotations

import pytest

from stare_tir.rollout.trajectory import Trajectory


def test_append_keeps_arrays_aligned_and_spans_tile():
    t = Trajectory(prompt_ids=[1, 2, 3])
    t.append([10, 11], [-0.1, -0.2], "model")
    t.append([20, 21, 22], None, "obs")
    t.append([], None, "obs")  # empty segments leave no span
    t.append([30], [-0.3], "model")
    assert t.response_ids == [10, 11, 20, 21, 22, 30]
    assert t.loss_mask == [1, 1, 0, 0, 0, 1]
    assert t.rollout_logprobs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3]
    assert t.turns == [(0, 2, "model"), (2, 5, "obs"), (5, 6, "model")]
    assert t.model_spans() == [(0, 2), (5, 6)]
    assert t.num_model_tokens == 3
    t.check()


def test_append_rejects_misaligned_segments():
    t = Trajectory(prompt_ids=[1])
    with pytest.raises(ValueError, match="one logprob per token"):
        t.append([1, 2], [-0.1], "model")
    with pytest.raises(ValueError, match="one logprob per token"):
        t.append([1, 2], None, "model")
    with pytest.raises(ValueError, match="no logprobs"):
        t.append([1], [-0.1], "obs")
    with pytest.raises(ValueError, match="kind"):
        t.append([1], None, "tool")
    assert t.response_ids == [] and t.turns == []


def test_check_detects_corruption():
    t = Trajectory(prompt_ids=[1])
    t.append([5, 6], [-1.0, -2.0], "model")
    t.append([7], None, "obs")
    t.check()
    t.loss_mask[2] = 1  # an observation token marked trainable
    with pytest.raises(AssertionError, match="mask"):
        t.check()
    t.loss_mask[2] = 0
    t.rollout_logprobs.append(0.0)  # arrays out of step
    with pytest.raises(AssertionError, match="length"):
        t.check()
    t.rollout_logprobs.pop()
    t.finish_reason = "timeout"  # not a finish reason
    with pytest.raises(AssertionError):
        t.check()
