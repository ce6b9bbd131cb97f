"""Evaluation with tool calls: accuracy of a TIR policy on math benchmarks.

One code path for both callers: `scripts/eval_aime.py` (a model on disk or on the hub) and the
trainer's periodic evaluation (the live rollout backend). Both run the *training* rollout engine,
`RetoolEnv` and grader, so an evaluation number means exactly what the reward means in training.

Flow per dataset: load problems -> expand every problem into `n` samples -> skip samples already
in `<out_dir>/<dataset>.jsonl` (resume) -> generate the rest in chunks, appending one JSON row per
sample after each chunk -> compute metrics from *all* rows (old and new alike) -> `summary.json`
and a console table.

Metrics (per dataset, accuracies are fractions in [0, 1]):
  avg@N      mean over problems of (correct samples / samples): the "accuracy" papers report.
  pass@k     unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), for k <= N.
  maj@N      majority vote over the extracted answers, grouped by the grader's equivalence.
  tool use   mean tool calls per sample, code error and timeout rates per tool call, mean
             response length (all tokens, and model-written tokens only), finish reasons.
A sample that failed for infrastructure reasons (its sandbox failed, or the backend or env raised:
`sandbox_error` / `rollout_error` in its row) is written for the record but counts neither as
right nor as wrong, and a rerun retries it, just as training excludes such samples. A chunk whose
samples all failed so stops the evaluation (`EvalInfraError`, naming the first error): a dead
server or sandbox must not produce a table of zeros. The console table and docs/metrics.md use
the same fractions as summary.json and training's eval/* metrics.
`stare_tir.eval.command` is the command around this: config, output directory, model resolution.
"""

from __future__ import annotations

import contextlib
import json
import time
import zlib
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from loguru import logger

from stare_tir.eval.metrics import (  # noqa: F401 (re-exported: the metrics are part of this API)
    DEFAULT_PASS_KS,
    SIX_BENCHMARKS,
    answers_equivalent,
    avg_at_n,
    benchmark_average,
    dataset_metrics,
    grader_equivalence,
    majority_vote,
    pass_at_k,
    summary_metrics,
)


class EvalInfraError(RuntimeError):
    """Every sample of a chunk failed for infrastructure reasons: the backend or sandbox is down."""


# Small competition sets get many samples (their avg@N is noisy otherwise), as in DAPO/ReTool.
MANY_SAMPLE_DATASETS: frozenset[str] = frozenset({"aime24", "aime25", "amc23"})


@dataclass
class EvalConfig:
    """What to evaluate and how to sample. Shared by the eval script and the trainer."""

    # Benchmarks, as short names or paths that `envs.data.load_problems` accepts.
    datasets: list[str] = field(default_factory=lambda: ["aime24", "aime25"])
    # Samples per problem. None: 32 for AIME24/AIME25/AMC23, 4 for the rest (as in the literature).
    n: int | None = None
    # Evaluate only the first `limit` problems of each dataset (quick checks, CPU smoke runs).
    limit: int | None = None
    # pass@k is reported for these k (those larger than n are skipped).
    pass_ks: list[int] = field(default_factory=lambda: list(DEFAULT_PASS_KS))
    # Sampling temperature and nucleus top-p. DAPO/ReTool report avg@32 at T=1.0, top-p=0.7.
    temperature: float = 1.0
    top_p: float = 0.7
    # Model turns (code calls + final answer) per sample; None keeps the rollout config's value.
    max_turns: int | None = None
    # Total response tokens (model + interpreter) per sample; None keeps the rollout config's value.
    max_tokens: int | None = None
    # Tokens per model turn; None keeps the rollout config's value.
    max_tokens_per_turn: int | None = None
    # Samples handed to the engine per call; rows are flushed to disk after each chunk, so this
    # bounds the work a crash can lose, while staying large enough to keep the backend busy.
    chunk_size: int = 512
    # Base sampling seed, for reproducible runs where the backend honours per-request seeds
    # (each chunk of samples derives its own). None: the backend's own random stream.
    seed: int | None = None

    def __post_init__(self) -> None:
        if not self.datasets:
            raise ValueError(f"datasets={self.datasets!r}: name at least one dataset")
        if self.n is not None and self.n < 1:
            raise ValueError(f"n={self.n!r}: must be >= 1 (or None for the per-dataset default)")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit={self.limit!r}: must be >= 1 (or None for all problems)")
        if not self.pass_ks or any(k < 1 for k in self.pass_ks):
            raise ValueError(f"pass_ks={self.pass_ks!r}: must be a non-empty list of ints >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature!r}: must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1]")
        for name in ("max_turns", "max_tokens", "max_tokens_per_turn"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name}={v!r}: must be >= 1 (or None to keep the rollout value)")
        if self.chunk_size < 1:
            raise ValueError(f"chunk_size={self.chunk_size!r}: must be >= 1")


