"""Metrics out of the loop: one JSONL row per step, optional TensorBoard and W&B, and plots.

The JSONL file is the source of truth (resumable: a resumed run truncates rows past its checkpoint
so curves never hold a step twice); TensorBoard and W&B are mirrors enabled by config.
"""

from __future__ import annotations

import json
import math
import os
import uuid
from pathlib import Path
from typing import Any, Iterable

from loguru import logger


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):  # 0-d tensors / numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None if math.isnan(value) else (1e308 if value > 0 else -1e308)
    return value


WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(run_dir: str | Path, resume: bool) -> str:
    """The W&B run id of this run directory: the stored one when resuming, else a new one (stored).

    A resumed job then continues the same W&B run (wandb.init(id=..., resume="allow")) instead of
    starting a second run with the same name.
    """
    path = Path(run_dir) / WANDB_ID_FILE
    if resume and path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(run_id + "\n")
    return run_id


def setup_run_logging(run_dir: str | Path, rank: int | None = None, fresh: bool = False) -> Path:
    """Send log lines to <run_dir>/train.log (rank 0) or train.rank{N}.log (other ranks), each line
    tagged with its rank; returns the file. Two ranks never write the same file. fresh: a new run
    starts its log empty (a resumed one appends). Only rank 0 keeps the console: the other ranks'
    lines go to their files alone (N ranks would print every line N times)."""
    if rank is None:
        rank = int(os.environ.get("RANK", "0"))
    if rank != 0 and int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a launched rank, not a test of one
        try:
            logger.remove(0)  # loguru's default stderr sink
        except ValueError:
            pass  # already removed
    path = Path(run_dir) / ("train.log" if rank == 0 else f"train.rank{rank}.log")
    path.parent.mkdir(parents=True, exist_ok=True)
    logger.add(
        path,
        level="INFO",
        mode="w" if fresh else "a",
        enqueue=False,
        format="{time:YYYY-MM-DD HH:mm:ss.SSS} | rank" + str(rank) + " | {level: <8} | {name}:{line} - {message}",
    )
    return path


