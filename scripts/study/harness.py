"""What the studies share: arms x seeds of `scripts/train_tir.py` runs from one SFT checkpoint.

A study names its arms (config overrides) and its seeds; this module builds the shared SFT
checkpoint once, launches every arm/seed run that is not finished (in parallel, each to its own
log, resumed from its last checkpoint when it has one), reads each run's metrics back, and holds
the small numeric and formatting helpers the tables use. It also checks a run borrowed from
another study (same settings key by key, byte-identical SFT weights) before its rows are used.

Layout under a study's output directory `<out>`: `<out>/sft_base/` (the SFT run, its model in
`sft/model`), `<out>/<arm>_s<seed>/` (one run directory per arm and seed) and
`<out>/<arm>_s<seed>.log`. A run is finished when its directory holds summary.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "scripts" / "train_tir.py"
TINY_CPU = ROOT / "configs" / "tiny_cpu.yaml"
if str(ROOT) not in sys.path:  # the studies run from a checkout without installing it
    sys.path.insert(0, str(ROOT))


def run_dir(out: Path, arm: str, seed: int) -> Path:
    """Where one arm's run for one seed lives."""
    return Path(out) / f"{arm}_s{seed}"


def is_finished(rd: Path) -> bool:
    return (Path(rd) / "summary.json").is_file()


def run_logged(cmd: list[str], log: Path, threads: int | None = None) -> int:
    """Run one command from the repository root, stdout and stderr to `log`; its exit status."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with open(log, "w") as fh:
        return subprocess.run(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode


def ensure_sft(out: Path, overrides: list[str], threads: int | None = None) -> str:
    """The shared SFT checkpoint, built once under <out>/sft_base (a one-step run whose SFT stage
    is what is kept); every arm starts from it."""
    base = Path(out) / "sft_base"
    model = base / "sft" / "model"
    if not (model / "config.json").is_file():
        print(f"[study] building shared SFT checkpoint in {base}", flush=True)
        cmd = [sys.executable, str(TRAIN), f"trainer.run_dir={base}", "trainer.steps=1", "trainer.eval_every=0"]
        rc = run_logged([*cmd, "data.arithmetic_eval_size=8", *overrides], Path(out) / "sft_base.log", threads)
        if rc != 0 or not (model / "config.json").is_file():
            raise SystemExit(f"SFT failed (rc={rc}); see {Path(out) / 'sft_base.log'}")
    return str(model)


def arm_settings(rd: Path, sft: str, seed: int, overrides: list[str]) -> list[str]:
    """One arm/seed run's KEY=VALUE settings: from the shared SFT weights (SFT off), the same data
    order for every arm (data.seed=0) and the seed's sampling seed, then the arm's own."""
    return [f"trainer.run_dir={rd}", f"model.path={sft}", "sft.enabled=false", f"trainer.seed={seed}", "data.seed=0", *overrides]  # fmt: skip


def arm_command(rd: Path, sft: str, seed: int, overrides: list[str]) -> list[str]:
    """The run's command line: resumed when it has a checkpoint, else started over."""
    resume = ["--resume"] if (Path(rd) / "checkpoints" / "latest").is_file() else ["--overwrite"]
    return [sys.executable, str(TRAIN), *arm_settings(rd, sft, seed, overrides), *resume]


def run_arms(
    arms: Iterable[str],
    seeds: Iterable[int],
    out: Path,
    overrides: Callable[[str, int], list[str]],
    sft: str,
    jobs: int = 1,
    threads: int | None = None,
    where: Callable[[str, int], Path] | None = None,
) -> None:
    """Launch every unfinished arm/seed run, `jobs` at a time. Seed-major, so an interrupted study
    holds every arm at the seeds it reached. `where` maps an arm and seed to its run directory
    (default: run_dir under `out`); a directory outside `out` is borrowed and never run."""
    where = where or (lambda arm, seed: run_dir(out, arm, seed))
    arms = list(arms)
    todo = []
    for seed in seeds:
        for arm in arms:
            rd = where(arm, seed)
            if rd.parent != Path(out):
                continue
            if is_finished(rd):
                print(f"[study] skip {rd} (done)", flush=True)
                continue
            todo.append((arm, seed, arm_command(rd, sft, seed, overrides(arm, seed))))

    def launch(item: tuple[str, int, list[str]]) -> None:
        arm, seed, cmd = item
        t0 = time.time()
        rc = run_logged(cmd, Path(out) / f"{arm}_s{seed}.log", threads)
        print(f"[study] {arm} seed={seed} rc={rc} {time.time() - t0:.0f}s", flush=True)

    t_all = time.time()
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(launch, todo))
    print(f"[study] {len(todo)} runs in {time.time() - t_all:.0f}s with {jobs} parallel job(s)", flush=True)