def default_n(dataset: str) -> int:
    """Samples per problem when the config leaves n unset."""
    return 32 if dataset in MANY_SAMPLE_DATASETS else 4


def dataset_key(dataset: str) -> str:
    """A file-system-safe name for a dataset given as a short name or a path."""
    stem = Path(dataset).name
    for suffix in (".gz", ".jsonl", ".json"):
        stem = stem.removesuffix(suffix)
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in stem) or "dataset"


# ----------------------------------------------------------------------------------------------
# Rows: one JSON object per sample
# ----------------------------------------------------------------------------------------------


def trajectory_row(traj: Any, problem: dict, sample_idx: int, dataset: str) -> dict:
    """The JSONL record of one finished sample (a `Trajectory` from the rollout engine)."""
    info = traj.info or {}
    env_stats = info.get("env_stats") or {}
    return {
        "dataset": dataset,
        "problem_id": str(problem["id"]),
        "sample_idx": sample_idx,
        "gold": str(problem["answer"]),
        "pred": info.get("pred"),
        "correct": bool(info.get("correct", False)),
        "reward": float(traj.reward),
        "finish_reason": traj.finish_reason,
        "num_turns": int(traj.num_turns),
        "tool_calls": int(traj.tool_calls),
        "code_errors": int(env_stats.get("code_errors", 0)),
        "timeouts": int(traj.timeouts),
        "void_turns": int(traj.void_turns),
        "sandbox_error": bool(traj.sandbox_error),
        # The backend or env raised: the sample is incomplete, its grade meaningless.
        "rollout_error": traj.finish_reason == "error",
        "error": info.get("error"),
        "response_tokens": len(traj.response_ids),
        "generated_tokens": int(sum(traj.loss_mask)),
        "text": traj.text,
    }


def read_rows(path: Path) -> list[dict]:
    """Rows of a (possibly interrupted) JSONL file; a torn last line is dropped with a warning."""
    if not path.exists():
        return []
    rows = []
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # a crash mid-write leaves at most one torn line, the last
                logger.warning(f"{path}: dropping a torn last line (interrupted write)")
                continue
            raise ValueError(f"{path}:{i + 1}: not valid JSON; delete or fix the file") from None
    return rows


def infra_failed(row: dict) -> bool:
    """The sample failed for infrastructure reasons (never the model's fault): never done, never graded."""
    return bool(row.get("sandbox_error") or row.get("rollout_error") or row.get("finish_reason") == "error")


def _latest_by_key(rows: Iterable[dict]) -> dict[tuple[str, int], dict]:
    """Last row per (problem_id, sample_idx): a retried sandbox failure supersedes the failure."""
    return {(str(r["problem_id"]), int(r["sample_idx"])): r for r in rows}


def _append_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))


# ----------------------------------------------------------------------------------------------
# Running an evaluation
# ----------------------------------------------------------------------------------------------


def eval_rollout_config(cfg: EvalConfig, base: Any) -> Any:
    """The rollout config `base` (a `RolloutConfig`) with the evaluation's sampling settings."""
    changes: dict[str, Any] = {"temperature": cfg.temperature, "top_p": cfg.top_p, "seed": cfg.seed}
    for ours, theirs in (
        ("max_turns", "max_turns"),
        ("max_tokens", "max_total_tokens"),
        ("max_tokens_per_turn", "max_new_tokens_per_turn"),
    ):
        if getattr(cfg, ours) is not None:
            changes[theirs] = getattr(cfg, ours)
    return replace(base, **changes)


def _chunk_seed(engine: Any, tag: str) -> contextlib.AbstractContextManager:
    """A per-chunk sampling seed derived from the engine's seed, so that two chunks (e.g. before
    and after a resume) never replay the same random streams; no-op without a seed."""
    if getattr(engine.cfg, "seed", None) is None:
        return contextlib.nullcontext()
    seed = (engine.cfg.seed * 1_000_003 + zlib.crc32(tag.encode())) % (1 << 31)
    return engine.configured(seed=seed)


