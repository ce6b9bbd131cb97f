"""`stare-eval`: build everything from one config, evaluate, close; one output directory per
model and settings.

- `model.path` may name a training run directory: its `final/` model is evaluated with the run's
  own model, env, rollout and data settings (command-line overrides still win), so the policy
  sees the prompt and budgets it was trained with.
- `eval.datasets` may name `arithmetic`: the held-out split of the synthetic training task
  (`data.arithmetic_eval_size` problems of seed `data.seed`, as the training run evaluates).
- The output directory (`out_dir`; default `runs/eval/<model name>-<key>`) records what it
  evaluated in `eval_key.json`: a hash of the model's weights and of every setting that changes a
  sample. Rerunning into it resumes; a different model or different settings are refused with
  the changes named. Settings that only choose *which* samples to make (datasets, limit, n,
  pass@k, chunk size, concurrency, server URLs, sandbox workers) may change on a resume.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from loguru import logger

from envs.retool import RetoolConfig
from sandbox import SandboxConfig
from stare_tir.components import build_components
from stare_tir.config import flatten, resolve_config, save_config
from stare_tir.data import DataConfig, load_split
from stare_tir.errors import StartupError
from stare_tir.eval.evaluate import EvalConfig, eval_rollout_config, evaluate
from stare_tir.eval.metrics import grader_equivalence
from stare_tir.model import ModelConfig, model_fingerprint, resolve_model_path
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS
from stare_tir.rollout.engine import RolloutConfig

KEY_FILE = "eval_key.json"
# The name of the synthetic training task's held-out split in eval.datasets.
TRAINING_TASK = "arithmetic"


@dataclass
class EvalRunConfig:
    """Everything `scripts/eval_aime.py` needs (sections reuse the training components' configs)."""

    # The user's own modules, imported before the rest is validated (a grader, a reward function's
    # module, a backend: stare_tir/plugins.py); a training run as model.path adds its own.
    plugins: list[str] = field(default_factory=list)
    # The model, with the same keys as in training: model.path (an HF directory such as a training
    # run's final/, a training run directory itself, a hub id, "tiny" for the shipped tiny base,
    # "tiny-random"), model.tokenizer, model.chat_template, model.trust_remote_code.
    model: ModelConfig = field(default_factory=ModelConfig)
    # Rollout backend: hf (in-process transformers, CPU or one GPU) or sglang (running servers at
    # rollout.sglang.urls; the model is whatever they serve, `model` then only names the run).
    backend: str = field(default="hf", metadata={"choices": ROLLOUT_BACKENDS.names})
    # Output directory; "" = runs/eval/<model name>-<hash of the model and settings>. Rerunning
    # into the same directory resumes; another model or other settings are refused there.
    out_dir: str = ""
    eval: EvalConfig = field(default_factory=EvalConfig)
    # Engine settings (concurrency, backend tuning); eval.* sampling settings override its own.
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    env: RetoolConfig = field(default_factory=RetoolConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    # The synthetic task's held-out split for eval.datasets=[arithmetic]: its size
    # (data.arithmetic_eval_size) and seed (data.seed); taken from the run when model.path names one.
    data: DataConfig = field(default_factory=DataConfig)

    def __post_init__(self) -> None:
        ROLLOUT_BACKENDS.check(self.backend, "backend")
        ROLLOUT_BACKENDS.get(self.backend).check_config(self.rollout, "backend")  # sglang: its URLs


# ----------------------------------------------------------------------------------------------
# A training run directory as the model


def is_run_dir(path: str) -> bool:
    """A training run directory (config.yaml, no config.json of its own), not a model directory."""
    p = Path(path).expanduser()
    return (p / "config.yaml").is_file() and not (p / "config.json").is_file()


def checkpoint_of_run(path: str) -> Path | None:
    """`path` as an RL checkpoint of a training run (<run>/checkpoints/step_NNNNNN, holding
    DeepSpeed's files), or None. stare-eval evaluates it through its export, <run>/hf/step_NNNNNN."""
    p = Path(path).expanduser()
    if (p / "deepspeed").is_dir() and p.parent.name == "checkpoints" and is_run_dir(str(p.parent.parent)):
        return p
    return None


def with_run_settings(tree: dict, run_dir: Path, model_dir: Path | None = None) -> dict:
    """`tree` (an eval config as a nested dict) with a training run's final/ model (or
    `model_dir`, an export of one of its checkpoints) and its model, env, rollout and data
    settings; the caller applies command-line overrides after this."""
    import yaml

    final = model_dir or run_dir / "final"
    if model_dir is None and not (final / "config.json").is_file():
        raise StartupError(
            f"model.path={str(run_dir)!r} is a training run without a final model yet (no final/config.json): "
            "let it finish, or evaluate one of its checkpoints, model.path="
            + str(run_dir / "checkpoints" / "step_NNNNNN")
        )
    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except yaml.YAMLError as e:
        raise StartupError(f"{run_dir / 'config.yaml'}: not valid YAML ({e})") from None
    merged = dict(tree)
    for section in ("model", "env", "rollout", "data"):
        if isinstance(saved.get(section), dict):
            merged[section] = dict(saved[section])
    merged["model"] = {**merged.get("model", {}), "path": str(final)}
    given, run_plugins = merged.get("plugins") or [], saved.get("plugins") or []
    if run_plugins:  # the run's own modules: its grader or reward function grades here too
        merged["plugins"] = list(dict.fromkeys([*given, *run_plugins]))
    return merged


def resolve_eval_config(tree: dict, overrides: list[str]) -> EvalRunConfig:
    """The eval config from a (file) tree and overrides; a run directory as model.path brings the
    run's own settings in between (the file < the run < the command line)."""
    cfg = resolve_config(EvalRunConfig, tree, overrides)
    ckpt = checkpoint_of_run(cfg.model.path)
    if ckpt is not None:  # evaluated through its export (stare_tir.app.export), made before the model loads
        run_dir, target = ckpt.parent.parent, ckpt.parent.parent / "hf" / ckpt.name
        cfg = resolve_config(EvalRunConfig, with_run_settings(tree, run_dir, target), overrides)
        cfg.model.path = str(target)
        return cfg
    if not is_run_dir(cfg.model.path):
        return cfg
    run_dir = Path(cfg.model.path)
    cfg = resolve_config(EvalRunConfig, with_run_settings(tree, run_dir), overrides)
    cfg.model.path = str(run_dir / "final")
    return cfg


# ----------------------------------------------------------------------------------------------
# Datasets, identity and the output directory


def load_eval_datasets(cfg: EvalRunConfig, limit: int | None = None) -> dict[str, list[dict]]:
    """{name: problems} of eval.datasets; `arithmetic` is the training task's held-out split."""
    from envs.data import load_problems

    limit = cfg.eval.limit if limit is None else limit
    out = {}
    for name in cfg.eval.datasets:
        if name == TRAINING_TASK:
            problems = load_split(replace(cfg.data, eval=TRAINING_TASK), "eval")
            out[name] = problems[:limit] if limit is not None else problems
        else:
            out[name] = load_problems(name, limit=limit)
    return out


# Settings that decide what one sample is; everything else only decides which samples are made.
_SAMPLE_SETTINGS = ("model.tokenizer", "model.chat_template", "model.trust_remote_code", "backend", "data.seed")
_SAMPLE_PREFIXES = ("env.", "sandbox.backend", "sandbox.limits.")
_ROLLOUT_SAMPLE_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "max_turns",
    "max_total_tokens",
    "max_new_tokens_per_turn",
    "stop_strings",
)


def eval_identity(cfg: EvalRunConfig, model_path: str) -> dict[str, Any]:
    """What the samples of an evaluation depend on: the model's weights and the sampling, env and
    sandbox settings in effect (eval.* over rollout.*)."""
    flat = flatten(cfg)
    effective = eval_rollout_config(cfg.eval, cfg.rollout)
    identity = {"model": model_fingerprint(model_path), "model.path": cfg.model.path}
    identity.update({k: v for k, v in flat.items() if k in _SAMPLE_SETTINGS or k.startswith(_SAMPLE_PREFIXES)})
    identity.update({f"sampling.{k}": getattr(effective, k) for k in _ROLLOUT_SAMPLE_KEYS})
    if not cfg.env.reward:  # the grader grades: absent, so evaluations from before env.reward keep their key
        identity.pop("env.reward", None)
        identity.pop("env.reward_timeout_s", None)
    return identity


def identity_key(identity: dict) -> str:
    """The identity without the model's path (the same weights elsewhere are the same model)."""
    import hashlib

    kept = {k: v for k, v in identity.items() if k != "model.path"}
    return hashlib.sha256(json.dumps(kept, sort_keys=True, default=str).encode()).hexdigest()[:12]


def default_out_dir(model: str, key: str) -> Path:
    """runs/eval/<last two parts of the model's path or hub id>-<key>: a different model or
    different settings get a different directory, the same command the same one."""
    parts = [p for p in Path(model.rstrip("/")).parts if p not in ("/", ".", "..")][-2:] or ["model"]
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in "_".join(parts))
    return Path("runs") / "eval" / f"{name}-{key}"


