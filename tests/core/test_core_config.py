"""Config loading: YAML + dotted overrides into typed dataclasses, with clear errors."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

import pytest

from stare_tir.config import ConfigError, load_config, parse_override, save_config


@dataclass
class Inner:
    target_entropy: float = 0.3
    variant: Literal["O1", "C2"] = "O1"

    def __post_init__(self) -> None:
        if not 0.0 < self.target_entropy < 10.0:
            raise ValueError(f"target_entropy={self.target_entropy!r}: must be in (0, 10)")


@dataclass
class Outer:
    steps: int = 10
    name: str = "run"
    path: str | None = None
    tags: list[str] = field(default_factory=list)
    inner: Inner = field(default_factory=Inner)


def test_defaults_yaml_then_overrides(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("steps: 20\ninner:\n  variant: C2\n")
    cfg = load_config(Outer, y, ["inner.target_entropy=0.25", "tags=[a,b]", "path=null"])
    assert cfg.steps == 20 and cfg.inner.variant == "C2"
    assert cfg.inner.target_entropy == 0.25 and cfg.tags == ["a", "b"] and cfg.path is None


def test_int_is_accepted_for_float_but_not_bool_for_int():
    assert load_config(Outer, None, ["inner.target_entropy=1"]).inner.target_entropy == 1.0
    with pytest.raises(ConfigError, match=r"steps=True: expected an integer"):
        load_config(Outer, None, ["steps=true"])


@pytest.mark.parametrize(
    "override, message",
    [
        ("inner.target_entopy=0.2", r"unknown key 'inner.target_entopy'.*target_entropy"),
        ("stepz=3", r"unknown key 'stepz'"),
        ("steps=many", r"steps='many': expected an integer"),
        ("inner.variant=C3", r"inner.variant='C3': must be one of 'O1', 'C2'"),
        ("inner.target_entropy=-1", r"inner.target_entropy=-1.0: must be in \(0, 10\)"),
        ("steps", r"expected KEY=VALUE"),
    ],
)
def test_bad_overrides_name_key_value_and_allowed(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(Outer, None, [override])


def test_unknown_key_in_yaml_is_rejected(tmp_path):
    y = tmp_path / "c.yaml"
    y.write_text("inner:\n  bogus: 1\n")
    with pytest.raises(ConfigError, match=r"unknown key inner.bogus"):
        load_config(Outer, y)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Outer, tmp_path / "nope.yaml")


def test_save_round_trip(tmp_path):
    cfg = load_config(Outer, None, ["inner.variant=C2", "steps=3"])
    save_config(cfg, tmp_path / "resolved.yaml")
    assert load_config(Outer, tmp_path / "resolved.yaml") == cfg


def test_parse_override_values():
    assert parse_override("a.b=0.5") == (["a", "b"], 0.5)
    assert parse_override("x=hello world") == (["x"], "hello world")
    assert parse_override("lr=3e-3") == (["lr"], 0.003)


# ----------------------------------------------------------------------------- layered configs


def test_a_partial_or_empty_yaml_is_layered_over_the_default_config(tmp_path):
    default = tmp_path / "default.yaml"
    default.write_text("base: null\nsteps: 40\ninner:\n  variant: C2\n")
    partial = tmp_path / "mine.yaml"
    partial.write_text("steps: 5\n")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    cfg = load_config(Outer, partial, default_base=default)
    assert cfg.steps == 5 and cfg.inner.variant == "C2"  # the default config's value survives
    assert load_config(Outer, empty, default_base=default) == load_config(Outer, None, default_base=default)
    assert load_config(Outer, None, default_base=default).steps == 40


def test_a_yaml_names_its_base_explicitly(tmp_path):
    default = tmp_path / "default.yaml"
    default.write_text("steps: 40\n")
    (tmp_path / "sub").mkdir()
    base = tmp_path / "sub" / "base.yaml"
    base.write_text("base: null\nname: from-base\ninner:\n  variant: C2\n")
    child = tmp_path / "sub" / "child.yaml"
    child.write_text("base: base.yaml\nname: child\n")  # relative to the file itself
    cfg = load_config(Outer, child, default_base=default)
    assert (cfg.name, cfg.inner.variant, cfg.steps) == ("child", "C2", 10)  # 10: the schema's, not 40
    alone = tmp_path / "alone.yaml"
    alone.write_text("base: null\nname: alone\n")
    assert load_config(Outer, alone, default_base=default).steps == 10
    loop = tmp_path / "loop.yaml"
    loop.write_text("base: loop.yaml\n")
    with pytest.raises(ConfigError, match="chain loops back"):
        load_config(Outer, loop)
    with pytest.raises(ConfigError, match=r"base\.yaml2.*not found"):
        (tmp_path / "bad.yaml").write_text("base: sub/base.yaml2\n")
        load_config(Outer, tmp_path / "bad.yaml")


@dataclass
class Commented:
    # Above the field,
    # two lines.
    a: int = 1
    b: int = 2  # trailing
    c: int = 3  # trailing that goes on
    # on the next line
    d: int = 4  # d's own
    e: int = 5

    def __post_init__(self) -> None:  # not a field
        pass


def test_field_comments_come_from_the_dataclass_source():
    from stare_tir.config import field_comments, first_sentence

    assert field_comments(Commented) == {
        "a": "Above the field, two lines.",
        "b": "trailing",
        "c": "trailing that goes on on the next line",
        "d": "d's own",
        "e": "",
    }
    assert field_comments(Outer)["inner.target_entropy"] == ""  # nested sections get dotted keys
    assert first_sentence("One. Two e.g. three. Four is long " + "x" * 200) == "One. Two e.g. three."
    assert first_sentence("y " * 80, width=20).endswith(" ...")


@dataclasses.dataclass
class _Inner:
    backend: str = "a"
    other: int = 0

    def __post_init__(self) -> None:
        if self.backend != "a":
            raise ValueError(f"backend={self.backend!r}: unknown")
        if self.other:
            raise ValueError(f"outer.inner.other={self.other}: named in full already")


@dataclasses.dataclass
class _Mid:
    inner: _Inner = dataclasses.field(default_factory=_Inner)


@dataclasses.dataclass
class _Top:
    outer: _Mid = dataclasses.field(default_factory=_Mid)


def test_a_sections_error_names_its_key_once():
    """A section names its own field (`backend='x'`); the loader adds the section once, and leaves a
    message that already names its full key (a check across fields) as it is."""
    from stare_tir.config import ConfigError, from_dict

    with pytest.raises(ConfigError) as e:
        from_dict(_Top, {"outer": {"inner": {"backend": "b"}}})
    assert str(e.value) == "outer.inner.backend='b': unknown"
    with pytest.raises(ConfigError) as e:
        from_dict(_Top, {"outer": {"inner": {"other": 1}}})
    assert str(e.value) == "outer.inner.other=1: named in full already"
