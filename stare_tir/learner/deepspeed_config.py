"""`learner.deepspeed`: DeepSpeed settings passed through, merged over the generated config.

The learner writes the DeepSpeed config itself from `learner.*` (ZeRO stage, precision, gradient
clipping, ...). Everything else DeepSpeed offers (CPU offload of optimizer state or parameters,
bucket sizes, activation checkpointing options, ...) goes in `learner.deepspeed` as a nested
mapping, deep-merged over the generated config, e.g. in YAML:

    learner:
      zero_stage: 3
      deepspeed:
        zero_optimization:
          offload_optimizer: {device: cpu, pin_memory: true}
          offload_param: {device: cpu, pin_memory: true}

Keys that the learner owns are refused with the learner key to use instead: a pass-through that
silently disagreed with `learner.*` would make the config lie about the run.
"""

from __future__ import annotations

import copy
from typing import Any

# DeepSpeed key -> why it cannot be passed through (and what to set instead).
OWNED: dict[str, str] = {
    "train_batch_size": "the trainer sets batch sizes (trainer.prompts_per_step, rollout.n_per_prompt)",
    "train_micro_batch_size_per_gpu": "micro-batches are packed by tokens: set learner.micro_batch_tokens",
    "gradient_accumulation_steps": "the learner marks accumulation boundaries itself (micro-batch count "
    "varies with sequence lengths)",
    "gradient_clipping": "set learner.grad_clip",
    "optimizer": "the learner passes its own torch AdamW: set learner.lr, learner.betas, learner.eps, "
    "learner.weight_decay",
    "scheduler": "set learner.lr_scheduler, learner.warmup_steps, learner.total_steps",
    "bf16": "set learner.dtype",
    "fp16": "fp16 is not supported: set learner.dtype=bf16 or fp32",
    "zero_optimization.stage": "set learner.zero_stage",
    "data_types.grad_accum_dtype": "set learner.grad_accum_dtype",
}


def check_deepspeed_overrides(overrides: dict[str, Any], prefix: str = "") -> None:
    """Raise ValueError naming a pass-through key the learner owns, or a non-mapping section."""
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise ValueError(f"deepspeed.{prefix}{key!r}: keys must be strings")
        dotted = prefix + key
        if dotted in OWNED:
            raise ValueError(f"deepspeed.{dotted}: owned by the learner, {OWNED[dotted]}")
        if dotted == "zero_optimization" and not isinstance(value, dict):
            raise ValueError(f"deepspeed.zero_optimization={value!r}: expected a mapping")
        if isinstance(value, dict):
            check_deepspeed_overrides(value, dotted + ".")


def merge_deepspeed_config(generated: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of `generated` with `overrides` deep-merged over it (mappings merge, values replace)."""
    check_deepspeed_overrides(overrides)
    out = copy.deepcopy(generated)

    def merge(base: dict, update: dict) -> None:
        for key, value in update.items():
            if isinstance(value, dict) and isinstance(base.get(key), dict):
                merge(base[key], value)
            else:
                base[key] = copy.deepcopy(value)

    merge(out, overrides)
    return out