def evaluate_problems(
    engine: Any,
    problems: Sequence[dict],
    n: int,
    *,
    dataset: str = "eval",
    out_path: str | Path | None = None,
    pass_ks: Sequence[int] = DEFAULT_PASS_KS,
    chunk_size: int = 512,
    equivalent: Callable[[str, str], bool] = answers_equivalent,
    stop_on_infra_failure: bool = True,
) -> tuple[dict[str, Any], list[dict]]:
    """Sample `n` responses per problem with `engine` and score them.

    engine: a `RolloutEngine` (anything with `run(problems, n) -> (trajectories, stats)` and a
        `cfg`), used with its current sampling settings (`evaluate` sets the eval's).
    out_path: JSONL file of per-sample rows. Samples already in it are skipped (resume), new ones
        are appended after every chunk of `chunk_size` samples. None: nothing is written.
    stop_on_infra_failure: raise `EvalInfraError` when every sample of a chunk failed for
        infrastructure reasons (the trainer's held-out evaluation passes False: a transient outage
        must not end a long run; its RL steps have their own guard, trainer.max_empty_steps).
    Returns (metrics, rows) with one row per (problem, sample index < n), sorted.
    """
    ids = [str(p["id"]) for p in problems]
    if len(set(ids)) != len(ids):
        dup = next(i for i, c in Counter(ids).items() if c > 1)
        raise ValueError(f"{dataset}: problem id {dup!r} appears more than once")
    path = Path(out_path) if out_path is not None else None
    old_rows = read_rows(path) if path is not None else []
    if path is not None and path.exists() and not path.read_text().endswith("\n"):
        # Every row is written with its newline, so a missing one means a torn last write:
        # rewrite the file without it, or the next append would glue two rows together.
        tmp = path.with_name(path.name + ".tmp")
        tmp.unlink(missing_ok=True)
        _append_rows(tmp, old_rows)
        tmp.replace(path)
    latest = _latest_by_key(old_rows)
    done = {key for key, row in latest.items() if not infra_failed(row)}

    todo = [(p, i) for p in problems for i in range(n) if (str(p["id"]), i) not in done]
    skipped = len(problems) * n - len(todo)
    if skipped:
        logger.info(f"{dataset}: resuming, {skipped} of {len(problems) * n} samples already done, {len(todo)} to go")
    t0 = time.time()
    new_rows: list[dict] = []
    for start in range(0, len(todo), chunk_size):
        chunk = todo[start : start + chunk_size]
        # Each sample is its own 1-sample group: group_id is then the index into `chunk`.
        with _chunk_seed(engine, f"{dataset}/{chunk[0][0]['id']}/{chunk[0][1]}/{start}"):
            trajs, _ = engine.run([p for p, _ in chunk], 1)
        if len(trajs) != len(chunk):
            raise RuntimeError(f"engine returned {len(trajs)} trajectories for {len(chunk)} samples")
        rows = [trajectory_row(t, chunk[t.group_id][0], chunk[t.group_id][1], dataset) for t in trajs]
        if path is not None:
            _append_rows(path, rows)
        new_rows += rows
        if stop_on_infra_failure and rows and all(infra_failed(r) for r in rows):
            first = next((r["error"] for r in rows if r.get("error")), None) or "the sandbox failed (sandbox_error)"
            raise EvalInfraError(
                f"{dataset}: all {len(rows)} samples of a chunk failed for infrastructure reasons (backend or "
                f"sandbox), first: {first}"
                + ("; fix it and rerun: failed samples are retried, finished ones kept" if path is not None else "")
            )
        logger.info(f"{dataset}: {start + len(chunk)}/{len(todo)} samples ({time.time() - t0:.1f}s)")
    failed = [r for r in new_rows if infra_failed(r)]
    if failed:
        logger.warning(
            f"{dataset}: {len(failed)} samples failed on the sandbox or backend (first: "
            f"{next((r['error'] for r in failed if r.get('error')), 'no cause reported')}); they count neither "
            "right nor wrong" + ("; rerunning the same command retries them" if path is not None else "")
        )

    latest.update(_latest_by_key(new_rows))
    wanted = {(pid, i) for pid in ids for i in range(n)}
    order = {pid: j for j, pid in enumerate(ids)}
    rows = sorted(
        (r for k, r in latest.items() if k in wanted), key=lambda r: (order[str(r["problem_id"])], r["sample_idx"])
    )
    # Rows whose backend or env raised are dropped here (a sandbox failure is dropped by
    # dataset_metrics itself), so that neither kind counts as a wrong answer.
    graded = [r for r in rows if not (r.get("rollout_error") or r.get("finish_reason") == "error")]
    metrics = dataset_metrics(graded, n, pass_ks, equivalent)
    metrics["rollout_error_samples"] = len(rows) - len(graded)
    metrics["resumed_samples"] = skipped
    metrics["new_samples"] = len(new_rows)
    metrics["seconds"] = time.time() - t0
    return metrics, rows


