"""The learner's settings (`learner.*`): a light module, read by config loading and `--help`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from stare_tir.learner.deepspeed_config import check_deepspeed_overrides, check_offload


@dataclass
class LearnerConfig:
    # ZeRO stage: 0 = plain data parallel, 1 = shard optimizer state, 2 = + gradients,
    # 3 = + parameters (needed for 7B-class models; full weights are gathered for export/save).
    zero_stage: int = 2
    # Training dtype. auto = bf16 on CUDA, fp32 on CPU. On a CPU with bf16 instructions (avx512_bf16
    # or amx_bf16 in /proc/cpuinfo's flags) an isolated bf16 train_step of SmolLM2-135M takes
    # 0.46-0.52x the fp32 one (scripts/bench/bench_learner_dtype.py; not ~7x slower, as once noted
    # here), for a mean |log-prob| difference of 0.033 against fp32; inside RL steps of
    # configs/smollm2_cpu.yaml the update phase was not faster (docs/learner.md), so auto stays fp32.
    # Without those instructions bf16 arithmetic is emulated and the learner warns. Master weights
    # and optimizer state stay fp32 under bf16.
    dtype: Literal["auto", "fp32", "bf16"] = "auto"
    # dtype of the buffer that sums micro-batch gradients under bf16 (DeepSpeed's
    # data_types.grad_accum_dtype; unset, DeepSpeed sums in the model dtype). fp32: dozens of
    # small token-normalised micro-batch gradients per step are summed without bf16 rounding.
    # Without ZeRO (stage 0) the pinned DeepSpeed (0.19.8) takes only bf16, so auto = fp32 with
    # ZeRO 1-3 and bf16 at stage 0; stage 0 with bf16 (or auto) and fp32 is refused here.
    grad_accum_dtype: Literal["auto", "fp32", "bf16"] = "auto"
    # Timeout of every collective: the default process group's and every group DeepSpeed creates
    # (its data-parallel and ZeRO groups). Ranks roll out independently and meet in all-reduces: a
    # rank whose 16k-token multi-turn rollouts, evaluation or weight sync run longer than the
    # others' must not trip NCCL's default 10-minute watchdog.
    dist_timeout_minutes: float = 120.0
    # AdamW peak learning rate (1e-6 is the usual value for 7B RL; tiny models want ~1e-3).
    lr: float = 1e-6
    # AdamW decoupled weight decay, applied to every parameter (as in verl/OpenRLHF RL recipes).
    weight_decay: float = 0.01
    # AdamW (beta1, beta2).
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    # AdamW epsilon.
    eps: float = 1e-8
    # Learning-rate shape after warm-up: constant (RL default), or linear/cosine decay to
    # min_lr_ratio * lr at total_steps (needs total_steps > 0).
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    # Steps of linear warm-up (0: none), counted in schedule_unit.
    warmup_steps: int = 0
    # Steps of the whole run, for linear/cosine decay, counted in schedule_unit. 0 = not known yet:
    # the caller fills it in (RL: trainer.steps in this unit, i.e. x mini-batches x epochs for
    # optimizer_step; SFT derives it from the data); a Learner refuses decay with 0.
    total_steps: int = 0
    # What warmup_steps and total_steps count. optimizer_step: optimizer steps, the warm-up going
    # lr/warmup_steps, 2 lr/warmup_steps, ... so the first step already trains; with several
    # mini-batches per RL step (algo.ppo_mini_batch_size) it ends within the first RL steps.
    # rl_step: RL steps as verl counts them (its get_constant_schedule_with_warmup is stepped once per
    # update_actor, whatever the mini-batch count): every mini-batch of RL step t (0-based) trains at
    # lr x t / warmup_steps, the first RL step at lr 0, as the verl recipes with optim.lr_warmup_steps
    # ran (DAPO, the 80/20 rule, JustRL). RL only: the trainer advances the step (SFT has none).
    schedule_unit: Literal["optimizer_step", "rl_step"] = "optimizer_step"
    # Floor of the decayed learning rate as a fraction of lr.
    min_lr_ratio: float = 0.0
    # Clip the global gradient L2 norm to this value (0 disables clipping; the norm is still
    # computed, and a non-finite norm still skips the step).
    grad_clip: float = 1.0
    # ZeRO-3: parameters with fewer elements than this stay replicated on every rank instead of
    # being gathered at each use (DeepSpeed's default; 0 partitions everything).
    zero3_persistence_threshold: int = 100_000
    # Recompute activations in the backward pass: less memory, ~30% more compute.
    gradient_checkpointing: bool = False
    # Token budget of one training micro-batch: rows x padded length <= this (a single longer
    # sequence gets a micro-batch of its own). Bounds activation memory per forward/backward.
    micro_batch_tokens: int = 16384
    # Token budget of the no-grad recompute pass (None: 2 x micro_batch_tokens; no activations
    # are kept for backward there, so it can be larger).
    forward_micro_batch_tokens: int | None = None
    # Rows of [rows, vocab] float32 logits materialized at once when computing log-probs.
    logprob_chunk_size: int = 1024
    # Sampling temperature of the rollouts: log-probs and entropy are those of softmax(z / T),
    # the distribution the tokens were drawn from.
    temperature: float = 1.0
    # Attention kernel passed to from_pretrained ("sdpa", "eager", "flash_attention_2").
    attn_implementation: str = "sdpa"
    # Seed for torch/numpy/python RNGs at construction (each rank adds its rank).
    seed: int = 0
    # Level of DeepSpeed's own logger (its INFO lines drown the training log).
    deepspeed_log_level: Literal["debug", "info", "warning", "error"] = "warning"
    # Extra DeepSpeed settings, deep-merged over the generated config (e.g. CPU offload:
    # {zero_optimization: {offload_optimizer: {device: cpu}}}; the offloaded optimizer steps with
    # torch's fused CPU AdamW); see stare_tir/learner/deepspeed_config.py for what is refused.
    deepspeed: dict[str, Any] = field(default_factory=dict)

    def bf16(self, on_cuda: bool) -> bool:
        """Whether the learner trains in bf16: dtype with auto resolved (see its comment)."""
        return self.dtype == "bf16" or (self.dtype == "auto" and on_cuda)

    def accum_dtype(self) -> Literal["fp32", "bf16"]:
        """grad_accum_dtype with auto resolved: fp32 with ZeRO 1-3, bf16 at stage 0 (all DeepSpeed
        0.19 takes there). Resolved at use, not at load: an override of zero_stage must move it."""
        if self.grad_accum_dtype == "auto":
            return "bf16" if self.zero_stage == 0 else "fp32"
        return self.grad_accum_dtype

    def __post_init__(self) -> None:
        check_deepspeed_overrides(self.deepspeed)
        if self.zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={self.zero_stage!r}: must be 0, 1, 2 or 3")
        check_offload(self.zero_stage, self.deepspeed)
        if self.zero_stage == 0 and self.dtype != "fp32" and self.grad_accum_dtype == "fp32":
            # DeepSpeed 0.19 engine.py `_do_optimizer_sanity_check`: without ZeRO, bf16 sums
            # gradients only in bf16. dtype=auto is bf16 on a GPU, so it is refused too.
            raise ValueError(
                f"zero_stage=0 with dtype={self.dtype} and grad_accum_dtype=fp32: DeepSpeed 0.19.8 refuses "
                "learner.grad_accum_dtype=fp32 without ZeRO under bf16; set learner.zero_stage=1 (fp32 "
                "accumulation, same math), learner.grad_accum_dtype=bf16, or learner.dtype=fp32"
            )
        if not self.dist_timeout_minutes > 0:
            raise ValueError(f"dist_timeout_minutes={self.dist_timeout_minutes!r}: must be > 0")
        if not self.lr > 0:
            raise ValueError(f"lr={self.lr!r}: must be > 0")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay={self.weight_decay!r}: must be >= 0")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"betas={self.betas!r}: must be two numbers in [0, 1)")
        if not self.eps > 0:
            raise ValueError(f"eps={self.eps!r}: must be > 0")
        if self.warmup_steps < 0:
            raise ValueError(f"warmup_steps={self.warmup_steps!r}: must be >= 0")
        if self.schedule_unit not in ("optimizer_step", "rl_step"):
            raise ValueError(f"schedule_unit={self.schedule_unit!r}: optimizer_step or rl_step")
        if self.total_steps < 0:
            raise ValueError(f"total_steps={self.total_steps!r}: must be >= 0")
        if self.lr_scheduler != "constant" and 0 < self.total_steps <= self.warmup_steps:
            raise ValueError(
                f"total_steps={self.total_steps!r}: lr_scheduler={self.lr_scheduler!r} "
                f"needs total_steps > warmup_steps ({self.warmup_steps})"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio={self.min_lr_ratio!r}: must be in [0, 1]")
        if self.grad_clip < 0:
            raise ValueError(f"grad_clip={self.grad_clip!r}: must be >= 0 (0 disables)")
        if self.zero3_persistence_threshold < 0:
            raise ValueError(f"zero3_persistence_threshold={self.zero3_persistence_threshold!r}: must be >= 0")
        if self.micro_batch_tokens < 1:
            raise ValueError(f"micro_batch_tokens={self.micro_batch_tokens!r}: must be >= 1")
        if self.forward_micro_batch_tokens is not None and self.forward_micro_batch_tokens < 1:
            raise ValueError(f"forward_micro_batch_tokens={self.forward_micro_batch_tokens!r}: must be >= 1 or None")
        if self.logprob_chunk_size < 1:
            raise ValueError(f"logprob_chunk_size={self.logprob_chunk_size!r}: must be >= 1")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r}: must be > 0")


def cpu_has_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has native bf16 arithmetic (the avx512_bf16 or amx_bf16 flag of
    /proc/cpuinfo; False where the file is missing). cpuinfo: its text, for tests."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return False
    flags = {word for line in cpuinfo.splitlines() if line.startswith("flags") for word in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})
