"""Pure metric functions of the evaluation: pass@k, avg@N, maj@N and per-dataset tool statistics.

No I/O, no models: `stare_tir.eval.evaluate` feeds them the JSONL rows of finished samples.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any, Callable, Iterable, Sequence

# The six benchmarks of the STARE paper's table, by the loader's short names.
SIX_BENCHMARKS: tuple[str, ...] = ("aime24", "aime25", "amc23", "math500", "minerva", "olympiadbench")
DEFAULT_PASS_KS: tuple[int, ...] = (1, 4, 8, 16, 32)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct: 1 - C(n-c, k) / C(n, k).

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), a product of factors in [0, 1), so it never
    forms the huge binomials (C(32, 16) is fine, C(1000, 500) is not) and never divides by them.
    """
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need n >= 1 and 0 <= c <= n, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k={k}: must be in [1, n={n}]")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def avg_at_n(correct: Sequence[Sequence[bool]]) -> float:
    """Mean over problems of each problem's fraction of correct samples (avg@N)."""
    per_problem = [sum(map(bool, c)) / len(c) for c in correct if len(c) > 0]
    return sum(per_problem) / len(per_problem) if per_problem else 0.0


def majority_vote(
    preds: Sequence[str | None],
    verdicts: Sequence[bool],
    equivalent: Callable[[str, str], bool],
) -> bool:
    """Is the most frequent answer (up to equivalence) correct?

    Answers are clustered greedily: each joins the first cluster whose first member it is
    equivalent to. Samples without an extracted answer do not vote. The largest cluster wins;
    ties go to the cluster seen first (deterministic for a fixed sample order). The cluster's
    verdict is the grader's verdict on its first member.
    """
    if len(preds) != len(verdicts):
        raise ValueError(f"{len(preds)} preds but {len(verdicts)} verdicts")
    clusters: list[list[int]] = []
    for i, pred in enumerate(preds):
        if pred is None or not pred.strip():
            continue
        for members in clusters:
            if equivalent(preds[members[0]], pred):  # type: ignore[arg-type]
                members.append(i)
                break
        else:
            clusters.append([i])
    if not clusters:
        return False
    best = max(clusters, key=len)  # max() keeps the first of equals: ties go to the earliest
    return bool(verdicts[best[0]])


def grader_equivalence(grader: str = "builtin", *, finer_decimals: bool = True) -> Callable[[str, str], bool]:
    """The equivalence maj@N groups answers with: that of the grader `env.grader` selects (and its
    decimal rule), so a vote counts the answers the reward would call equal as one answer."""

    def equivalent(a: str, b: str) -> bool:
        if a.strip() == b.strip():
            return True
        from envs.grading import get_grader

        return bool(get_grader(grader, finer_decimals=finer_decimals).equivalent(a, b))

    return equivalent


def answers_equivalent(a: str, b: str) -> bool:
    """Two extracted answers name the same value, as judged by the default (builtin) grader."""
    return grader_equivalence("builtin")(a, b)


def _rate(num: float, den: float) -> float:
    return num / den if den else 0.0


def dataset_metrics(
    rows: Iterable[dict],
    n: int,
    pass_ks: Sequence[int] = DEFAULT_PASS_KS,
    equivalent: Callable[[str, str], bool] = answers_equivalent,
) -> dict[str, Any]:
    """Metrics of one dataset from its per-sample rows (see `trajectory_row` for the fields).

    Only rows with sample_idx < n count. Rows with `sandbox_error` are excluded (and counted).
    A problem left with m < k valid samples contributes pass@m to pass@k (any-correct of what it
    has), since the unbiased estimator is undefined there; `problems_short` counts such problems.
    """
    by_problem: dict[str, list[dict]] = defaultdict(list)
    sandbox_failed = 0
    for row in rows:
        if row["sample_idx"] >= n:
            continue
        if row.get("sandbox_error"):
            sandbox_failed += 1
            continue
        by_problem[row["problem_id"]].append(row)
    for samples in by_problem.values():
        samples.sort(key=lambda r: r["sample_idx"])
    valid = [r for samples in by_problem.values() for r in samples]

    out: dict[str, Any] = {
        "problems": len(by_problem),
        "n": n,
        "samples": len(valid),
        "sandbox_error_samples": sandbox_failed,
        "problems_short": sum(1 for s in by_problem.values() if len(s) < n),
    }
    correct = [[bool(r["correct"]) for r in s] for s in by_problem.values()]
    out[f"avg@{n}"] = avg_at_n(correct)
    for k in sorted(set(pass_ks)):
        if k > n:
            continue
        vals = [pass_at_k(len(c), sum(c), min(k, len(c))) for c in correct]
        out[f"pass@{k}"] = sum(vals) / len(vals) if vals else 0.0
    majs = [
        majority_vote([r.get("pred") for r in s], [bool(r["correct"]) for r in s], equivalent)
        for s in by_problem.values()
    ]
    out[f"maj@{n}"] = sum(majs) / len(majs) if majs else 0.0

    tool_calls = sum(r["tool_calls"] for r in valid)
    out["mean_tool_calls"] = _rate(tool_calls, len(valid))
    out["code_error_rate"] = _rate(sum(r["code_errors"] for r in valid), tool_calls)
    out["timeout_rate"] = _rate(sum(r["timeouts"] for r in valid), tool_calls)
    out["mean_response_tokens"] = _rate(sum(r["response_tokens"] for r in valid), len(valid))
    out["mean_generated_tokens"] = _rate(sum(r["generated_tokens"] for r in valid), len(valid))
    out["answer_rate"] = _rate(sum(r.get("pred") is not None for r in valid), len(valid))
    reasons = Counter(r["finish_reason"] for r in valid)
    out["finish_reasons"] = {k: _rate(v, len(valid)) for k, v in sorted(reasons.items())}
    return out


def benchmark_average(per_dataset: dict[str, dict]) -> dict[str, float] | None:
    """Unweighted mean over the six paper benchmarks of avg@N and maj@N, if all six ran."""
    if not all(name in per_dataset for name in SIX_BENCHMARKS):
        return None
    six = [per_dataset[name] for name in SIX_BENCHMARKS]
    return {
        "avg@n": sum(m[f"avg@{m['n']}"] for m in six) / len(six),
        "maj@n": sum(m[f"maj@{m['n']}"] for m in six) / len(six),
    }


def summary_metrics(summary: dict, prefix: str = "eval/") -> dict[str, float]:
    """Flatten a summary into scalar metrics for a metrics log: eval/<dataset>/<metric>."""
    flat: dict[str, float] = {}
    for name, metrics in summary.get("datasets", {}).items():
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                flat[f"{prefix}{name}/{key}"] = float(value)
    for key, value in (summary.get("six_benchmark_avg") or {}).items():
        flat[f"{prefix}six_benchmark_avg/{key}"] = float(value)
    return flat
