"""One command-line convention for every entry point: a config file plus dotted KEY=VALUE overrides.

    stare-train [--config FILE] [--plugin MODULE ...] [--resume [auto] [--accept-changes] | --overwrite]
                [--print-config] [--debug] [KEY=VALUE ...]
    stare-sft   [--config FILE] [--plugin MODULE ...] [--overwrite] [--print-config] [--debug] [KEY=VALUE ...]
    stare-eval  [--config FILE] [--plugin MODULE ...] [--print-config] [--debug] [flag aliases] [KEY=VALUE ...]

Keys are the same everywhere: `model.path`, `model.tokenizer`, `sft.traces`, `sft.train.epochs`,
`learner.*`, `rollout.*`, `env.*`, `sandbox.*`, `eval.*`. `stare-train` and `stare-sft` read the same
training config (the SFT command runs only its `sft` stage); `stare-eval` reads an evaluation
config whose sections reuse the training ones. Layers, each over the one before: the schema's
defaults, the command's default config (`stare-train`/`stare-sft`: configs/tiny_cpu.yaml; a
`--config FILE` is layered over it unless the file names another `base:`), the KEY=VALUE
overrides. `--help` lists every key with the value a plain run uses and the comment that explains
it. Historical flags (`--model`, `--data`, `--output`; the evaluation flags) remain as documented
aliases of dotted keys. `--plugin MODULE` (and a config's `plugins` list) imports a user's module
before anything else, so what it registers is a valid name and its settings are keys, in `--help`
too (stare_tir/plugins.py, docs/extending.md). The shared machinery is stare_tir/app/command_line.py.

Errors a user can fix (a bad key or value, a missing file or model, an unreachable server or hub,
a bad data row, a sandbox that cannot start, a used run directory) print one line naming the
problem and the fix, exit status 2; `--debug` shows the traceback instead. Ctrl-C ends with one
line saying where the run stopped and how to resume it (exit status 130). The scripts in
scripts/ are thin wrappers around these functions.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Callable

from stare_tir.app.command_line import (
    Alias,
    add_plugin_override,
    alias_overrides,
    build_parser,
    config_error,
    config_keys,
    load_collecting,
    parse_train_args,
    plugins_first,
    print_config,
    run_cli,
)

DEFAULT_TRAIN_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"

# The entry points, and the convention's pieces callers have always imported from here.
__all__ = [
    "DEFAULT_TRAIN_CONFIG",
    "EVAL_ALIASES",
    "SFT_ALIASES",
    "Alias",
    "alias_overrides",
    "build_parser",
    "config_keys",
    "eval_main",
    "eval_parser",
    "parse_train_args",
    "run_cli",
    "sft_main",
    "train_main",
]


# ----------------------------------------------------------------------------------------------
# stare-train


def train_main(argv: list[str] | None = None) -> int:
    from stare_tir.train_config import TrainConfig

    if plugins_first(argv, str(DEFAULT_TRAIN_CONFIG), resume=True):
        return 2
    parser = build_parser(
        "stare-train",
        "Train a tool-integrated reasoning agent: cold-start SFT -> RL (GRPO / GRPO-ds / "
        "STARE) -> evaluation. With no arguments: the CPU default (configs/tiny_cpu.yaml). "
        "A run directory (trainer.run_dir) holds one run: a new run into a used one is refused "
        "unless --resume or --overwrite.",
        TrainConfig,
        default_config=str(DEFAULT_TRAIN_CONFIG),
        resume=True,
        overwrite=True,
    )
    args = parse_train_args(parser, argv)
    add_plugin_override(args, str(DEFAULT_TRAIN_CONFIG))
    run_dir: list[str] = []  # where the run is, for the Ctrl-C message
    rerun = rerun_command(args.resume == "auto")

    def main(args: argparse.Namespace) -> int:
        cfg, problems = load_collecting(TrainConfig, args, default=str(DEFAULT_TRAIN_CONFIG))
        if args.resume == "auto":  # a requeued job: continue the run if it has a checkpoint, else start
            from stare_tir.app.run_dir import auto_resume, has_checkpoint

            if args.overwrite:  # start over, unless there is a checkpoint --resume auto would continue
                if has_checkpoint(Path(cfg.trainer.run_dir)):
                    raise config_error("--resume auto and --overwrite contradict each other: pass one of them")
                args.resume = False
            else:
                args.resume = auto_resume(Path(cfg.trainer.run_dir))
        if args.resume:
            if problems:
                raise config_error("\n".join(problems))
            from stare_tir.app.run_dir import ask_on_terminal, resume_config

            cfg = resume_config(
                TrainConfig,
                Path(cfg.trainer.run_dir),
                list(args.overrides),
                cfg if args.config else None,
                accept_changes=args.accept_changes,
                confirm=ask_on_terminal,
            )
        elif args.accept_changes:
            raise config_error("--accept-changes only applies with --resume")
        if args.print_config:
            if problems:
                raise config_error("\n".join(problems))
            print_config(cfg)
            return 0
        run_dir.append(cfg.trainer.run_dir)
        from stare_tir.app.pipeline import run_pipeline

        run_pipeline(cfg, resume=args.resume, overwrite=args.overwrite, problems=problems)
        return 0

    def interrupted(e: KeyboardInterrupt) -> str:
        where = run_dir[0] if run_dir else "RUN_DIR"
        step, saved = getattr(e, "step", None), getattr(e, "checkpoint_step", None)
        if saved is not None or args.resume:  # a checkpoint exists: continue from it
            at = f"at step {step}" if step is not None else "before RL went on"
            restart = "" if saved in (None, step) else f" (it restarts after step {saved}, the last checkpoint)"
            return f"interrupted {at}; resume with: {rerun('--resume', where)}{restart}"
        if not run_dir:
            return "interrupted before the run started; nothing was written"
        if getattr(e, "stage", None) == "sft":
            where_stopped = "during the SFT stage, before RL step 1"
        elif step is None:
            where_stopped = "before RL started"
        else:
            where_stopped = f"at step {step}, before the first checkpoint"
        return (
            f"interrupted {where_stopped}; start again with: {rerun('--overwrite', where)} "
            "(SFT traces and a finished SFT model there are reused)"
        )

    return run_cli(main, args, interrupted)


def rerun_command(auto: bool) -> Callable[[str, str], str]:
    """`(flag, run_dir) -> the command line` that continues (`--resume`) or restarts (`--overwrite`) a
    run, in the form the user ran it: `make train` runs scripts/train_tir.py with `--resume auto`
    (the Makefile; make marks its children with MAKELEVEL), so its user is sent back to `make
    train`, which resumes by itself."""
    if auto and os.environ.get("MAKELEVEL") and Path(sys.argv[0]).name == "train_tir.py":

        def make(flag: str, run_dir: str) -> str:
            given = f"trainer.run_dir={run_dir}" if flag == "--resume" else f"{flag} trainer.run_dir={run_dir}"
            return f'make train ARGS="{given}"'

        return make
    return lambda flag, run_dir: f"stare-train {flag} trainer.run_dir={run_dir}"


# ----------------------------------------------------------------------------------------------
# stare-sft

SFT_ALIASES = (
    Alias("--model", ("model.path",), "starting model: HF directory, hub id, 'tiny' or 'tiny-random'"),
    Alias("--data", ("sft.traces",), 'JSONL traces, {"messages": [...]} or {"text": ...} per line'),
    Alias("--output", ("sft.output",), "directory for the fine-tuned HF checkpoint"),
)


def sft_main(argv: list[str] | None = None) -> int:
    from stare_tir.train_config import TrainConfig

    if plugins_first(argv, str(DEFAULT_TRAIN_CONFIG)):
        return 2
    parser = build_parser(
        "stare-sft",
        "Supervised cold start: fine-tune a causal LM on Retool-style tool-use traces (loss on "
        "model-written tokens only; interpreter output masked exactly as in RL). Reads a training config "
        "and runs its sft stage: sft.traces, sft.output, sft.train.* (epochs, batch_size, learner.*). "
        "An existing sft.output made from the same inputs is reused; one made from other inputs is refused "
        "unless --overwrite.",
        TrainConfig,
        aliases=SFT_ALIASES,
        default_config=str(DEFAULT_TRAIN_CONFIG),
        overwrite=True,
    )
    args = parser.parse_intermixed_args(argv)
    add_plugin_override(args, str(DEFAULT_TRAIN_CONFIG))

    def main(args: argparse.Namespace) -> int:
        extra = alias_overrides(args, SFT_ALIASES)
        cfg, problems = load_collecting(TrainConfig, args, extra, default=str(DEFAULT_TRAIN_CONFIG))
        if args.print_config and not problems:
            print_config(cfg)
            return 0
        from stare_tir.app.preflight import check_model, check_sandbox
        from stare_tir.errors import StartupError
        from stare_tir.model import resolve_model_path
        from stare_tir.sft.stage import check_sft_traces, sft_output, sft_stage
        from stare_tir.tracking import setup_run_logging

        checks = [(check_model, cfg.model), (check_sft_traces, cfg)]
        if cfg.sft.traces == "arithmetic":
            checks.append((check_sandbox, cfg.sandbox))  # the synthetic traces run their code
        for check, arg in checks:  # every problem at once, one line each
            try:
                check(arg)
            except StartupError as e:
                problems.append(str(e))
        if problems:
            raise StartupError("\n".join(problems))
        out = sft_output(cfg)
        setup_run_logging(out)  # train.log inside sft.output, not beside it
        _, summary = sft_stage(cfg, resolve_model_path(cfg.model), Path(cfg.trainer.run_dir), overwrite=args.overwrite)
        if summary.get("rank", 0) == 0 and not summary.get("reused"):
            resumed = f" resumed_from={summary['resumed_from']}" if summary.get("resumed_from") else ""
            print(
                f"RESULT steps={summary['steps']} first_loss={summary['first_loss']:.4f} "
                f"final_loss={summary['final_loss']:.4f} seconds={summary['seconds']:.1f} output={out}{resumed}"
            )
        elif summary.get("reused"):
            print(f"RESULT reused={summary['from']} key={summary['key']}")
        return 0

    return run_cli(
        main,
        args,
        lambda e: (
            "interrupted during SFT; nothing was saved to sft.output: the same command continues from the "
            "last SFT checkpoint (every sft.train.save_every steps)"
        ),
    )


# ----------------------------------------------------------------------------------------------
# stare-eval


def _urls(values: list[str]) -> list[str]:
    return [u for arg in values for u in arg.split(",") if u]


EVAL_ALIASES = (
    Alias("--model", ("model.path",), "HF model directory or hub id; 'tiny' is the shipped tiny base"),
    Alias(
        "--datasets",
        ("eval.datasets",),
        "comma-separated benchmarks: aime24, aime25, amc23, math500, minerva, olympiadbench, or JSONL paths",
        convert=lambda v: [d for d in v[-1].split(",") if d],
    ),
    Alias("--n", ("eval.n",), "samples per problem", int),
    Alias("--limit", ("eval.limit",), "first K problems of each dataset", int),
    Alias("--temperature", ("eval.temperature",), "sampling temperature", float),
    Alias("--top-p", ("eval.top_p",), "nucleus sampling top-p", float),
    Alias("--max-turns", ("eval.max_turns",), "model turns per sample", int),
    Alias("--max-tokens", ("eval.max_tokens",), "response token budget per sample", int),
    Alias("--max-tokens-per-turn", ("eval.max_tokens_per_turn",), "new tokens per model turn", int),
    Alias("--seed", ("eval.seed",), "base sampling seed", int),
    Alias("--backend", ("backend",), "rollout backend, a name of the rollout backends' registry (see `backend` below)"),
    Alias(
        "--sglang-url", ("rollout.sglang.urls",), "SGLang server/router URL (repeat or comma-separate)", convert=_urls
    ),
    Alias("--sandbox", ("sandbox.backend",), "where the model's code runs (see `sandbox.backend` below)"),
    # The env's per-call timeout and the sandbox's hard limit: the shorter one wins, so set both.
    Alias(
        "--sandbox-timeout",
        ("env.code_timeout_s", "sandbox.limits.wall_time_s"),
        "wall-clock seconds per code execution",
        float,
    ),
    Alias("--sandbox-memory-mb", ("sandbox.limits.memory_mb",), "memory per code execution, MiB", int),
    Alias("--sandbox-workers", ("sandbox.workers",), "code executions at once", int),
    Alias("--out", ("out_dir",), "output directory; rerunning into it resumes"),
)


def eval_parser() -> argparse.ArgumentParser:
    from stare_tir.eval.command import EvalRunConfig

    return build_parser(
        "stare-eval",
        "Evaluate a tool-integrated reasoning model on AIME and other math benchmarks, with "
        "tool calls. model.path may be a training run directory (its final/ model with its env, rollout "
        "and data settings) or one of its checkpoints (RUN/checkpoints/step_N, exported to RUN/hf/step_N first); eval.datasets may name arithmetic (the training task's held-out split). "
        "Writes <out_dir>/<dataset>.jsonl, summary.json and config.yaml; out_dir defaults to one "
        "directory per model and settings, and rerunning resumes there.",
        EvalRunConfig,
        aliases=EVAL_ALIASES,
    )


def eval_main(argv: list[str] | None = None) -> int:
    if plugins_first(argv):
        return 2
    args = eval_parser().parse_intermixed_args(argv)
    add_plugin_override(args)
    given = alias_overrides(args, EVAL_ALIASES) + list(args.overrides)
    if not (args.config or any(o.startswith("model.path=") for o in given)):
        print(
            "error: name the model to evaluate: model.path=PATH_OR_HF_ID (alias --model; 'tiny' for the "
            "shipped tiny base; a training run directory for its final/ model)",
            file=sys.stderr,
        )
        return 2
    out_dir: list[str] = []

    def main(args: argparse.Namespace) -> int:
        from stare_tir.config import read_config_layers
        from stare_tir.eval.command import is_run_dir, resolve_eval_config

        tree = read_config_layers(args.config) if args.config else {}
        cfg = resolve_eval_config(tree, given)
        if args.print_config:
            print_config(cfg)
            return 0
        from envs.data import load_problems
        from stare_tir.app.preflight import check_backend, check_hub_dataset, check_model, check_sandbox
        from stare_tir.errors import StartupError
        from stare_tir.eval.command import TRAINING_TASK, checkpoint_of_run, run_eval

        model_arg = next((o.split("=", 1)[1] for o in reversed(given) if o.startswith("model.path=")), "")
        ckpt = checkpoint_of_run(model_arg) if model_arg else None
        if ckpt is not None and not (Path(cfg.model.path) / "config.json").is_file():
            from stare_tir.app.export import export_checkpoint

            export_checkpoint(ckpt.parent.parent, int(ckpt.name.removeprefix("step_")), cfg.model.path)
        check_model(cfg.model)
        check_backend(cfg.backend, cfg.rollout.sglang, key="backend")
        for name in cfg.eval.datasets:  # a missing or malformed dataset fails before the model loads
            if name == TRAINING_TASK:
                continue
            check_hub_dataset(name, "eval.datasets")
            try:
                load_problems(name, limit=1)
            except (FileNotFoundError, ValueError) as e:
                raise StartupError(f"eval.datasets: {name!r}: {e}") from None
        check_sandbox(cfg.sandbox)
        out_dir.append(cfg.out_dir or "its output directory")
        run = (
            str(ckpt.parent.parent)
            if ckpt is not None
            else (model_arg if model_arg and is_run_dir(model_arg) else None)
        )
        run_eval(cfg, run_dir=run)
        return 0

    return run_cli(
        main,
        args,
        lambda e: (
            f"interrupted; finished samples are kept in {out_dir[0] if out_dir else 'the output directory'}: "
            "rerun the same command to resume"
        ),
    )
