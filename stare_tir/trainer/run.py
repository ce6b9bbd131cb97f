"""One training run's parts, built once: learner, rollout components, token methods, data, log."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from loguru import logger

from stare_tir.algos.token_methods import RunMethods
from stare_tir.components import Components, build_components
from stare_tir.config import to_dict
from stare_tir.data import PromptSampler, load_split
from stare_tir.learner import Learner
from stare_tir.model import load_tokenizer
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS, Backend
from stare_tir.rollout.engine import RolloutEngine
from stare_tir.tracking import MetricsLog, wandb_run_id
from stare_tir.train_config import TrainConfig


@dataclass
class Run:
    """Everything one training run holds; built by `build_run`, used by `rl_step`."""

    cfg: TrainConfig
    run_dir: Path
    parts: Components  # tokenizer, rollout backend, engine (which owns the sandbox)
    learner: Learner
    sampler: PromptSampler
    eval_problems: list[dict]
    log: MetricsLog
    # The token methods' per-run instances and their state (STARE's controller, EAPO's initial
    # entropy), checkpointed with the run.
    methods: RunMethods = field(default_factory=RunMethods)
    step: int = 0
    nonfinite_in_row: int = 0
    empty_in_row: int = 0  # consecutive steps without a usable group (trainer.max_empty_steps)
    # Colocated servers released their memory and have not been pushed to since (weight_sync).
    rollout_released: bool = False
    dropped_total: dict = field(default_factory=dict)

    @property
    def engine(self) -> RolloutEngine:
        return self.parts.engine

    @property
    def backend(self) -> Backend:
        return self.parts.backend


def rollout_seed(seed: int, step: int, rnd: int, rank: int) -> int:
    """The engine's base seed for one sampling round of one rank (it derives per-turn seeds)."""
    return ((seed * 100_003 + step) * 1_009 + rnd) * 65_537 + rank


def schedule_length(cfg: TrainConfig) -> int:
    """The lr schedule's length in learner.schedule_unit: learner.total_steps when set, else the
    run's: trainer.steps RL steps, or, counted in optimizer steps, that many times the optimizer
    steps of one RL step (mini-batches x epochs), so a decay ends with the run and not after its
    first 1 / (mini-batches x epochs)."""
    if cfg.learner.total_steps:
        return cfg.learner.total_steps
    if cfg.learner.schedule_unit == "rl_step":
        return cfg.trainer.steps
    return cfg.trainer.steps * cfg.algo.mini_batches(cfg.trainer.prompts_per_step) * cfg.algo.ppo_epochs


def build_run(cfg: TrainConfig, model_path: str, run_dir: Path, resume: bool = False) -> Run:
    """Learner, rollout components, token methods, data and metrics log of one RL run.

    model_path: the resolved starting checkpoint (`components.resolve_model_path`, or the SFT
    stage's output). resume: a W&B mirror continues the run directory's stored W&B run.
    Data is loaded first: a bad source fails before the model is.
    """
    train_problems, eval_problems = load_split(cfg.data, "train"), load_split(cfg.data, "eval")
    tokenizer = load_tokenizer(cfg.model, model_path)
    learner_cfg = dataclasses.replace(cfg.learner, total_steps=schedule_length(cfg))
    ROLLOUT_BACKENDS.get(cfg.trainer.backend).prepare_trainer(cfg.rollout)  # NCCL settings precede the learner's
    learner = Learner(model_path, learner_cfg, tokenizer, trust_remote_code=cfg.model.trust_remote_code)
    parts = build_components(
        cfg.model, cfg.trainer.backend, cfg.rollout, cfg.env, cfg.sandbox, model_path=model_path, tokenizer=tokenizer
    )
    logger.info(
        "sandbox isolation: {}", (parts.engine.sandbox.info if parts.engine.sandbox is not None else {})
    )  # not_enforced: what is weaker
    run = Run(
        cfg=cfg,
        run_dir=run_dir,
        parts=parts,
        learner=learner,
        sampler=PromptSampler(train_problems, seed=cfg.data.seed),
        eval_problems=eval_problems,
        log=MetricsLog(
            run_dir,
            tensorboard=cfg.trainer.tensorboard,
            wandb_project=cfg.trainer.wandb_project,
            run_name=run_dir.name,
            config=to_dict(cfg),
            wandb_id=wandb_run_id(run_dir, resume) if cfg.trainer.wandb_project else None,
        )
        if learner.rank == 0
        else _NullLog(),
    )
    run.methods.resolve(cfg.algo.token_methods, cfg.algo.methods)  # the stateful ones, built from the start
    return run


class _NullLog:
    """Metrics sink of ranks other than 0."""

    def log(self, step: int, metrics: dict) -> None: ...
    def truncate_after(self, step: int) -> None: ...
    def close(self) -> None: ...


def close_run(run: Run) -> None:
    try:
        run.parts.close()
    finally:
        run.log.close()
