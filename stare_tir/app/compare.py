"""`stare-compare RUN_OR_EVAL_DIR...`: the summary fields of runs and evaluations side by side.

A training run directory contributes what its metrics.jsonl says over the whole run, every launch
of a resumed run included (accuracy before RL, the best held-out accuracy and its step, when the
STARE gate first opened, the gate's share of steps, entropy at the first and last step, steps, the
steps' time), and its summary.json what only the end of a run knows (the final model's accuracy and
tool calls, the last launch's wall time). A run that has not finished (no summary.json yet) is shown
with what it has, marked unfinished, instead of failing the table. An evaluation directory (`stare-eval`'s out_dir) one block of rows per dataset (avg@N,
pass@k, maj@N, tool calls, response length). One row per field, one column per directory, printed
as a fixed-width table; `--csv FILE` and `--markdown FILE` write the same table. Light: no torch.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from pathlib import Path
from typing import Any

from stare_tir.tracking import first_gate_step, read_metrics

# (row label, summary.json key) of a training run, in the order a reader checks them.
RUN_FIELDS = (
    ("held-out acc before RL", "acc_before_rl"),
    ("held-out acc after RL (final)", "acc_after_rl"),
    ("best held-out acc", "best_acc"),
    ("best acc at step", "best_acc_step"),
    ("STARE gate first open at step", "gate_first_step"),
    ("gate on (fraction of steps)", "gate_on_fraction"),
    ("tool calls / answer before RL", "tool_calls_before_rl"),
    ("tool calls / answer after RL", "tool_calls_after_rl"),
    ("entropy first step", "entropy_first_step"),
    ("entropy last step", "entropy_last_step"),
    ("RL steps", "steps"),
    ("grader", "grader"),
)
# What metrics.jsonl gives for the whole run (every launch): these keys are taken from it.
FROM_METRICS = (
    "acc_before_rl",
    "tool_calls_before_rl",
    "best_acc",
    "best_acc_step",
    "gate_first_step",
    "gate_on_fraction",
    "entropy_first_step",
    "entropy_last_step",
    "steps",
)
# Per dataset of an evaluation: (row label, metric key or a function of the metrics).
EVAL_FIELDS = (
    ("problems", "problems"),
    ("samples per problem", "n"),
    ("avg@N", lambda m: m.get(f"avg@{m.get('n')}")),
    ("maj@N", lambda m: m.get(f"maj@{m.get('n')}")),
    ("pass@k (largest k)", lambda m: _largest_pass(m)),
    ("tool calls / sample", "mean_tool_calls"),
    ("code error rate", "code_error_rate"),
    ("response tokens", "mean_response_tokens"),
)


class CompareError(ValueError):
    """A directory that holds neither a run's nor an evaluation's summary."""


def _largest_pass(m: dict) -> float | None:
    ks = sorted(int(k[5:]) for k in m if k.startswith("pass@") and k[5:].isdigit())
    return m[f"pass@{ks[-1]}"] if ks else None


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CompareError(f"{path}: cannot be read ({e})") from None


def eval_datasets(directory: Path) -> dict[str, dict]:
    """dataset -> metrics of an evaluation directory: every per-dataset summary
    (summary.<dataset>.json) and the datasets of summary.json (an older directory holds only it)."""
    found: dict[str, dict] = {}
    if (directory / "summary.json").is_file():
        found.update(_read_json(directory / "summary.json").get("datasets") or {})
    for path in sorted(directory.glob("summary.*.json")):
        data = _read_json(path)
        if "dataset" in data and "metrics" in data:
            found[data["dataset"]] = data["metrics"]
    return found


def run_metrics(rows: list[dict]) -> dict[str, Any]:
    """The summary fields that metrics.jsonl rows give, over every row (all launches of a run)."""
    train = list({r["step"]: r for r in rows if "entropy/batch" in r and isinstance(r.get("step"), int)}.values())
    train.sort(key=lambda r: r["step"])
    evals = [(r["step"], r["eval/acc"]) for r in rows if isinstance(r.get("eval/acc"), (int, float))]
    best = max(evals, key=lambda e: (e[1], -e[0])) if evals else (None, None)
    before = next((r for r in rows if r.get("step") == 0 and "eval/acc" in r), {})
    step_s = [r["time/step"] for r in train if isinstance(r.get("time/step"), (int, float))]
    return {
        "acc_before_rl": before.get("eval/acc"),
        "tool_calls_before_rl": before.get("eval/tool_calls"),
        "best_acc": best[1],
        "best_acc_step": best[0],
        "gate_first_step": first_gate_step(train),
        "gate_on_fraction": sum(r.get("stare/gate_on", 0.0) for r in train) / len(train) if train else None,
        "entropy_first_step": train[0]["entropy/batch"] if train else None,
        "entropy_last_step": train[-1]["entropy/batch"] if train else None,
        "steps": train[-1]["step"] if train else None,
        "step_seconds": round(sum(step_s), 1) if step_s else None,
    }


def _config(d: Path) -> dict:
    """The directory's config.yaml as a mapping ({} when there is none or it cannot be read)."""
    import yaml

    try:
        tree = yaml.safe_load((d / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return tree if isinstance(tree, dict) else {}


def _run_column(d: Path, summary: dict) -> dict[str, Any]:
    """A training run's column: metrics.jsonl for the whole run, summary.json for its end."""
    metrics = run_metrics(read_metrics(d)) if (d / "metrics.jsonl").is_file() else {}
    status = "finished" if summary else "unfinished (no summary.json yet)"
    ended, now = summary.get("steps"), metrics.get("steps")
    if isinstance(ended, int) and isinstance(now, int) and now > ended:  # extended, and running again
        status = f"unfinished (its summary.json is from step {ended})"
        summary = {k: v for k, v in summary.items() if k not in ("acc_after_rl", "tool_calls_after_rl", "seconds")}
    values = {**summary, **{k: metrics[k] for k in FROM_METRICS if k in metrics}}
    if "grader" not in values:  # an unfinished run: its config says
        values["grader"] = (_config(d).get("env") or {}).get("grader")
    column: dict[str, Any] = {"status": status}
    for label, key in RUN_FIELDS:
        column[label] = values.get(key)
    column["RL step time, all launches (s)"] = metrics.get("step_seconds")
    seconds = summary.get("seconds") or {}
    column["wall time, last launch (s)"] = round(sum(seconds.values()), 1) if seconds else None
    return column


def summarize(directory: str | Path) -> dict[str, Any]:
    """One column: {row label: value} of a run or an evaluation directory."""
    d = Path(directory)
    summary_path = d / "summary.json"
    if not d.is_dir():
        raise CompareError(f"{d}: no such directory (pass run directories or stare-eval output directories)")
    summary = _read_json(summary_path) if summary_path.is_file() else {}
    column: dict[str, Any] = {}
    if summary and "datasets" not in summary:
        return _run_column(d, summary)  # a finished training run
    datasets = eval_datasets(d)
    if not datasets and not summary and ((d / "metrics.jsonl").is_file() or "trainer" in _config(d)):
        return _run_column(d, summary)  # a training run that has not finished
    if not datasets:
        raise CompareError(
            f"{d}: holds no summary.json, metrics.jsonl or training config.yaml (not a run or evaluation directory)"
        )
    for name, metrics in sorted(datasets.items()):
        for label, key in EVAL_FIELDS:
            column[f"{name}: {label}"] = key(metrics) if callable(key) else metrics.get(key)
    if summary.get("six_benchmark_avg"):
        column["six-benchmark avg@N"] = summary["six_benchmark_avg"].get("avg@n")
    return column


def compare(directories: list[str | Path]) -> tuple[list[str], list[list[str]]]:
    """The table: a header (field, then one name per directory) and one row per field seen in any."""
    columns = [summarize(d) for d in directories]
    names = [Path(d).name or str(d) for d in directories]
    if len(set(names)) < len(names):  # same last component: show the full paths
        names = [str(d) for d in directories]
    labels: list[str] = []
    for col in columns:
        labels += [label for label in col if label not in labels]
    rows = [[label, *(_cell(col.get(label)) for col in columns)] for label in labels]
    return ["field", *names], rows


def _cell(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) >= 1000 else f"{v:.3f}"
    return str(v)


def as_text(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def as_markdown(header: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(out + ["| " + " | ".join(r) + " |" for r in rows]) + "\n"


def as_csv(header: list[str], rows: list[list[str]]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows(rows)
    return buf.getvalue()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="stare-compare",
        description="Summary fields of training runs and evaluations side by side (one column per directory).",
    )
    p.add_argument(
        "dirs", nargs="+", metavar="RUN_OR_EVAL_DIR", help="run directories and stare-eval output directories"
    )
    p.add_argument("--csv", metavar="FILE", help="also write the table as CSV")
    p.add_argument("--markdown", metavar="FILE", help="also write the table as Markdown")
    args = p.parse_args(argv)
    try:
        header, rows = compare(args.dirs)
    except CompareError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(as_text(header, rows))
    for path, render in ((args.csv, as_csv), (args.markdown, as_markdown)):
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(render(header, rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