class MetricsLog:
    """Append-only metrics.jsonl (+ optional TensorBoard / W&B mirrors)."""

    def __init__(
        self,
        run_dir: str | Path,
        tensorboard: bool = False,
        wandb_project: str | None = None,
        run_name: str | None = None,
        config: dict | None = None,
        wandb_id: str | None = None,
    ) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._tb = None
        self._wandb = None
        # A mirror that was asked for and cannot be made is an error, never a warning: the start-up
        # checks (preflight.check_trackers) name the install command before anything runs.
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError as e:
                raise ImportError(f"trainer.tensorboard=true: {e}; pip install 'stare-tir[tracking]'") from None
            self._tb = SummaryWriter(str(Path(run_dir) / "tb"))
        if wandb_project:
            try:
                import wandb
            except ImportError as e:
                raise ImportError(f"trainer.wandb_project: {e}; pip install 'stare-tir[tracking]'") from None
            # dir: W&B's files (wandb/) go into the run directory, not the current one
            self._wandb = wandb.init(
                project=wandb_project, name=run_name, config=config, id=wandb_id, resume="allow", dir=str(run_dir)
            )

    def truncate_after(self, step: int) -> None:
        """Drop rows with step > `step` (written after the checkpoint a resumed run starts from)."""
        if not self.path.exists():
            return
        rows = [r for r in read_metrics(self.path) if r.get("step", -1) <= step]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _jsonable(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        numeric = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if self._tb is not None:
            for k, v in numeric.items():
                self._tb.add_scalar(k, v, step)
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)

    def log_table(self, step: int, name: str, columns: list[str], rows: list[list[Any]]) -> None:
        """A table to the mirrors that show one (W&B: a Table; TensorBoard: Markdown text).
        metrics.jsonl keeps numbers only: tables go to files of their own (trainer/samples.py)."""
        if self._wandb is not None:
            import wandb

            self._wandb.log({name: wandb.Table(columns=columns, data=rows)}, step=step)
        if self._tb is not None:
            cell = lambda v: str(v).replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
            lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
            self._tb.add_text(name, "\n".join(lines), step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def read_metrics(path: str | Path) -> list[dict]:
    """Rows of a metrics.jsonl (a run dir or the file itself); a torn last line is ignored."""
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves at most one partial line
    return rows


# (metric key, panel title) for the standard dashboard; missing keys are skipped.
PLOT_PANELS = [
    (("reward/mean", "acc/train"), "Reward and train accuracy"),
    (("eval/acc",), "Held-out accuracy"),
    (("entropy/batch",), "Policy entropy (target band shaded)"),
    (("stare/gate_on",), "STARE gate on (fraction of steps, running)"),
    (("rollout/tool_calls",), "Tool calls per trajectory"),
    (("rollout/response_len",), "Response length (tokens)"),
]


def first_gate_step(rows: list[dict]) -> int | None:
    """First RL step whose STARE gate was on (None: never, or not a STARE run)."""
    return next((r["step"] for r in rows if "entropy/batch" in r and r.get("stare/gate_on")), None)


def plot_runs(run_dirs: Iterable[str | Path], out_path: str | Path, band: float = 0.05) -> Path:
    """Overlay the standard curves of one or more runs into one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [(Path(d).name, read_metrics(d)) for d in run_dirs]
    # Two runs that drew the same curve must not look like one: each run its own dash pattern
    # (over the colour cycle); sparse series (evaluations) get markers, so 3 points read as 3.
    dashes = ["-", "--", "-.", ":"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    gate_opens = [(name, first_gate_step(rows)) for name, rows in runs]
    for ax, (keys, title) in zip(axes.flat, PLOT_PANELS):
        # The closed loop's switch: a dotted line where each run's gate first opened, in every panel
        # so that entropy, reward and accuracy can be read against it.
        for i, (name, step) in enumerate(gate_opens):
            if step is not None:
                ax.axvline(
                    step,
                    ls=":",
                    lw=1.2,
                    color="black" if len(runs) == 1 else f"C{i}",
                    label=f"{name}: gate opens (step {step})",
                )
        for run_no, (name, rows) in enumerate(runs):
            for key in keys:
                pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
                if not pts:
                    continue
                xs, ys = zip(*pts)
                if key == "stare/gate_on":  # running fraction reads better than a 0/1 square wave
                    acc, ys = 0.0, list(ys)
                    for i, y in enumerate(ys):
                        acc += y
                        ys[i] = acc / (i + 1)
                style = {"ls": dashes[run_no % len(dashes)] if len(runs) > 1 else "-"}
                if len(xs) <= 20 or key == "eval/acc":
                    style["marker"] = "o"
                    style["ms"] = 4
                ax.plot(xs, ys, label=f"{name} {key}" if len(keys) > 1 else name, **style)
            if keys == ("entropy/batch",):
                targets = [r["entropy/target"] for r in rows if isinstance(r.get("entropy/target"), (int, float))]
                if targets:
                    t = targets[-1]
                    ax.axhspan(t - band, t + band, alpha=0.15, color="gray")
                    ax.axhline(t, ls="--", lw=0.8, color="gray")
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines:
            ax.legend(fontsize=7)
    fig.tight_layout()
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


# Seconds between two plain progress lines when the console is no terminal (a Slurm .out file).
PROGRESS_INTERVAL_S = float(os.environ.get("STARE_PROGRESS_INTERVAL_S", "30"))


class PlainProgress:
    """tqdm's interface for a console that is no terminal: instead of carriage-return redraws and
    cursor codes (160 KB of bar updates in ten minutes of a Slurm .out file), one ordinary log line
    every PROGRESS_INTERVAL_S seconds and one at the end: `sft: 120/300 (40%), 2.1 it/s, eta 86 s, loss=0.43`."""

    def __init__(
        self,
        total: int | None,
        desc: str,
        unit: str = "it",
        initial: int = 0,
        interval_s: float | None = None,
        leave: bool = True,
    ):
        import time

        self.total, self.desc, self.unit, self.n = total, desc, unit, initial
        # leave=False (a bar inside a step, e.g. one rollout batch): a final line only when the
        # bar lasted long enough to print periodic ones, not one more line per batch.
        self.leave, self._printed = leave, False
        self._start_n, self._interval = initial, PROGRESS_INTERVAL_S if interval_s is None else interval_s
        self._t0 = self._last = time.monotonic()
        self._postfix: dict[str, Any] = {}

    def update(self, n: int = 1) -> None:
        import time

        self.n += n
        now = time.monotonic()
        if now - self._last >= self._interval:
            self._last, self._printed = now, True
            logger.info(self.line())

    def set_postfix(self, **kwargs: Any) -> None:
        self._postfix = kwargs

    def line(self) -> str:
        import time

        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate = (self.n - self._start_n) / elapsed
        head = f"{self.desc}: {self.n}" + (f"/{self.total} ({self.n / self.total:.0%})" if self.total else "")
        parts = [head, f"{rate:.2f} {self.unit}/s" if rate >= 0.1 else f"{1 / rate:.1f} s/{self.unit}" if rate else ""]
        if self.total and rate > 0:
            parts.append(f"eta {(self.total - self.n) / rate:.0f} s")
        parts += [f"{k}={v}" for k, v in self._postfix.items()]
        return ", ".join(p for p in parts if p)

    def close(self) -> None:
        if self.n != self._start_n and (self.leave or self._printed):
            logger.info(self.line() + " (done)" if self.total and self.n >= self.total else self.line())
        self._start_n = self.n  # closed: a second close prints nothing

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def progress(
    total: int | None, desc: str, unit: str = "it", *, enabled: bool = True, initial: int = 0, leave: bool = True
) -> Any:
    """A progress bar: tqdm on a terminal, PlainProgress lines when stderr is a file or a pipe, a
    silent one when not enabled (other ranks)."""
    import sys

    if enabled and sys.stderr.isatty():
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=leave, dynamic_ncols=True)
    bar = PlainProgress(total, desc, unit, initial, leave=leave)
    if not enabled:
        bar.update = lambda n=1: setattr(bar, "n", bar.n + n)  # type: ignore[method-assign]
        bar.close = lambda: None  # type: ignore[method-assign]
    return bar
