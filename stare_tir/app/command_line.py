"""The command-line convention every entry point shares (`stare_tir.app.cli`): a config file plus
dotted KEY=VALUE overrides, `--help` built from the config dataclasses and registries, alias flags,
`--plugin` (a user's module imported before the config is read), and one-line errors.

Light on purpose: torch and the components load only when a command runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence


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


def key_help(schema: type, defaults: Any, key: str) -> str:
    """The whole comment of one config key (or of every key under a section such as `sandbox`), with
    the value a plain run uses and, for a registry-backed key, the names it holds now."""
    import textwrap

    from stare_tir.config import field_choices, field_comments, flatten

    comments, choices = field_comments(schema), field_choices(schema)
    values = flatten(defaults if defaults is not None else schema())
    keys = [k for k in values if k == key or k.startswith(key + ".")]
    if not keys:
        import difflib

        near = difflib.get_close_matches(key, list(values), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else "; `--help` lists every key"
        raise ValueError(f"--help {key}: no such config key{hint}")
    out = []
    for k in keys:
        v = values[k]
        out.append(f"{k}={repr(v) if isinstance(v, str) else json.dumps(v)}")
        if k in choices:
            out.append(f"  one of: {', '.join(choices[k])}")
        text = comments.get(k, "") or "(no comment)"
        out += textwrap.wrap(text, width=100, initial_indent="  ", subsequent_indent="  ")
        out.append("")
    return "\n".join(out).rstrip()


class _HelpAction(argparse.Action):
    """`--help`: the one-line view of every key; `--help KEY`: that key's whole comment."""

    def __init__(self, option_strings: Sequence[str], dest: str, schema: type, defaults: Any, **kwargs: Any):
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, metavar="KEY", **kwargs)
        self.schema, self.defaults = schema, defaults

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option_string: Any = None):
        if values is None or "=" in values:
            parser.print_help()
            parser.exit()
        try:
            print(key_help(self.schema, self.defaults, values))
        except ValueError as e:
            parser.exit(2, f"error: {e}\n")
        parser.exit()


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
    epilog += ["", "`--help KEY` prints one key's whole comment (or every key of a section: `--help sandbox`)."]
    p = argparse.ArgumentParser(
        prog=prog,
        description=description,
        epilog="\n".join(epilog),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    p.add_argument(
        "-h",
        "--help",
        action=_HelpAction,
        schema=schema,
        defaults=defaults,
        help="show this help (every key, one line each) and exit; --help KEY: that key's whole comment",
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
    p.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE (a dotted name or a .py path) before the config is read, so what it registers "
        "(methods, losses, graders, backends, ...) is selectable by name; repeatable; saved in the config's "
        "`plugins` (docs/extending.md)",
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


def early_plugins(argv: Sequence[str] | None, default_config: str | None = None, resume: bool = False) -> None:
    """Import the plugins a command names, before its parser is built (so `--help` lists what they
    register) and before its config is validated: `--plugin` flags, the `plugins` of the --config
    file (over the command's default config), a `plugins=` override and, with --resume, those of
    the run's saved config.yaml (`add_plugin_override` then saves the `--plugin` values with the
    config). A plugin that fails to import raises ConfigError (one line naming it)."""
    from stare_tir.config import ConfigError, import_config_plugins, parse_override, read_config_layers

    argv = list(sys.argv[1:] if argv is None else argv)
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--plugin", action="append", default=[])
    pre.add_argument("--config", default=None)
    if resume:
        pre.add_argument("--resume", nargs="?", const=True, default=False)
    known, rest = pre.parse_known_args(argv)
    overrides = [a for a in rest if "=" in a and not a.startswith("-")]
    if isinstance(getattr(known, "resume", None), str) and "=" in known.resume:
        overrides.insert(0, known.resume)  # `--resume KEY=VALUE`: an override (parse_train_args)
    path = known.config or default_config
    try:
        tree = read_config_layers(path, default_config) if path else {}
    except ConfigError:
        tree = {}  # the full load reports an unreadable file, with its own message
    import_config_plugins(tree, overrides, known.plugin)
    if getattr(known, "resume", False):
        run_dir = tree.get("trainer", {}).get("run_dir") if isinstance(tree.get("trainer"), dict) else None
        for text in overrides:
            keys, value = parse_override(text)
            if keys == ["trainer", "run_dir"]:
                run_dir = value
        saved = Path(str(run_dir or _default_run_dir())) / "config.yaml"
        if saved.is_file():
            import yaml

            try:
                import_config_plugins(yaml.safe_load(saved.read_text()) or {})
            except yaml.YAMLError:
                pass  # --resume reports a broken config.yaml itself


def _default_run_dir() -> str:
    from stare_tir.train_config import TrainerConfig

    return TrainerConfig.run_dir


def add_plugin_override(args: argparse.Namespace, default_config: str | None = None) -> None:
    """`--plugin` values join the config's `plugins` (the file's, or a `plugins=` override): one
    override, so they are saved in config.yaml and a resumed run imports them again."""
    if not args.plugins:
        return
    from stare_tir.config import ConfigError, parse_override, read_config_layers

    path = args.config or default_config
    try:
        current = (read_config_layers(path, default_config) if path else {}).get("plugins") or []
    except ConfigError:
        current = []  # the full load reports an unreadable file, with its own message
    for text in args.overrides:
        keys, value = parse_override(text)
        if keys == ["plugins"]:
            current = value or []
    current = [current] if isinstance(current, str) else list(current)
    args.overrides.append(f"plugins={json.dumps(list(dict.fromkeys([*current, *args.plugins])))}")


def plugins_first(argv: Sequence[str] | None, default_config: str | None = None, resume: bool = False) -> int:
    """`early_plugins` for an entry point: 0, or 2 after one line on stderr (a plugin that does not
    import; --debug: its traceback)."""
    from stare_tir.config import ConfigError

    try:
        early_plugins(argv, default_config, resume)
    except ConfigError as e:
        if "--debug" in (sys.argv[1:] if argv is None else argv):
            raise
        print(f"error: {e}", file=sys.stderr)
        print("(rerun with --debug for the traceback)", file=sys.stderr)
        return 2
    return 0


def _user_errors() -> tuple[type[BaseException], ...]:
    from envs.data import DataError
    from sandbox import SandboxError
    from stare_tir.config import ConfigError
    from stare_tir.errors import StartupError
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


def load_collecting(
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


def print_config(cfg: Any) -> None:
    import yaml

    from stare_tir.config import to_dict

    print(yaml.safe_dump(to_dict(cfg), sort_keys=False))


def config_error(message: str) -> Exception:
    from stare_tir.config import ConfigError

    return ConfigError(message)
