"""Micro-batch planning and padding: pure CPU functions, no DeepSpeed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stare_tir.learner.micro_batch import build_micro_batch, empty_micro_batch, plan_micro_batches


def test_plan_respects_the_budget_keeps_every_index_once_and_puts_long_rows_first():
    lengths = [5, 17, 3, 9, 9, 40, 1, 12]
    plan = plan_micro_batches(lengths, token_budget=24)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:
        assert len(mb) == 1 or len(mb) * max(lengths[i] for i in mb) <= 24
    assert plan[0] == [5]  # longer than the budget: alone, and first
    assert plan == plan_micro_batches(lengths, token_budget=24)  # deterministic


def test_build_addresses_each_loss_token_by_the_position_that_predicts_it():
    trajs = [
        SimpleNamespace(prompt_ids=[1, 2, 3], response_ids=[10, 11, 12, 13], loss_mask=[1, 0, 1, 1]),
        SimpleNamespace(prompt_ids=[4], response_ids=[20, 21], loss_mask=[1, 1]),
    ]
    mb = build_micro_batch(trajs, [1, 0], pad_id=0)
    assert mb.indices == [1, 0] and mb.num_tokens == 5
    assert mb.input_ids.tolist() == [[4, 20, 21, 0, 0, 0, 0], [1, 2, 3, 10, 11, 12, 13]]
    assert mb.attention_mask.sum(1).tolist() == [3, 7]
    # The hidden state at sel_pos is the one just before the target in the padded row.
    assert torch.equal(mb.input_ids[mb.sel_rows, mb.sel_pos + 1], mb.targets)
    assert mb.targets.tolist() == [20, 21, 10, 12, 13]
    assert mb.sel_resp.tolist() == [0, 1, 0, 2, 3]
    assert mb.mask.tolist() == [[1, 1, 0, 0], [1, 0, 1, 1]]
    per_tok = mb.per_token([torch.tensor([0.5, 0.6, 0.7, 0.8]), 2.0])  # row order follows indices
    assert per_tok.tolist() == [[2.0, 2.0, 2.0, 2.0], pytest.approx([0.5, 0.6, 0.7, 0.8])]


def test_build_rejects_malformed_rows_with_the_trajectory_index():
    bad = [SimpleNamespace(prompt_ids=[1], response_ids=[2, 3], loss_mask=[1])]
    with pytest.raises(ValueError, match="trajectory 0: loss_mask has 1 entries for 2"):
        build_micro_batch(bad, [0], pad_id=0)
    with pytest.raises(ValueError, match="empty prompt_ids"):
        build_micro_batch([SimpleNamespace(prompt_ids=[], response_ids=[2], loss_mask=[1])], [0], pad_id=0)


def test_empty_micro_batch_has_no_loss_tokens():
    mb = empty_micro_batch(pad_id=7)
    assert mb.num_tokens == 0 and mb.indices == [] and float(mb.mask.sum()) == 0.0
