"""Typed configuration: YAML files + dotted command-line overrides -> nested dataclasses.

Every component owns a plain `@dataclass` of its settings (defaults and their reasons live there);
this module only loads, validates, overrides and saves such trees. Three hops from YAML to the code
it selects: file -> dataclass -> component constructor.

    cfg = load_config(TrainConfig, "configs/tiny_cpu.yaml", ["algo.stare.target_entropy=0.25"])

Unknown keys, wrong types and out-of-range values fail at start with a `ConfigError` that names the
dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import types
import typing
from pathlib import Path
from typing import Any, Literal, Sequence, TypeVar, Union, get_args, get_origin

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or out of range."""


def _type_name(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _is_union(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType)


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the annotation `tp`, converting only where it loses nothing."""
    if tp is Any:
        return value
    if _is_union(tp):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(str(e))
        allowed = " or ".join(_type_name(a) for a in args)
        raise ConfigError(f"{key}={value!r}: expected {allowed}")
    origin = get_origin(tp)
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise ConfigError(f"{key}={value!r}: must be {_type_name(tp)}")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a mapping of {tp.__name__} fields")
        return from_dict(tp, value, prefix=key)
    if origin in (list, tuple, Sequence):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}={value!r}: expected a list")
        (item_tp, *_) = get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}={value!r}: expected a mapping")
        _, val_tp = get_args(tp) or (str, Any)
        return {str(k): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: expected true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}={value!r}: expected an integer")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}={value!r}: expected a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)  # e.g. `model.path=123` or a numeric run name
        raise ConfigError(f"{key}={value!r}: expected a string")
    if isinstance(tp, type) and isinstance(value, tp):
        return value
    raise ConfigError(f"{key}={value!r}: expected {_type_name(tp)}")


def _sections(schema: Any) -> tuple[str, Any] | None:
    """A config dataclass may hold one settings section per entry of a registry, read and written as
    its own keys: `SECTIONS = ("methods", TOKEN_METHODS)` makes `algo.kl_cov.ratio` the `ratio` of the
    registered config of `kl_cov`, kept in the mapping field `methods`."""
    return getattr(schema, "SECTIONS", None) if isinstance(schema, type) or dataclasses.is_dataclass(schema) else None


def from_dict(schema: type[T], data: dict, prefix: str = "") -> T:
    """Build a dataclass from a (nested) dict, rejecting unknown keys and wrong types."""
    hints = typing.get_type_hints(schema)
    fields = {f.name: f for f in dataclasses.fields(schema) if f.init}
    sections = _sections(schema)
    if sections is not None:
        attr, registry = sections
        data = dict(data)
        given = dict(data.pop(attr, None) or {})
        for key in [k for k in data if k not in fields and k in registry.names()]:
            given[key] = data.pop(key)
        built = {}
        for name, value in given.items():
            key = f"{prefix}.{name}" if prefix else name
            if name not in registry.names() or registry.config_of(name) is None:
                raise ConfigError(f"unknown key {key}: {registry.unknown(name)}")
            cls = registry.config_of(name)
            built[name] = value if isinstance(value, cls) else from_dict(cls, value or {}, prefix=key)
        data[attr] = built
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = prefix or schema.__name__
        raise ConfigError(
            f"unknown key {prefix + '.' if prefix else ''}{unknown[0]!s} in {where}; "
            f"{_did_you_mean(unknown[0], fields, prefix)}valid keys: {', '.join(sorted(fields))}"
        )
    kwargs = {}
    for name, value in data.items():
        key = f"{prefix}.{name}" if prefix else name
        kwargs[name] = _coerce(value, hints[name], key)
    try:
        return schema(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:  # range checks in __post_init__ name the field
        raise ConfigError(_in_section(prefix, str(e))) from None


def _in_section(prefix: str, message: str) -> str:
    """A section's own error (`backend='x': ...`, its field named alone) as the user's key
    (`trainer.backend='x': ...`). A message that already names its full key (a check across
    sections) is kept as it is: the key is printed once."""
    if not prefix or message.startswith(prefix + "."):
        return message
    return f"{prefix}.{message}"


def to_dict(cfg: Any) -> Any:
    """Dataclass tree -> plain dict (YAML/JSON-safe)."""
    if dataclasses.is_dataclass(cfg):
        sections = _sections(cfg)
        out = {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
        if sections is not None:
            out.update(out.pop(sections[0]))  # each section under its own name
        return out
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if hasattr(cfg, "value") and isinstance(cfg.value, (str, int)):  # Enum
        return cfg.value
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b.c=value' -> (['a','b','c'], value parsed as YAML: 0.3, true, [1,2], null, text)."""
    if "=" not in text:
        raise ConfigError(f"override {text!r}: expected KEY=VALUE, e.g. trainer.steps=50")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    if not key:
        raise ConfigError(f"override {text!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str):  # YAML 1.1 reads "3e-3" as a string; a user means the number
        try:
            value = float(value)
        except ValueError:
            pass
    return key.split("."), value


def _set_path(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[path[-1]] = value


BASE_KEY = "base"


def read_config_layers(yaml_path: str | Path, default_base: str | Path | None = None) -> dict:
    """The values of a YAML config file, layered over its base (deep-merged, the file wins).

    A file names its base with a top-level `base:` key: a path (relative to the file's own
    directory) or null (the schema's defaults alone). A file without one is layered over
    `default_base`, the command's default config (`stare-train`: configs/tiny_cpu.yaml), so an
    empty or partial user YAML changes only what it sets.
    """
    chain: list[Path] = []
    path: Path | None = Path(yaml_path)
    layers: list[dict] = []
    while path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} not found (pass --config with an existing YAML)")
        if path.resolve() in chain:
            raise ConfigError(f"config file {str(path)!r}: its `base:` chain loops back to itself")
        chain.append(path.resolve())
        try:
            loaded = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {str(path)!r} is not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(path)!r} must hold a mapping at the top level")
        if BASE_KEY in loaded:
            base = loaded.pop(BASE_KEY)
            if base is not None and not isinstance(base, str):
                raise ConfigError(f"config file {str(path)!r}: base={base!r}: expected a path or null")
            path = (path.parent / base) if base else None
        elif default_base is not None and path.resolve() != Path(default_base).resolve():
            path = Path(default_base)
        else:
            path = None
        layers.append(loaded)
    tree: dict = {}
    for values in reversed(layers):  # the deepest base first
        _merge(tree, values)
    return tree


def load_config(
    schema: type[T],
    yaml_path: str | Path | None = None,
    overrides: Sequence[str] = (),
    default_base: str | Path | None = None,
) -> T:
    """Defaults of `schema`, then the YAML file over its base (`read_config_layers`), then each
    `key=value` override, validated. No file: `default_base` alone, if given."""
    path = yaml_path if yaml_path is not None else default_base
    loaded = read_config_layers(path, default_base) if path is not None else {}
    return resolve_config(schema, loaded, overrides)


def resolve_config(schema: type[T], values: dict, overrides: Sequence[str] = ()) -> T:
    """Defaults of `schema`, then the (nested) `values`, then each `key=value` override, validated.

    A schema with a `plugins` field (a run's config) imports the plugins the values and overrides
    name first (`stare_tir.plugins`), so that their registrations are valid names and settings
    sections when the rest is validated."""
    if any(f.name == PLUGINS_KEY for f in dataclasses.fields(schema)):
        import_config_plugins(values, overrides)
    tree: dict = defaults_tree(schema)
    _merge(tree, values)
    for text in overrides:
        keys, value = parse_override(text)
        _check_path(schema, keys)
        _set_path(tree, keys, value)
    return from_dict(schema, tree)


PLUGINS_KEY = "plugins"


def import_config_plugins(values: dict, overrides: Sequence[str] = (), extra: Sequence[str] = ()) -> list[str]:
    """Phase one of a load: the `plugins` of the raw `values` (or the last `plugins=` override),
    then `extra` (`--plugin`), imported before anything is validated. Returns the list."""
    from stare_tir.plugins import PluginError, import_plugins, plugins_of

    tree = {PLUGINS_KEY: values.get(PLUGINS_KEY)}
    for text in overrides:
        keys, value = parse_override(text)
        if keys == [PLUGINS_KEY]:
            tree[PLUGINS_KEY] = value
    try:
        plugins = list(dict.fromkeys([*plugins_of(tree), *extra]))
        import_plugins(plugins)
    except PluginError as e:
        raise ConfigError(str(e)) from None
    return plugins


def defaults_tree(schema: Any) -> dict:
    """The defaults as the dataclasses declare them, before any `__post_init__` fills in a value that
    depends on others (an algo.name preset's): layers and overrides decide those first."""
    out: dict = {}
    for f in dataclasses.fields(schema):
        if not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = to_dict(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            factory = f.default_factory
            is_type = isinstance(factory, type) and dataclasses.is_dataclass(factory)
            out[f.name] = defaults_tree(factory) if is_type else to_dict(factory())
    return out


def _merge(base: dict, update: dict) -> None:
    """Deep-merge `update` into `base`; unknown keys are left for from_dict to reject by name."""
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value


def _did_you_mean(key: str, valid: Any, prefix: str) -> str:
    """'did you mean `trainer.steps`? ' for the closest valid key, or '' when none is close."""
    near = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    return f"did you mean `{prefix + '.' if prefix else ''}{near[0]}`? " if near else ""


def _check_path(schema: Any, keys: list[str]) -> None:
    """Reject an override of a key that does not exist before touching the tree."""
    tp = schema
    for i, key in enumerate(keys):
        dotted = ".".join(keys[: i + 1])
        while _is_union(tp):  # Optional[Sub] -> Sub
            tp = next(a for a in get_args(tp) if a is not type(None))
        if tp is Any:  # inside a free-form mapping (e.g. learner.deepspeed): any nested key goes
            return
        if get_origin(tp) is dict:
            tp = get_args(tp)[1] if get_args(tp) else Any
            continue
        if not dataclasses.is_dataclass(tp):
            raise ConfigError(f"override {dotted!r}: {'.'.join(keys[:i])} is not a section")
        hints = typing.get_type_hints(tp)
        sections = _sections(tp)
        if key not in hints and sections is not None and key in sections[1].names() and sections[1].config_of(key):
            tp = sections[1].config_of(key)
            continue
        names = {f.name for f in dataclasses.fields(tp)}
        if key not in names:
            near = _did_you_mean(key, names, ".".join(keys[:i]))
            raise ConfigError(f"unknown key {dotted!r}; {near}valid keys here: {', '.join(sorted(names))}")
        tp = hints[key]


def save_config(cfg: Any, path: str | Path) -> None:
    """Write the resolved config as YAML (into every run directory), atomically: another rank or
    a resumed run reading it never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)  # a failed write (a full disk) leaves nothing behind


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """A config (dataclass tree or nested dict) as {dotted key: leaf value}; free-form mappings
    (e.g. learner.deepspeed) stay one leaf."""
    if dataclasses.is_dataclass(tree):
        sections = _sections(tree)
        items = {f.name: getattr(tree, f.name) for f in dataclasses.fields(tree)}
        if sections is not None:
            items.update(items.pop(sections[0]))
        tree = items
        out: dict[str, Any] = {}
        for key, value in tree.items():
            if dataclasses.is_dataclass(value):
                out.update(flatten(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = to_dict(value)
        return out
    return {prefix.rstrip("."): tree}


def config_changes(old: Any, new: Any) -> list[str]:
    """`key: old -> new` for every leaf that differs between two configs of one schema."""
    a, b = flatten(old), flatten(new)
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def field_comments(schema: type) -> dict[str, str]:
    """{dotted key: its comment} for every field of a config dataclass tree.

    The comment is the block of `#` lines right above the field, or the comment on its own line,
    in the dataclass's source: where the defaults and their reasons are written down.
    """
    out: dict[str, str] = {}
    hints = typing.get_type_hints(schema)
    own = _own_comments(schema)
    sections = _sections(schema)
    for f in dataclasses.fields(schema):
        if sections is not None and f.name == sections[0]:
            for entry in sections[1].entries():
                if entry.config is not None:
                    for key, text in field_comments(entry.config).items():
                        out[f"{entry.name}.{key}"] = text
            continue
        tp = hints[f.name]
        while _is_union(tp):
            tp = next(a for a in get_args(tp) if a is not type(None))
        if dataclasses.is_dataclass(tp):
            for key, text in field_comments(tp).items():
                out[f"{f.name}.{key}"] = text
        else:
            out[f.name] = own.get(f.name, "")
    return out


def field_choices(schema: type) -> dict[str, tuple[str, ...]]:
    """{dotted key: its allowed names} for every field whose metadata names them (`choices`, a callable
    such as a registry's `names`), so `--help` lists what a registry holds at the time it runs."""
    out: dict[str, tuple[str, ...]] = {}
    hints = typing.get_type_hints(schema)
    for f in dataclasses.fields(schema):
        tp = hints[f.name]
        while _is_union(tp):
            tp = next(a for a in get_args(tp) if a is not type(None))
        if dataclasses.is_dataclass(tp):
            out.update({f"{f.name}.{k}": v for k, v in field_choices(tp).items()})
        elif "choices" in f.metadata:
            out[f.name] = tuple(f.metadata["choices"]())
    return out


def _own_comments(schema: type) -> dict[str, str]:
    import ast
    import inspect
    import io
    import textwrap
    import tokenize

    try:
        source = textwrap.dedent(inspect.getsource(schema))
    except (OSError, TypeError):  # no source (a frozen or generated class): no comments
        return {}
    comments = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = source.splitlines()
    cls = ast.parse(source).body[0]
    fields = [n for n in getattr(cls, "body", []) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
    texts: dict[str, list[str]] = {}
    for i, node in enumerate(fields):
        above, row = [], node.lineno - 1
        while row >= 1 and row in comments and lines[row - 1].lstrip().startswith("#"):
            above.insert(0, comments[row])
            row -= 1
        trailing = [comments[r] for r in range(node.lineno, node.end_lineno + 1) if r in comments]
        prev = fields[i - 1] if i else None
        if above and trailing and prev is not None and prev.end_lineno == row and texts.get(prev.target.id):
            # `a: int = 1  # text that goes on` / `# continues here` / `b: int = 2  # b's own`
            texts[prev.target.id] += above
            above = []
        texts[node.target.id] = above + trailing
    return {name: " ".join(t for t in parts if t) for name, parts in texts.items()}


def first_sentence(text: str, width: int = 110) -> str:
    """The leading sentences of a comment that fit in `width` characters (at least the first one,
    cut at a word boundary when it alone is longer)."""
    import re

    sentences = re.split(r"(?<=[.!?])\s+(?=[A-Z\"'(`])", text.strip())
    out = sentences[0]
    for sentence in sentences[1:]:
        if len(out) + 1 + len(sentence) > width:
            break
        out += " " + sentence
    if len(out) > width:
        out = out[:width].rsplit(" ", 1)[0] + " ..."
    return out
