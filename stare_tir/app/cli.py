"""One command-line convention for every entry point: a config file plus dotted KEY=VALUE overrides.

    stare-train [--config FILE] [--resume [auto] [--accept-changes] | --overwrite] [--print-config] [--debug] [KEY=VALUE ...]
    stare-sft   [--config FILE] [--overwrite] [--print-config] [--debug] [KEY=VALUE ...]
    stare-eval  [--config FILE] [--print-config] [--debug] [flag aliases] [KEY=VALUE ...]

Keys are the same everywhere: `model.path`, `model.tokenizer`, `sft.traces`, `sft.train.epochs`,
`learner.*`, `rollout.*`, `env.*`, `sandbox.*`, `eval.*`. `stare-train` and `stare-sft` read the same
training config (the SFT command runs only its `sft` stage); `stare-eval` reads an evaluation
config whose sections reuse the training ones. Layers, each over the one before: the schema's
defaults, the command's default config (`stare-train`/`stare-sft`: configs/tiny_cpu.yaml; a
`--config FILE` is layered over it unless the file names another `base:`), the KEY=VALUE
overrides. `--help` lists every key with the value a plain run uses and the comment that explains
it. Historical flags (`--model`, `--data`, `--output`; the evaluation flags) remain as documented
aliases of dotted keys.

Errors a user can fix (a bad key or value, a missing file or model, an unreachable server or hub,
a bad data row, a sandbox that cannot start, a used run directory) print one line naming the
problem and the fix, exit status 2; `--debug` shows the traceback instead. Ctrl-C ends with one
line saying where the run stopped and how to resume it (exit status 130). The scripts in
scripts/ are thin wrappers around these functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from sandbox.base import SANDBOX_BACKENDS
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS

DEFAULT_TRAIN_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"


def config_keys(schema: Any, defaults: Any = None) -> list[str]:
    """`  key=value  # comment` for every leaf of a config dataclass: the value is the one a plain
    run uses (`defaults`, e.g. the resolved default config; else the schema's), the comment the
    first sentence of the field's comment in its dataclass."""
    from stare_tir.config import field_choices, field_comments, first_sentence, flatten

    comments = field_comments(schema if isinstance(schema, type) else type(schema))
    choices = field_choices(schema if isinstance(schema, type) else type(schema))  # from the registries
    lines = []
    for key, value in flatten(defaults if defaults is not None else schema()).items():
        shown = repr(value) if isinstance(value, str) else json.dumps(value)
        note = first_sentence(comments.get(key, ""))
        if key in choices:
            note = f"[{' | '.join(choices[key])}] {note}"
        lines.append(f"  {key}={shown}" + (f"  # {note}" if note else ""))
    return lines


def _last(values: list) -> Any:
    return values[-1]  # a repeated flag: the last one wins, as with overrides


@dataclasses.dataclass
class Alias:
    """A flag kept for compatibility: `--flag VALUE` means `key=VALUE` for each of `keys`."""

    flag: str
    keys: tuple[str, ...]
    help: str
    type: Callable[[str], Any] = str
    choices: Sequence[str] | None = None
    # Turns the flag's values (a list: flags may repeat) into the override's value.
    convert: Callable[[list], Any] = _last


def build_parser(
    prog: str,
    description: str,
    schema: type,
    aliases: Sequence[Alias] = (),
    default_config: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
) -> argparse.ArgumentParser:
    from stare_tir.config import load_config

    defaults = load_config(schema, None, (), default_base=default_config)
    where = f"{Path(default_config).parent.name}/{Path(default_config).name}" if default_config else None
    epilog = [
        "Config keys, with the value a plain run uses"
        + (f" (the defaults with {where} over them)" if where else " (the defaults)")
        + ". Override any with KEY=VALUE after the flags.",
        "A --config FILE is layered over "
        + (f"{where}" if where else "the defaults")
        + " (it changes only what it sets) unless it names another base with a top-level `base: PATH` "
        "(relative to the file) or `base: null` (the defaults alone).",
        "",
    ]
    epilog += config_keys(schema, defaults)
    if aliases:
        epilog += [
            "",
            "The other flags above are aliases, kept for compatibility: each sets the dotted key(s) its help names.",
        ]
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog="\n".join(epilog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--config",
        default=None,
        help="YAML config file" + (f", layered over {where}" if where else ""),
    )
    if resume:
        p.add_argument(
            "--resume",
            nargs="?",
            const=True,
            default=False,
            metavar="auto",
            help="continue the run in trainer.run_dir from its latest checkpoint, with its own config.yaml as "
            "the base (KEY=VALUE overrides that change it are shown and must be accepted). `--resume auto` "
            "(requeued or preempted jobs): resume if there is a checkpoint, start if the directory is free, "
            "refuse otherwise",
        )
        p.add_argument(
            "--accept-changes",
            action="store_true",
            help="with --resume: continue with the overrides that change the run's saved settings",
        )
    if overwrite:
        p.add_argument(
            "--overwrite",
            action="store_true",
            help="replace what the output directory holds (for stare-train: the run in trainer.run_dir, deleted "
            "once the start-up checks pass)",
        )
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    for a in aliases:
        p.add_argument(
            a.flag,
            dest=_dest(a),
            type=a.type,
            choices=a.choices,
            action="append",
            metavar=a.flag.lstrip("-").upper().replace("-", "_"),
            help=f"alias of {', '.join(a.keys)}: {a.help}",
        )
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    return p


def parse_train_args(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """parse_intermixed_args, with `--resume KEY=VALUE` read as `--resume` then an override (the
    optional value of --resume is only `auto`)."""
    args = parser.parse_intermixed_args(argv)
    if isinstance(getattr(args, "resume", None), str) and args.resume != "auto":
        if "=" not in args.resume:
            parser.error(f"--resume {args.resume}: the only value --resume takes is `auto`")
        args.overrides.insert(0, args.resume)
        args.resume = True
    return args


def _dest(a: Alias) -> str:
    return "alias_" + a.flag.lstrip("-").replace("-", "_")


def alias_overrides(args: argparse.Namespace, aliases: Sequence[Alias]) -> list[str]:
    """The alias flags that were given, as dotted overrides (JSON values are valid YAML)."""
    out = []
    for a in aliases:
        given = getattr(args, _dest(a))
        if given is None:
            continue
        value = a.convert(given)
        out += [f"{key}={json.dumps(value)}" for key in a.keys]
    return out


def _user_errors() -> tuple[type[BaseException], ...]:
    from envs.data import DataError
    from sandbox import SandboxError
    from stare_tir.app.preflight import StartupError
    from stare_tir.config import ConfigError
    from stare_tir.eval.evaluate import EvalInfraError
    from stare_tir.learner.distributed import LaunchError

    return (ConfigError, StartupError, DataError, SandboxError, FileNotFoundError, EvalInfraError, LaunchError)


def run_cli(
    main: Callable[[argparse.Namespace], int],
    args: argparse.Namespace,
    on_interrupt: Callable[[KeyboardInterrupt], str] | None = None,
) -> int:
    """Call `main(args)`; a user-fixable error becomes one line on stderr and exit status 2, Ctrl-C
    one line from `on_interrupt` (where the run stopped, how to go on) and exit status 130."""
    from stare_tir.learner.distributed import export_launch_env

    errors = _user_errors()
    if not sys.stderr.isatty():  # a log file or a pipe: no redrawn bars from the HF libraries either
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        export_launch_env()  # srun/mpirun ranks -> RANK, WORLD_SIZE, ... before any per-rank file is named
        return main(args)
    except errors as e:
        if args.debug:
            raise
        for line in str(e).splitlines() or [type(e).__name__]:  # several problems: one line each
            print(f"error: {line}", file=sys.stderr)
        print("(rerun with --debug for the traceback)", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        if args.debug:
            raise
        print("\n" + (on_interrupt(e) if on_interrupt is not None else "interrupted"), file=sys.stderr)
        return 130


def _load(schema: type, args: argparse.Namespace, extra: Sequence[str] = (), default: str | None = None) -> Any:
    from stare_tir.config import load_config

    return load_config(schema, args.config, [*extra, *args.overrides], default_base=default)


def _load_collecting(
    schema: type, args: argparse.Namespace, extra: Sequence[str] = (), default: str | None = None
) -> tuple[Any, list[str]]:
    """The config without the overrides that name no key, and one line per such override: the
    start-up checks then run on the rest, so every problem of a command is reported at once. A
    config that still does not load raises its ConfigError."""
    from stare_tir.config import ConfigError, _check_path, load_config, parse_override

    good, problems = [], []
    for text in [*extra, *args.overrides]:
        try:
            _check_path(schema, parse_override(text)[0])
        except ConfigError as e:
            problems.append(str(e))
            continue
        good.append(text)
    try:
        return load_config(schema, args.config, good, default_base=default), problems
    except ConfigError as e:
        raise ConfigError("\n".join([*problems, str(e)])) from None


def _print_config(cfg: Any) -> None:
    import yaml

    from stare_tir.config import to_dict

    print(yaml.safe_dump(to_dict(cfg), sort_keys=False))


# ----------------------------------------------------------------------------------------------
# stare-train


def train_main(argv: list[str] | None = None) -> int:
    from stare_tir.train_config import TrainConfig

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
    run_dir: list[str] = []  # where the run is, for the Ctrl-C message

    def main(args: argparse.Namespace) -> int:
        cfg, problems = _load_collecting(TrainConfig, args, default=str(DEFAULT_TRAIN_CONFIG))
        if args.resume == "auto":  # a requeued job: continue the run if it has a checkpoint, else start
            from stare_tir.app.run_dir import auto_resume

            args.resume = auto_resume(Path(cfg.trainer.run_dir))
            if args.resume and args.overwrite:
                raise _config_error("--resume auto and --overwrite contradict each other: pass one of them")
        if args.resume:
            if problems:
                raise _config_error("\n".join(problems))
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
            raise _config_error("--accept-changes only applies with --resume")
        if args.print_config:
            if problems:
                raise _config_error("\n".join(problems))
            _print_config(cfg)
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
            return f"interrupted {at}; resume with: stare-train --resume trainer.run_dir={where}{restart}"
        if not run_dir:
            return "interrupted before the run started; nothing was written"
        if getattr(e, "stage", None) == "sft":
            where_stopped = "during the SFT stage, before RL step 1"
        elif step is None:
            where_stopped = "before RL started"
        else:
            where_stopped = f"at step {step}, before the first checkpoint"
        return (
            f"interrupted {where_stopped}; start again with: stare-train --overwrite trainer.run_dir={where} "
            "(SFT traces and a finished SFT model there are reused)"
        )

    return run_cli(main, args, interrupted)


def _config_error(message: str) -> Exception:
    from stare_tir.config import ConfigError

    return ConfigError(message)


# ----------------------------------------------------------------------------------------------
# stare-sft

SFT_ALIASES = (
    Alias("--model", ("model.path",), "starting model: HF directory, hub id, 'tiny' or 'tiny-random'"),
    Alias("--data", ("sft.traces",), 'JSONL traces, {"messages": [...]} or {"text": ...} per line'),
    Alias("--output", ("sft.output",), "directory for the fine-tuned HF checkpoint"),
)


def sft_main(argv: list[str] | None = None) -> int:
    from stare_tir.train_config import TrainConfig

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

    def main(args: argparse.Namespace) -> int:
        extra = alias_overrides(args, SFT_ALIASES)
        cfg, problems = _load_collecting(TrainConfig, args, extra, default=str(DEFAULT_TRAIN_CONFIG))
        if args.print_config and not problems:
            _print_config(cfg)
            return 0
        from stare_tir.app.preflight import StartupError, check_model, check_sandbox
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
    Alias("--backend", ("backend",), "rollout backend", choices=ROLLOUT_BACKENDS.names()),
    Alias(
        "--sglang-url", ("rollout.sglang.urls",), "SGLang server/router URL (repeat or comma-separate)", convert=_urls
    ),
    Alias("--sandbox", ("sandbox.backend",), "where the model's code runs", choices=SANDBOX_BACKENDS.names()),
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
    args = eval_parser().parse_intermixed_args(argv)
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
            _print_config(cfg)
            return 0
        from envs.data import load_problems
        from stare_tir.app.preflight import StartupError, check_backend, check_hub_dataset, check_model, check_sandbox
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
