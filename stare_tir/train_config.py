"""The typed config of a training run: model, algorithm and loop settings, and their composition.

`TrainConfig` is what `scripts/train_tir.py` loads (YAML + dotted overrides) and what every run
directory's config.yaml holds; its sections are the components' own config dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from envs.retool import RetoolConfig
from sandbox import SandboxConfig
from stare_tir.algos.stare_config import StareConfig
from stare_tir.components import ModelConfig
from stare_tir.data import DataConfig
from stare_tir.learner import LearnerConfig
from stare_tir.rollout.engine import RolloutConfig
from stare_tir.sft import ColdStartConfig


@dataclass
class AlgoConfig:
    # grpo: symmetric clip, no dynamic sampling. grpo_ds: clip-higher, token-mean, dynamic sampling
    # (DAPO-style). stare: grpo_ds + STARE token reweighting (variant and gate in `stare`).
    name: Literal["grpo", "grpo_ds", "stare"] = "stare"
    # Advantage estimator, by its name in `stare_tir.algos.advantage` (register_advantage_estimator):
    # "grpo" normalises rewards inside each group by the group std, "drgrpo" only centres them.
    advantage: str = "grpo"
    # Policy loss, by its name in `stare_tir.algos.policy_loss` (register_policy_loss): "clip" is
    # the clipped surrogate with clip-higher, dual clip, TIS and STARE's token weights.
    policy_loss: str = "clip"
    clip_low: float = 0.2
    # Upper clip; ignored (set to clip_low) for plain grpo.
    clip_high: float = 0.28
    # Dual-clip bound for negative advantages (None disables).
    dual_clip_c: float | None = 3.0
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    # Truncated importance sampling cap for rollout/trainer logprob mismatch (None: off).
    tis_cap: float | None = None
    # Refill rounds when too few groups have non-equal rewards (grpo_ds / stare only).
    dynamic_sampling_rounds: int = 3
    # Drop trajectories with a void turn (neither code nor answer) from the loss.
    filter_void_turns: bool = False
    # Drop trajectories cut by the token budget from the loss (DAPO overlong filtering).
    filter_overlong: bool = False
    # Policy-gradient passes over each batch (1 = on-policy; old logprobs still recomputed).
    ppo_epochs: int = 1
    stare: StareConfig = field(default_factory=StareConfig)

    def __post_init__(self) -> None:
        if not 0.0 < self.clip_low < 1.0:
            raise ValueError(f"clip_low={self.clip_low!r}: must be in (0, 1)")
        if not 0.0 < self.clip_high < 1.0:
            raise ValueError(f"clip_high={self.clip_high!r}: must be in (0, 1)")
        if self.dynamic_sampling_rounds < 1:
            raise ValueError(f"dynamic_sampling_rounds={self.dynamic_sampling_rounds!r}: must be >= 1")
        if self.ppo_epochs < 1:
            raise ValueError(f"ppo_epochs={self.ppo_epochs!r}: must be >= 1")

    @property
    def use_stare(self) -> bool:
        return self.name == "stare" and self.stare.enabled

    @property
    def dynamic_sampling(self) -> bool:
        return self.name in ("grpo_ds", "stare")

    @property
    def effective_clip_high(self) -> float:
        return self.clip_low if self.name == "grpo" else self.clip_high


@dataclass
class TrainerConfig:
    # RL steps (one optimizer step per PPO epoch each).
    steps: int = 40
    # Prompts (GRPO groups) per step; each is rolled out rollout.n_per_prompt times.
    prompts_per_step: int = 16
    # Held-out evaluation every N steps (0: only before and after training).
    eval_every: int = 10
    # Samples per held-out problem in periodic evaluation.
    eval_n: int = 1
    # Checkpoint every N steps (and at the end); --resume continues from the latest.
    save_every: int = 10
    # Checkpoints kept on disk (oldest deleted first).
    keep_checkpoints: int = 2
    # Also export an HF-loadable model (weights + tokenizer, what AutoModelForCausalLM and SGLang
    # load) every N steps to <run_dir>/hf/step_NNNNNN; 0: only the final one (<run_dir>/final).
    save_hf_every: int = 0
    # Output directory: config.yaml, metrics.jsonl, checkpoints/, plots/, logs. It holds one run:
    # a new run into a used one is refused unless --resume (continue it) or --overwrite.
    run_dir: str = "runs/tiny_cpu"
    # Seed of rollout sampling (per step, round and rank) and of the held-out evaluation.
    seed: int = 0
    # Rollout backend: hf (in-process, CPU or one GPU) or sglang (servers at rollout.sglang.urls).
    backend: Literal["hf", "sglang"] = "hf"
    # Stop with an error after this many consecutive non-finite steps (each one is skipped).
    max_nonfinite_steps: int = 3
    # Stop with an error after this many consecutive steps without a usable group (every rollout
    # failed, every group had equal rewards, or the filters dropped everything): such a run
    # would otherwise "finish" without ever training.
    max_empty_steps: int = 3
    # Mirror metrics.jsonl to TensorBoard (<run_dir>/tb); needs `pip install 'stare-tir[tracking]'`.
    tensorboard: bool = False
    # Mirror metrics.jsonl to this W&B project (a resumed run continues its W&B run); needs the
    # [tracking] extra and a W&B login.
    wandb_project: str | None = None

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "prompts_per_step",
            "eval_n",
            "save_every",
            "keep_checkpoints",
            "max_nonfinite_steps",
            "max_empty_steps",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        for name in ("eval_every", "save_hf_every"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 0")


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    env: RetoolConfig = field(default_factory=RetoolConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    sft: ColdStartConfig = field(default_factory=ColdStartConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def __post_init__(self) -> None:
        check_sampling_matches_learner(self.rollout, self.learner, self.algo)


def check_sampling_matches_learner(rollout: RolloutConfig, learner: LearnerConfig, algo: AlgoConfig) -> None:
    """The learner must score tokens under the distribution the rollouts sampled from.

    Log-probs, entropy, STARE's surprisal and the TIS ratio are all computed by the learner as
    softmax(z / learner.temperature) over the full vocabulary. A different rollout temperature
    would make every one of them describe another distribution than the one sampled, silently.
    Nucleus / top-k sampling truncates the sampler's distribution, so rollout log-probs are not
    comparable with the learner's and truncated IS would correct towards the wrong target.
    """
    if rollout.temperature != learner.temperature:
        raise ValueError(
            f"rollout.temperature={rollout.temperature!r} but learner.temperature={learner.temperature!r}: "
            "the learner would score tokens under another distribution than the one sampled; "
            f"set both to the same value (e.g. learner.temperature={rollout.temperature!r})"
        )
    if algo.tis_cap is not None and (rollout.top_p < 1.0 or rollout.top_k > 0):
        raise ValueError(
            f"algo.tis_cap={algo.tis_cap!r} with rollout.top_p={rollout.top_p!r}, rollout.top_k={rollout.top_k!r}: "
            "truncated IS compares the sampler's truncated distribution with the learner's full one; "
            "set rollout.top_p=1.0 and rollout.top_k=-1, or algo.tis_cap=null"
        )
