"""One command-line convention for every entry point: a config file plus dotted KEY=VALUE overrides.

    stare-train [--config FILE] [--resume] [--print-config] [--debug] [KEY=VALUE ...]
    stare-sft   [--config FILE] [--print-config] [--debug] [KEY=VALUE ...]
    stare-eval  [--config FILE] [--print-config] [--debug] [flag aliases] [KEY=VALUE ...]

Keys are the same everywhere: `model.path`, `model.tokenizer`, `sft.traces`, `sft.train.epochs`,
`learner.*`, `rollout.*`, `env.*`, `sandbox.*`, `eval.*`. `stare-train` and `stare-sft` read the same
training config (the SFT command runs only its `sft` stage); `stare-eval` reads an evaluation
config whose sections reuse the training ones. `--help` lists every key with its default.
Historical flags (`--model`, `--data`, `--output`; the evaluation flags) remain as documented
aliases of dotted keys.

Errors a user can fix (a bad key or value, a missing file or model, a bad data row, a sandbox that
cannot start) print one line naming the problem and the fix, exit status 2; `--debug` shows the
traceback instead. The scripts in scripts/ are thin wrappers around these functions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

DEFAULT_TRAIN_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "tiny_cpu.yaml"


def config_keys(schema: Any, prefix: str = "") -> list[str]:
    """`  key=default` for every leaf of a config dataclass, nested sections as dotted keys."""
    lines = []
    obj = schema() if isinstance(schema, type) else schema
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            lines += config_keys(value, f"{prefix}{f.name}.")
        else:
            shown = repr(value) if isinstance(value, str) else json.dumps(value)
            lines.append(f"  {prefix}{f.name}={shown}")
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
) -> argparse.ArgumentParser:
    epilog = ["Config keys (KEY=VALUE overrides, applied after --config; defaults shown):"]
    epilog += config_keys(schema)
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
        default=default_config,
        help="YAML config file"
        + (f" (default: {Path(default_config).parent.name}/{Path(default_config).name})" if default_config else ""),
    )
    if resume:
        p.add_argument(
            "--resume",
            action="store_true",
            help="continue from the latest checkpoint in trainer.run_dir (SFT is reused)",
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
    from stare_tir.config import ConfigError
    from stare_tir.learner.distributed import LaunchError
    from stare_tir.preflight import StartupError

    return (ConfigError, StartupError, DataError, SandboxError, FileNotFoundError, LaunchError)


def run_cli(main: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Call `main(args)`; a user-fixable error becomes one line on stderr and exit status 2."""
    from stare_tir.learner.distributed import export_launch_env

    errors = _user_errors()
    try:
        export_launch_env()  # srun/mpirun ranks -> RANK, WORLD_SIZE, ... before any per-rank file is named
        return main(args)
    except errors as e:
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        print("(rerun with --debug for the traceback)", file=sys.stderr)
        return 2


def _load(schema: type, args: argparse.Namespace, extra: Sequence[str] = ()) -> Any:
    from stare_tir.config import load_config

    return load_config(schema, args.config, [*extra, *args.overrides])


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
        "STARE) -> evaluation. With no arguments: the CPU default (configs/tiny_cpu.yaml).",
        TrainConfig,
        default_config=str(DEFAULT_TRAIN_CONFIG),
        resume=True,
    )
    args = parser.parse_args(argv)

    def main(args: argparse.Namespace) -> int:
        cfg = _load(TrainConfig, args)
        if args.print_config:
            _print_config(cfg)
            return 0
        from stare_tir.pipeline import run_pipeline

        run_pipeline(cfg, resume=args.resume)
        return 0

    return run_cli(main, args)


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
        "and runs its sft stage: sft.traces, sft.output, sft.train.* (epochs, batch_size, learner.*).",
        TrainConfig,
        aliases=SFT_ALIASES,
        default_config=str(DEFAULT_TRAIN_CONFIG),
    )
    args = parser.parse_args(argv)

    def main(args: argparse.Namespace) -> int:
        cfg = _load(TrainConfig, args, alias_overrides(args, SFT_ALIASES))
        if args.print_config:
            _print_config(cfg)
            return 0
        from stare_tir.components import resolve_model_path
        from stare_tir.pipeline import check_sft_traces, sft_output, sft_stage
        from stare_tir.preflight import check_model, check_sandbox
        from stare_tir.tracking import setup_run_logging

        check_model(cfg.model)
        check_sft_traces(cfg)
        if cfg.sft.traces == "arithmetic":
            check_sandbox(cfg.sandbox)  # the synthetic traces run their code
        out = sft_output(cfg)
        run_dir = out.parent
        setup_run_logging(run_dir)
        _, summary = sft_stage(cfg, resolve_model_path(cfg.model), Path(cfg.trainer.run_dir))
        if summary.get("rank", 0) == 0 and not summary.get("reused"):
            print(
                f"RESULT steps={summary['steps']} first_loss={summary['first_loss']:.4f} "
                f"final_loss={summary['final_loss']:.4f} seconds={summary['seconds']:.1f} output={out}"
            )
        elif summary.get("reused"):
            print(f"RESULT reused={out}")
        return 0

    return run_cli(main, args)


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
    Alias("--backend", ("backend",), "rollout backend", choices=("hf", "sglang")),
    Alias(
        "--sglang-url", ("rollout.sglang.urls",), "SGLang server/router URL (repeat or comma-separate)", convert=_urls
    ),
    Alias("--sandbox", ("sandbox.backend",), "where the model's code runs", choices=("local", "docker", "e2b")),
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
    from stare_tir.evaluate import EvalRunConfig

    return build_parser(
        "stare-eval",
        "Evaluate a tool-integrated reasoning model on AIME and other math benchmarks, with "
        "tool calls. Writes <out_dir>/<dataset>.jsonl, summary.json and config.yaml; rerunning resumes.",
        EvalRunConfig,
        aliases=EVAL_ALIASES,
    )


def eval_main(argv: list[str] | None = None) -> int:
    from stare_tir.evaluate import EvalRunConfig

    args = eval_parser().parse_args(argv)
    given = alias_overrides(args, EVAL_ALIASES) + list(args.overrides)
    if not (args.config or any(o.startswith("model.path=") for o in given)):
        print(
            "error: name the model to evaluate: model.path=PATH_OR_HF_ID (alias --model; 'tiny' for the "
            "shipped tiny base)",
            file=sys.stderr,
        )
        return 2

    def main(args: argparse.Namespace) -> int:
        cfg = _load(EvalRunConfig, args, alias_overrides(args, EVAL_ALIASES))
        if args.print_config:
            _print_config(cfg)
            return 0
        from envs.data import load_problems
        from stare_tir.evaluate import run_eval
        from stare_tir.preflight import StartupError, check_model, check_sandbox

        check_model(cfg.model)
        for name in cfg.eval.datasets:  # a missing or malformed dataset fails before the model loads
            try:
                load_problems(name, limit=1)
            except (FileNotFoundError, ValueError) as e:
                raise StartupError(f"eval.datasets: {name!r}: {e}") from None
        check_sandbox(cfg.sandbox)
        run_eval(cfg)
        return 0

    return run_cli(main, args)
