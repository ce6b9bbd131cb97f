"""The RL loop: rollouts -> rewards -> filters -> advantages -> recompute -> STARE -> update -> sync.

`loop.train_rl` is the stage; `step.rl_step` one step; `batch` collects a step's trajectories;
`shaping` turns them into the learner's inputs (STARE, the token methods, verl's aggregation);
`rank_balance` evens the ranks' tokens after scoring; `weight_sync` pushes weights to the rollout
servers; `checkpoint` saves and resumes; `run` builds the parts once. The names below are the
package's public surface.
"""

from stare_tir.train_config import AlgoConfig, TrainConfig
from stare_tir.trainer.batch import collect_batch, drop_for_update, informative_groups
from stare_tir.trainer.checkpoint import latest_checkpoint, resume_from, save_checkpoint
from stare_tir.trainer.loop import evaluate_heldout, train_rl
from stare_tir.trainer.run import Run, build_run, close_run, rollout_seed
from stare_tir.trainer.shaping import StepBatch, TokenView, UpdateInputs, prepare_update, token_view
from stare_tir.trainer.step import (
    batch_entropy,
    check_empty_steps,
    global_means,
    group_advantages,
    logprob_mismatch,
    reward_penalties,
    rl_step,
)
from stare_tir.trainer.weight_sync import release_rollout_memory, resume_rollout_memory, sync_weights

__all__ = [
    "AlgoConfig",
    "Run",
    "TokenView",
    "TrainConfig",
    "UpdateInputs",
    "batch_entropy",
    "build_run",
    "check_empty_steps",
    "close_run",
    "collect_batch",
    "drop_for_update",
    "evaluate_heldout",
    "global_means",
    "group_advantages",
    "informative_groups",
    "latest_checkpoint",
    "logprob_mismatch",
    "prepare_update",
    "reward_penalties",
    "StepBatch",
    "release_rollout_memory",
    "resume_from",
    "resume_rollout_memory",
    "rl_step",
    "rollout_seed",
    "save_checkpoint",
    "sync_weights",
    "token_view",
    "train_rl",
]
