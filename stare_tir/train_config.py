"""The typed config of a training run: model, algorithm and loop settings, and their composition.

`TrainConfig` is what `scripts/train_tir.py` loads (YAML + dotted overrides) and what every run
directory's config.yaml holds; its sections are the components' own config dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from envs.retool import RetoolConfig
from sandbox import SandboxConfig
from stare_tir.algos.stare import StareConfig
from stare_tir.data import DataConfig
from stare_tir.learner import LearnerConfig
from stare_tir.pipeline import ColdStartConfig
from stare_tir.rollout.engine import RolloutConfig


@dataclass
class ModelConfig:
    # HF model directory or hub id. "tiny": the pretrained tiny base shipped with the package (a
    # 0.14M-parameter Qwen2 with a real tokenizer and chat template); "tiny-random": a randomly
    # initialised tiny Qwen2, built once and cached.
    path: str = "tiny"
    # Shape of the random tiny model (only when path == "tiny-random").
    tiny_size: Literal["tiny", "small", "base"] = "tiny"


@dataclass
class AlgoConfig:
    # grpo: symmetric clip, no dynamic sampling. grpo_ds: clip-higher, token-mean, dynamic sampling
    # (DAPO-style). stare: grpo_ds + STARE token reweighting (variant and gate in `stare`).
    name: Literal["grpo", "grpo_ds", "stare"] = "stare"
    # Group-normalise advantages by the group std (GRPO) or only centre them (Dr. GRPO).
    norm_adv_by_std: bool = True
    clip_low: float = 0.2
    # Upper clip; ignored (set to clip_low) for plain grpo.
    clip_high: float = 0.28
    # Dual-clip bound for negative advantages (None disables).
    dual_clip_c: Optional[float] = 3.0
    loss_agg: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    # Truncated importance sampling cap for rollout/trainer logprob mismatch (None: off).
    tis_cap: Optional[float] = None
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
    # Output directory: config.yaml, metrics.jsonl, checkpoints/, plots/, logs.
    run_dir: str = "runs/tiny_cpu"
    seed: int = 0
    # Rollout backend: hf (in-process, CPU or one GPU) or sglang (servers at rollout.sglang.urls).
    backend: Literal["hf", "sglang"] = "hf"
    # Stop with an error after this many consecutive non-finite steps (each one is skipped).
    max_nonfinite_steps: int = 3
    tensorboard: bool = False
    wandb_project: Optional[str] = None

    def __post_init__(self) -> None:
        for name in ("steps", "prompts_per_step", "eval_n", "save_every", "keep_checkpoints",
                     "max_nonfinite_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if self.eval_every < 0:
            raise ValueError(f"eval_every={self.eval_every!r}: must be >= 0")


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
