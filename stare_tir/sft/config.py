"""Settings of the SFT stage (`sft.*` of a training config), apart from its torch code so that a config
and `--help` load without torch."""

from __future__ import annotations

from dataclasses import dataclass, field

from stare_tir.learner.config import LearnerConfig


def _sft_learner_defaults() -> LearnerConfig:
    # SFT of a 7B base model: lr 1e-5 with cosine decay over the run (total_steps filled in from
    # the data when left at 0), clipped gradients. Tiny CPU models want lr ~1e-3 (set in YAML).
    return LearnerConfig(lr=1e-5, lr_scheduler="cosine", warmup_steps=0, weight_decay=0.0)


@dataclass
class SFTConfig:
    # Passes over the traces.
    epochs: int = 3
    # Sequences per optimizer step (over all ranks; each rank takes its share).
    batch_size: int = 32
    # Longest prompt + response in tokens; longer rows are dropped (counted) rather than cut, since
    # a cut response would teach the model to stop without an answer or an <|im_end|>.
    max_seq_len: int = 4096
    # Seed of the per-epoch shuffle.
    seed: int = 0
    # Log a metrics line every N optimizer steps (the progress bar updates every step).
    log_every: int = 10
    # Hold out this fraction of rows (at least one row when > 0) and report their mean NLL after
    # each epoch; 0 disables.
    val_fraction: float = 0.0
    # Save a resumable checkpoint (weights, optimizer, schedule, data position) every N optimizer
    # steps to <sft output>.checkpoints/, so a killed or preempted SFT continues where it was
    # when the same command runs again; deleted once the SFT model is written. 0: none.
    save_every: int = 200
    # Optimizer, precision, ZeRO stage, micro-batch budget. With lr_scheduler linear/cosine and
    # total_steps 0, total_steps is set to the number of optimizer steps of the run.
    learner: LearnerConfig = field(default_factory=_sft_learner_defaults)

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "max_seq_len", "log_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if self.save_every < 0:
            raise ValueError(f"save_every={self.save_every!r}: must be >= 0 (0: no SFT checkpoints)")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction={self.val_fraction!r}: must be in [0, 1)")
        if self.learner.schedule_unit != "optimizer_step":
            # rl_step reads a clock only the RL trainer advances: SFT's lr would never move.
            raise ValueError(
                f"learner.schedule_unit={self.learner.schedule_unit!r}: SFT has no RL steps; use optimizer_step"
            )


@dataclass
class ColdStartConfig:
    """The SFT stage of a training run (`sft.*` in a training config)."""

    # Run the cold-start SFT stage before RL (off when model.path already is an SFT checkpoint).
    enabled: bool = True
    # "arithmetic": make Retool traces of the synthetic task by running their code in the sandbox;
    # otherwise a JSONL (or parquet) file of {"messages": [...]} or {"text": ...} rows.
    traces: str = "arithmetic"
    # Number of synthetic traces to make.
    num_traces: int = 600
    # Share of synthetic traces that call the tool (the rest answer directly, often wrongly for a
    # tiny model): leaves RL room to learn when the tool pays off.
    tool_fraction: float = 0.5
    # How synthetic tool traces write their code, each trace drawing one name from this list
    # (repeat a name to weigh it): "print" = print(EXPR), "assign" = x = EXPR + print(x). Same
    # output and grade either way: a mix is a reward-neutral choice for RL to keep or collapse.
    code_styles: list[str] = field(default_factory=lambda: ["print"])
    # Directory of the SFT checkpoint; "" = <trainer.run_dir>/sft/model. A checkpoint is reused
    # only when made from the same inputs (base model, tokenizer, traces, sft.train; its
    # sft_key.json), also from a sibling run directory; a named one made from other inputs is refused.
    output: str = ""
    # Reuse the SFT model (or traces) of a sibling run directory (runs/a for runs/b) made from the
    # same inputs; false makes this run's own (a benchmark of the whole pipeline, say).
    reuse: bool = True
    # Optimisation settings of the SFT stage.
    train: SFTConfig = field(default_factory=SFTConfig)

    def __post_init__(self) -> None:
        if self.num_traces < 1:
            raise ValueError(f"num_traces={self.num_traces!r}: must be >= 1")
        if not 0.0 <= self.tool_fraction <= 1.0:
            raise ValueError(f"tool_fraction={self.tool_fraction!r}: must be in [0, 1]")
        from envs.arithmetic import check_code_styles

        check_code_styles(self.code_styles)