def read_run(rd: Path) -> tuple[list[dict], list[tuple[int, float]], dict]:
    """A finished run's step rows (one per RL step, the last written wins after a resume), its
    held-out evaluations as (step, accuracy) in step order, and its summary.json."""
    every = [json.loads(line) for line in (Path(rd) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = {r["step"]: r for r in every if "entropy/batch" in r}
    evals = {r["step"]: r["eval/acc"] for r in every if r.get("eval/acc") is not None}
    summary = json.loads((Path(rd) / "summary.json").read_text())
    return [steps[k] for k in sorted(steps)], sorted(evals.items()), summary


def mean(vals: Iterable) -> float | None:
    """Mean of the values that are not None (None when there are none)."""
    vals = [v for v in vals if v is not None]
    return sum(vals) / len(vals) if vals else None


def mean_sd(vals: Iterable) -> tuple[float | None, float | None]:
    """Mean and sample s.d. of the values that are not None (None when there are too few)."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return None, None
    m = sum(vals) / len(vals)
    return m, ((sum((v - m) ** 2 for v in vals) / (len(vals) - 1)) ** 0.5 if len(vals) > 1 else None)


def fmt(v: float | None, p: str = "{:.3f}", sd: float | None = None, missing: str = "n/a") -> str:
    """A table cell: the value, and ± its s.d. when there is one."""
    if v is None:
        return missing
    return p.format(v) + (" ± " + p.replace("+", "").format(sd) if sd is not None else "")


def smooth(y, k: int):
    """Trailing mean over k steps (NaN-aware), so noisy per-step curves stay readable."""
    import numpy as np

    out = np.full(len(y), np.nan)
    for i in range(len(y)):
        win = y[max(0, i - k + 1) : i + 1]
        if np.isfinite(win).any():
            out[i] = np.nanmean(win)
    return out


def write_report(docs: Path, stem: str, lines: list[str], payload: dict) -> None:
    """<docs>/<stem>.md (the table) and <docs>/<stem>.json (the numbers behind it)."""
    docs.mkdir(parents=True, exist_ok=True)
    (docs / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (docs / f"{stem}.json").write_text(json.dumps(payload, indent=1) + "\n")


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def _sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def check_borrowed(rd: Path, overrides: list[str], ignored: tuple[str, ...]) -> None:
    """Refuse a run of another study unless it trained with exactly the settings `overrides` give
    over configs/tiny_cpu.yaml and from the same SFT weights. Keys only one side knows (added
    since) must hold their defaults; keys starting with one of `ignored` may differ."""
    import yaml

    from stare_tir.config import load_config, to_dict
    from stare_tir.train_config import TrainConfig

    defaults = _flat(to_dict(TrainConfig()))
    mine = _flat(to_dict(load_config(TrainConfig, TINY_CPU, overrides)))
    theirs = _flat(yaml.safe_load((rd / "config.yaml").read_text()))
    if mine.get("trainer.backend") != "hf" or theirs.get("trainer.backend") != "hf":
        raise SystemExit(f"{rd}: borrowing runs assumes the HF backend on both sides")
    differ = []
    for key in sorted(set(mine) | set(theirs)):
        if key.startswith(ignored):
            continue
        if key not in theirs:  # a setting added since: it must be at its default (the old behaviour)
            if mine[key] != defaults.get(key):
                differ.append(f"{key}: {mine[key]!r} here, absent there")
        elif key not in mine or mine[key] != theirs[key]:
            differ.append(f"{key}: {mine.get(key, '<absent>')!r} here, {theirs[key]!r} there")
    weights, their_model = "model.safetensors", Path(theirs["model.path"])
    if not their_model.is_absolute():  # relative to where that study ran: the run dir's config names it
        root = rd.resolve()
        for _ in Path(theirs["trainer.run_dir"]).parts:
            root = root.parent
        their_model = root / their_model
    if _sha256(Path(mine["model.path"]) / weights) != _sha256(their_model / weights):
        differ.append(f"model.path: SFT weights differ ({mine['model.path']} vs {theirs['model.path']})")
    if differ:
        raise SystemExit(f"{rd} was trained with other settings; run it here instead: " + "; ".join(differ))


def study_parser(doc: str, *, seeds: list[int], steps: int, lr: float, out: str, jobs: int, threads: int | None):
    """The arguments every arms x seeds study takes, with that study's defaults."""
    import argparse

    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=seeds, help=f"RL seeds (trainer.seed), each arm runs each (default: {seeds})")  # fmt: skip
    p.add_argument("--steps", type=int, default=steps, help=f"RL steps per arm and seed (default: {steps})")
    p.add_argument("--lr", type=float, default=lr, help=f"RL learning rate, learner.lr (default: {lr})")
    p.add_argument("--out", default=out, help=f"run directories, logs, the shared SFT checkpoint; not committed (default: {out})")  # fmt: skip
    p.add_argument("--docs", default="docs/study", help="where the tables and figures go (default: docs/study)")
    p.add_argument("--jobs", type=int, default=jobs, help=f"runs launched in parallel (default: {jobs}; 2 on 2 cores with --threads 1)")  # fmt: skip
    p.add_argument("--threads", type=int, default=threads, help="OMP_NUM_THREADS per run (default: inherit)" if threads is None else f"OMP_NUM_THREADS per run (default: {threads})")  # fmt: skip
    p.add_argument("--report-only", action="store_true", help="launch nothing: only the table and figure of finished runs")  # fmt: skip
    return p
