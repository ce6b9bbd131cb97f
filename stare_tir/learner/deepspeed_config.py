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
silently disagreed with `learner.*` would make the config lie about the run. Modes that step the
optimizer by themselves are refused too: the learner skips a non-finite step by making its own
optimizer's `step()` a no-op (`step_guard`), and a second optimizer would apply the step anyway.
Offload is supported to the CPU only, optimizer state at ZeRO 1-3 and parameters at ZeRO-3 (the
combinations the tests run, tests/learner/test_learner_paths.py).
"""

from __future__ import annotations

import copy
import logging
from typing import Any

# DeepSpeed releases the learner's tests ran on (every path above). Older ones have known bugs on
# the advertised paths (BF16_Optimizer asserting on a zero or skipped norm before 0.19.8, ZeRO-2
# offload keeping only the last micro-batch's gradient before 0.19.0), so pyproject requires
# >=0.19.8,<0.20; another release within that range is used with a warning (warn_if_untested).
TESTED_DEEPSPEED = ("0.19.8",)

# DeepSpeed key -> why it cannot be passed through (and what to set instead).
OWNED: dict[str, str] = {
    "train_batch_size": "the trainer sets batch sizes (trainer.prompts_per_step, rollout.n_per_prompt)",
    "train_micro_batch_size_per_gpu": "micro-batches are packed by tokens: set learner.micro_batch_tokens",
    "gradient_accumulation_steps": "the learner marks accumulation boundaries itself (micro-batch count "
    "varies with sequence lengths)",
    "gradient_clipping": "set learner.grad_clip",
    "optimizer": "the learner passes its own torch AdamW: set learner.lr, learner.betas, learner.eps, "
    "learner.weight_decay",
    "scheduler": "set learner.lr_scheduler, learner.warmup_steps, learner.total_steps, learner.schedule_unit",
    "bf16": "set learner.dtype",
    "fp16": "fp16 is not supported: set learner.dtype=bf16 or fp32",
    "torch_autocast": "set learner.dtype (the learner trains in bf16 weights, not under autocast)",
    "zero_optimization.stage": "set learner.zero_stage",
    "zero_optimization.stage3_param_persistence_threshold": "set learner.zero3_persistence_threshold",
    "zero_allow_untested_optimizer": "the learner passes its own optimizer and sets it",
    "zero_force_ds_cpu_optimizer": "set learner.offload_adam",
    "data_types.grad_accum_dtype": "set learner.grad_accum_dtype",
    "checkpoint.load_universal": "the learner converts and loads a universal checkpoint itself when the "
    "number of ranks changed on resume",
}

# Modes that bring their own optimizer step (DeepSpeed 0.18+): their updates bypass the skip.
OWN_OPTIMIZER: dict[str, str] = {
    "zero_optimization.zenflow": "ZenFlow steps its own CPU optimizer (runtime/zenflow)",
    "zero_optimization.offload_optimizer.super_offload": "SuperOffload replaces the ZeRO-3 optimizer "
    "(runtime/superoffload)",
}


def check_deepspeed_overrides(overrides: dict[str, Any], prefix: str = "") -> None:
    """Raise ValueError naming a pass-through key the learner owns, or a non-mapping section."""
    for key, value in overrides.items():
        if not isinstance(key, str):
            raise ValueError(f"deepspeed.{prefix}{key!r}: keys must be strings")
        dotted = prefix + key
        if dotted in OWNED:
            raise ValueError(f"deepspeed.{dotted}: owned by the learner, {OWNED[dotted]}")
        if dotted in OWN_OPTIMIZER and value not in (None, False, {}):
            raise ValueError(
                f"deepspeed.{dotted}: not supported, {OWN_OPTIMIZER[dotted]} and a non-finite step the "
                "learner skips would still be applied; remove it"
            )
        if dotted in ("zero_optimization", "zero_optimization.offload_optimizer", "zero_optimization.offload_param"):
            if not isinstance(value, dict):
                raise ValueError(f"deepspeed.{dotted}={value!r}: expected a mapping")
        if dotted.endswith(("offload_optimizer.device", "offload_param.device")) and value not in ("cpu", "none"):
            raise ValueError(
                f"deepspeed.{dotted}={value!r}: the learner supports offload to 'cpu' (or 'none'); NVMe "
                "offload swaps optimizer state outside what the learner's tests cover"
            )
        if dotted == "zero_optimization.offload_optimizer.ratio" and value != 1:
            raise ValueError(
                f"deepspeed.{dotted}={value!r}: partial offload steps the rest on a second optimizer "
                "(stage3.py backup_optimizer) that a skipped step would not freeze; remove it (1.0)"
            )
        if isinstance(value, dict):
            check_deepspeed_overrides(value, dotted + ".")


def offload_devices(overrides: dict[str, Any]) -> tuple[str, str]:
    """(optimizer, parameter) offload devices the pass-through asks for: 'cpu' or 'none'."""
    zero = overrides.get("zero_optimization", {})

    def device(section: str) -> str:
        return str((zero.get(section) or {}).get("device", "none"))

    return device("offload_optimizer"), device("offload_param")


def check_offload(zero_stage: int, overrides: dict[str, Any]) -> None:
    """Refuse an offload the ZeRO stage does not have (DeepSpeed would ignore it or fail later)."""
    opt, param = offload_devices(overrides)
    if opt == "cpu" and zero_stage == 0:
        raise ValueError(
            "deepspeed.zero_optimization.offload_optimizer needs learner.zero_stage >= 1 (there is no "
            "partitioned optimizer to offload at stage 0)"
        )
    if param == "cpu" and zero_stage != 3:
        raise ValueError(
            f"deepspeed.zero_optimization.offload_param needs learner.zero_stage=3 (got {zero_stage}): "
            "only ZeRO-3 partitions parameters"
        )


def warn_if_untested(version: str) -> None:
    if version not in TESTED_DEEPSPEED:
        logging.getLogger(__name__).warning(
            f"DeepSpeed {version}: the learner was tested on {', '.join(TESTED_DEEPSPEED)}"
        )


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