def claim_out_dir(out: Path, identity: dict) -> None:
    """Refuse an output directory whose rows come from another model or other settings."""
    rows = sorted(p.name for p in out.glob("*.jsonl")) if out.is_dir() else []
    if not rows:
        return  # nothing evaluated there yet: free
    key_path = out / KEY_FILE
    if not key_path.is_file():
        raise StartupError(
            f"out_dir={str(out)!r} holds evaluation rows ({', '.join(rows)}) without a record of the model and "
            f"settings that made them ({KEY_FILE}): name another out_dir, or delete it"
        )
    stored = json.loads(key_path.read_text()).get("identity", {})
    changed = [
        f"{k}: {stored.get(k)!r} -> {identity.get(k)!r}"
        for k in sorted(set(stored) | set(identity))
        if stored.get(k) != identity.get(k) and k != "model.path"
    ]
    if changed:
        raise StartupError(
            f"out_dir={str(out)!r} holds an evaluation of another model or with other settings "
            f"({'; '.join(changed)}): its samples would be mixed with these; leave out_dir empty (one "
            "directory per model and settings), name another, or delete it"
        )


def run_eval(cfg: EvalRunConfig, run_dir: str | None = None) -> dict[str, Any]:
    """Build tokenizer, backend, sandbox and engine from `cfg`, evaluate, close; return the summary."""
    model_path = resolve_model_path(cfg.model)
    identity = eval_identity(cfg, model_path)
    key = identity_key(identity)
    out = Path(cfg.out_dir) if cfg.out_dir else default_out_dir(cfg.model.path, key)
    claim_out_dir(out, identity)
    datasets = load_eval_datasets(cfg)
    out.mkdir(parents=True, exist_ok=True)
    (out / KEY_FILE).write_text(json.dumps({"key": key, "identity": identity}, indent=2, default=str) + "\n")
    save_config(cfg, out / "config.yaml")
    logger.info(f"evaluating {cfg.model.path} into {out}")

    parts = build_components(cfg.model, cfg.backend, cfg.rollout, cfg.env, cfg.sandbox, model_path=model_path)
    try:
        parts.backend.claim_servers()  # SGLang: a pause a killed trainer left would hold every request
        summary = evaluate(
            parts.engine,
            cfg.eval,
            out,
            datasets=datasets,
            meta={
                "model": cfg.model.path,
                "model_fingerprint": identity["model"],
                "run_dir": run_dir,
                "backend": cfg.backend,
                "sandbox": (parts.engine.sandbox.info if parts.engine.sandbox is not None else {}),
                "grader": cfg.env.grader,
            },
            equivalent=grader_equivalence(cfg.env.grader, finer_decimals=cfg.env.grade_finer_decimals),
        )
    finally:
        parts.close()
    summary = keep_dataset_summaries(out, summary)
    logger.info(f"wrote {out / 'summary.json'} and per-sample rows in {out}")
    return summary


def keep_dataset_summaries(out: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """One summary per dataset (`summary.<dataset>.json`), and summary.json over every dataset
    evaluated into `out` so far: evaluating one dataset after another into the same directory
    keeps the first one's numbers (summary.json alone was replaced by the last evaluation)."""
    from stare_tir.eval.metrics import benchmark_average

    common = {k: v for k, v in summary.items() if k not in ("datasets", "six_benchmark_avg")}
    for name, metrics in summary["datasets"].items():
        (out / f"summary.{name}.json").write_text(
            json.dumps({**common, "dataset": name, "metrics": metrics}, indent=2, default=str) + "\n"
        )
    merged: dict[str, dict] = {}
    for path in sorted(out.glob("summary.*.json")):
        data = json.loads(path.read_text())
        if "dataset" in data and "metrics" in data:
            merged[data["dataset"]] = data["metrics"]
    merged.update(summary["datasets"])
    summary = {**summary, "datasets": merged, "six_benchmark_avg": benchmark_average(merged)}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=2, default=str) + "\n")
    tmp.replace(out / "summary.json")
    return summary
