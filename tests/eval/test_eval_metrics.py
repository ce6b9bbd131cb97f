"""Pure metric functions of stare_tir.eval.evaluate: hand-computed values and brute force."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from stare_tir.eval.evaluate import (
    EvalConfig,
    avg_at_n,
    benchmark_average,
    dataset_metrics,
    default_n,
    majority_vote,
    pass_at_k,
    summary_metrics,
)


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (4, 1, 1, 0.25),
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 4, 5 / 6),  # 1 - C(7,4)/C(10,4) = 1 - 35/210
        (32, 1, 16, 0.5),  # 1 - C(31,16)/C(32,16) = 1 - 16/32
        (32, 8, 1, 0.25),  # pass@1 is the plain fraction correct
        (8, 0, 4, 0.0),
        (8, 8, 4, 1.0),
        (4, 3, 2, 1.0),  # n - c = 1 < k: every pair holds a correct sample
    ],
)
def test_pass_at_k_hand_computed(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_matches_subset_enumeration() -> None:
    # Definition: probability that a uniformly drawn k-subset of the n samples has a correct one.
    for n in range(1, 8):
        for c in range(n + 1):
            samples = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(samples, k))
                exact = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12), (n, c, k)


def test_pass_at_k_is_stable_for_large_n() -> None:
    # C(2000, 1000) has ~600 digits: a float binomial would overflow; compare with exact rationals.
    n, c, k = 2000, 3, 1000
    exact = 1 - Fraction(math.comb(n - c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(exact), rel=1e-12)
    assert 0.0 < pass_at_k(5000, 1, 1) < 1e-3


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_bad_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_n_averages_per_problem_first() -> None:
    # (1/2 + 3/4) / 2, not 4/6 pooled over samples.
    assert avg_at_n([[True, False], [True, True, True, False]]) == pytest.approx(0.625)
    assert avg_at_n([]) == 0.0


def test_majority_vote_clusters_by_equivalence_and_breaks_ties_by_first_seen() -> None:
    same_value = {frozenset({"1/2", "0.5"})}
    eq = lambda a, b: a == b or frozenset({a, b}) in same_value  # noqa: E731
    # "1/2" and "0.5" form one cluster of 2, "3" has 2 as well: tie -> the first seen ("1/2").
    assert majority_vote(["1/2", "3", "0.5", "3", None], [True, False, True, False, False], eq)
    assert not majority_vote(["3", "1/2", "0.5", "3", None], [False, True, True, False, False], eq)
    # Clear majority of a wrong answer beats a correct minority.
    assert not majority_vote(["7", "7", "8"], [False, False, True], eq)
    assert majority_vote(["7", "8", "8", None, None, None], [False, True, True] + [False] * 3, eq)
    # No extracted answer at all: no vote, wrong.
    assert not majority_vote([None, " "], [False, False], eq)
    with pytest.raises(ValueError):
        majority_vote(["1"], [True, False], eq)


def _row(pid: str, idx: int, correct: bool, pred: str | None = None, **kw) -> dict:
    row = dict(
        problem_id=pid,
        sample_idx=idx,
        correct=correct,
        pred=pred,
        tool_calls=2,
        code_errors=0,
        timeouts=0,
        response_tokens=100,
        generated_tokens=60,
        finish_reason="answer",
        sandbox_error=False,
    )
    row.update(kw)
    return row


def test_dataset_metrics_values() -> None:
    eq = lambda a, b: a == b  # noqa: E731
    rows = [
        _row("p1", 0, True, "5", code_errors=1),
        _row("p1", 1, False, "6", timeouts=1),
        _row("p1", 2, True, "5"),
        _row("p1", 3, False, None, finish_reason="max_tokens"),
        _row("p2", 0, False, "1"),
        _row("p2", 1, False, "1"),
        _row("p2", 2, False, "2"),
        _row("p2", 3, False, "2", response_tokens=300),
        _row("p2", 4, True, "9"),  # sample_idx >= n: ignored
    ]
    m = dataset_metrics(rows, n=4, pass_ks=[1, 2, 8], equivalent=eq)
    assert m["problems"] == 2 and m["samples"] == 8 and m["n"] == 4
    assert m["avg@4"] == pytest.approx((2 / 4 + 0) / 2)
    assert m["pass@1"] == pytest.approx(0.25)
    assert m["pass@2"] == pytest.approx((1 - 1 / 6) / 2)  # p1: 1 - C(2,2)/C(4,2)
    assert "pass@8" not in m  # k > n is skipped
    assert m["maj@4"] == pytest.approx(0.5)  # p1 votes "5" (right), p2 votes "1" (wrong)
    assert m["mean_tool_calls"] == pytest.approx(2.0)
    assert m["code_error_rate"] == pytest.approx(1 / 16)
    assert m["timeout_rate"] == pytest.approx(1 / 16)
    assert m["mean_response_tokens"] == pytest.approx((7 * 100 + 300) / 8)
    assert m["answer_rate"] == pytest.approx(7 / 8)
    assert m["finish_reasons"] == {"answer": 7 / 8, "max_tokens": 1 / 8}


def test_dataset_metrics_excludes_sandbox_failures() -> None:
    rows = [
        _row("p1", 0, False, "1", sandbox_error=True),
        _row("p1", 1, True, "2"),
        _row("p2", 0, False, "3"),
        _row("p2", 1, False, "3"),
    ]
    m = dataset_metrics(rows, n=2, pass_ks=[1, 2], equivalent=lambda a, b: a == b)
    assert m["sandbox_error_samples"] == 1 and m["samples"] == 3
    assert m["avg@2"] == pytest.approx((1.0 + 0.0) / 2)  # the failed sample is not "wrong"
    assert m["problems_short"] == 1
    assert m["pass@2"] == pytest.approx(0.5)  # p1 has 1 valid sample: pass@1 of it


def test_benchmark_average_needs_all_six() -> None:
    names = ["aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench"]
    per = {
        name: {"n": 32 if i < 3 else 4, f"avg@{32 if i < 3 else 4}": i / 10, f"maj@{32 if i < 3 else 4}": 1 - i / 10}
        for i, name in enumerate(names)
    }
    assert benchmark_average(per) == pytest.approx({"avg@n": 0.25, "maj@n": 0.75})
    del per["minerva"]
    assert benchmark_average(per) is None
    flat = summary_metrics(
        {"datasets": {"aime24": {"n": 4, "avg@4": 0.5, "finish_reasons": {}}}, "six_benchmark_avg": None}
    )
    assert flat == {"eval/aime24/n": 4.0, "eval/aime24/avg@4": 0.5}


def test_default_n_and_config_checks() -> None:
    assert default_n("aime24") == 32 and default_n("amc23") == 32 and default_n("math500") == 4
    with pytest.raises(ValueError, match="top_p"):
        EvalConfig(top_p=0.0)
    with pytest.raises(ValueError, match="n=0"):
        EvalConfig(n=0)


def test_majority_vote_with_the_training_grader() -> None:
    from stare_tir.eval.evaluate import answers_equivalent

    # "\frac{1}{2}", "0.5" and "1/2" are one answer for the grader: 3 votes against 2 for "3".
    preds = ["\\frac{1}{2}", "3", "0.5", "3", "1/2", None]
    verdicts = [True, False, True, False, True, False]
    assert majority_vote(preds, verdicts, answers_equivalent)
    # 2 against 2: the answer seen first ("3") wins the tie.
    assert not majority_vote(["3", "\\frac{1}{2}", "3", "0.5"], [False, True, False, True], answers_equivalent)
    assert answers_equivalent("\\dfrac{3}{4}", "0.75") and not answers_equivalent("34", "43")


def test_majority_vote_groups_answers_with_the_selected_grader() -> None:
    from stare_tir.eval.metrics import grader_equivalence

    # math-verify rounds floats to 6 decimals, so under `env.grader: math_verify` the two decimals
    # are one answer (2 votes, seen first, beats "7" on the tie); the builtin grader keeps them
    # apart and "7" wins with 2 votes against 1.
    preds = ["1.23456788", "7", "1.23456789", "7"]
    verdicts = [True, False, True, False]
    assert not majority_vote(preds, verdicts, grader_equivalence("builtin"))
    assert majority_vote(preds, verdicts, grader_equivalence("math_verify"))
    # The decimal rule's switch reaches the vote too: "27.3912" rounds to "27.39" by default only.
    assert grader_equivalence("builtin")("27.3912", "27.39")
    assert not grader_equivalence("builtin", finer_decimals=False)("27.3912", "27.39")
    rows = [
        {"problem_id": "p", "sample_idx": i, "pred": p, "correct": v, "tool_calls": 0, "code_errors": 0}
        | {"timeouts": 0, "response_tokens": 1, "generated_tokens": 1, "finish_reason": "stop"}
        for i, (p, v) in enumerate(zip(preds, verdicts))
    ]
    assert dataset_metrics(rows, 4, [1], grader_equivalence("math_verify"))["maj@4"] == 1.0
    assert dataset_metrics(rows, 4, [1], grader_equivalence("builtin"))["maj@4"] == 0.0