def evaluate(
    engine: Any,
    cfg: EvalConfig,
    out_dir: str | Path | None = None,
    *,
    datasets: dict[str, list[dict]] | None = None,
    meta: dict[str, Any] | None = None,
    equivalent: Callable[[str, str], bool] = answers_equivalent,
) -> dict[str, Any]:
    """Evaluate on every dataset of `cfg` (or the given in-memory `datasets`); return the summary.

    engine: a `RolloutEngine` whose env factory builds the env to evaluate in (the trainer passes
        its own engine). For the duration of the call its config is the eval's
        (`eval_rollout_config`: temperature, top-p, seed and any budget overrides); it is restored
        afterwards.
    Writes `<out_dir>/<dataset>.jsonl` (per sample, resumable) and `<out_dir>/summary.json`, and
    logs a table. With out_dir=None nothing is written and nothing is resumed.
    meta: extra top-level entries of the summary (e.g. the model name, the training step).
    equivalent: how maj@N groups answers (`run_eval`: `grader_equivalence` of `env.grader`).
    Summary: {"datasets": {name: metrics}, "six_benchmark_avg": {...} or None, "eval_config", **meta}.
    """
    from envs.data import load_problems

    if isinstance(datasets, (list, tuple)):
        raise TypeError("datasets: pass {name: problems}; dataset names go in cfg.datasets")
    if datasets is None:
        datasets = {name: load_problems(name, limit=cfg.limit) for name in cfg.datasets}
    elif cfg.limit is not None:
        datasets = {name: probs[: cfg.limit] for name, probs in datasets.items()}
    out = Path(out_dir) if out_dir is not None else None
    per_dataset: dict[str, dict] = {}
    with engine.configured(eval_rollout_config(cfg, engine.cfg)):
        for name, problems in datasets.items():
            key = dataset_key(name)
            n = cfg.n if cfg.n is not None else default_n(key)
            metrics, _ = evaluate_problems(
                engine,
                problems,
                n,
                dataset=key,
                out_path=out / f"{key}.jsonl" if out is not None else None,
                pass_ks=cfg.pass_ks,
                chunk_size=cfg.chunk_size,
                equivalent=equivalent,
            )
            per_dataset[key] = metrics
    summary: dict[str, Any] = {
        "datasets": per_dataset,
        "six_benchmark_avg": benchmark_average(per_dataset),
        "eval_config": asdict(cfg),
        **(meta or {}),
    }
    logger.info("\n" + format_table(summary))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        tmp.replace(out / "summary.json")
    return summary


def format_table(summary: dict) -> str:
    """A fixed-width console table of the summary: fractions in [0, 1], as in summary.json and in
    training's eval/* metrics (columns: docs/metrics.md)."""
    per = summary["datasets"]
    ks = sorted({int(k[5:]) for m in per.values() for k in m if k.startswith("pass@")})
    head = (
        ["dataset", "probs", "N", "avg@N"]
        + [f"pass@{k}" for k in ks]
        + ["maj@N", "tools", "err", "tmo", "len", "infra_err"]
    )
    lines = []
    for name, m in per.items():
        n = m["n"]
        lines.append(
            [name, str(m["problems"]), str(n), f"{m[f'avg@{n}']:.3f}"]
            + [f"{m[f'pass@{k}']:.3f}" if f"pass@{k}" in m else "-" for k in ks]
            + [
                f"{m[f'maj@{n}']:.3f}",
                f"{m['mean_tool_calls']:.2f}",
                f"{m['code_error_rate']:.3f}",
                f"{m['timeout_rate']:.3f}",
                f"{m['mean_response_tokens']:.0f}",
                str(m["sandbox_error_samples"] + m.get("rollout_error_samples", 0)),
            ]
        )
    six = summary.get("six_benchmark_avg")
    if six:
        lines.append(["six-avg", "", "", f"{six['avg@n']:.3f}"] + [""] * (len(head) - 4))
    widths = [max(len(h), *(len(r[i]) for r in lines)) if lines else len(h) for i, h in enumerate(head)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(r) for r in lines])
