"""The one registry helper every registry of the project uses."""

from __future__ import annotations

import sys
import types

import pytest

from registry import Registry


def test_register_get_config_and_unknown_name_lists_valid_ones():
    reg: Registry = Registry("widget")

    class Cfg:
        pass

    @reg.register("a", config=Cfg)
    def a():
        return 1

    reg.add("b", lambda: 2)
    assert reg.names() == ("a", "b") and "a" in reg and "c" not in reg
    assert reg.get("a") is a and reg.config_of("a") is Cfg and reg.config_of("b") is None
    with pytest.raises(ValueError, match=r"x.y='c': unknown widget; choose one of a, b"):
        reg.check("c", "x.y")
    with pytest.raises(ValueError, match=r"'c': unknown widget; choose one of a, b"):
        reg.get("c")
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("a", a)


def test_temporarily_registers_for_a_block_only():
    reg: Registry = Registry("widget")
    with reg.temporarily("tmp", object()):
        assert "tmp" in reg
    assert "tmp" not in reg


def test_load_imports_the_defining_modules_on_first_lookup(monkeypatch):
    reg: Registry = Registry("widget", load=("fake_widgets_mod",))
    module = types.ModuleType("fake_widgets_mod")
    imported = []

    def fake_import(name):
        imported.append(name)
        reg.add("w", object())
        return module

    monkeypatch.setattr("registry.importlib.import_module", fake_import)
    assert imported == []  # declared, nothing imported yet
    assert reg.names() == ("w",) and imported == ["fake_widgets_mod"]
    reg.names()
    assert imported == ["fake_widgets_mod"]  # once
    assert "fake_widgets_mod" not in sys.modules


def test_a_plugins_entry_comes_after_the_built_in_ones(monkeypatch):
    """An entry added from outside the registry's own modules (a plugin, imported first) loads the
    built-in entries before itself: names, --help and error hints list the built-ins first."""
    reg: Registry = Registry("widget", load=("fake_builtin_widgets",))

    def fake_import(name):
        reg.add("builtin", types.SimpleNamespace(__module__="fake_builtin_widgets"))

    monkeypatch.setattr("registry.importlib.import_module", fake_import)
    reg.add("mine", types.SimpleNamespace(__module__="mylab.widgets"))
    assert reg.names() == ("builtin", "mine")


def test_settings_fill_every_entry_with_a_config():
    import dataclasses

    @dataclasses.dataclass
    class Cfg:
        size: int = 1

    reg: Registry = Registry("widget")
    reg.add("a", object(), config=Cfg)
    reg.add("b", object())  # no settings: no section
    assert reg.settings() == {"a": Cfg()}
    assert reg.settings({"a": {"size": 3}}) == {"a": Cfg(size=3)}
    given = Cfg(size=5)
    assert reg.settings({"a": given})["a"] is given
    with pytest.raises(ValueError, match="^b: no widget with settings by that name"):
        reg.settings({"b": {}})
