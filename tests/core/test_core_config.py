"""Config loading: YAML + dotted overrides into typed dataclasses, with clear errors."""

from __future__ import annotations

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
