"""Every registry is closed: it loads every module of the repository that registers into it.

A registry is filled by the modules that define its entries; a name is valid only once its module
has been imported. So each registry names those modules in its `load=` (or they are the module that
declares it): a method, a loss or a backend in a file of its own is then visible from the first
lookup, whoever looks (a config, `--help`, a test), without anyone importing it first by hand.

The scan reads the source (ast), so a new file that registers (a token method in a folder of its
own, say) fails here until its registry loads it.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from registry import Registry

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stare_tir", "envs", "sandbox")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _sources() -> dict[str, ast.Module]:
    return {_module_name(p): ast.parse(p.read_text()) for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def declared_registries() -> dict[str, str]:
    """{registry variable: the module that declares it} for every `NAME = Registry(...)`."""
    out = {}
    for module, tree in _sources().items():
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if isinstance(value, ast.Call) and getattr(value.func, "id", None) == "Registry":
                for target in targets:
                    if isinstance(target, ast.Name):
                        out[target.id] = module
    return out


def registering_modules(name: str) -> set[str]:
    """Modules with a `NAME.register(...)` or `NAME.add(...)` call (decorators included)."""
    found = set()
    for module, tree in _sources().items():
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("register", "add")
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == name
            ):
                found.add(module)
    return found


REGISTRIES = declared_registries()


def test_the_scan_finds_the_registries_and_their_modules():
    assert {"ADVANTAGE_ESTIMATORS", "POLICY_LOSSES", "TOKEN_METHODS", "ROLLOUT_BACKENDS", "SANDBOX_BACKENDS"} <= set(
        REGISTRIES
    )
    assert "GRADERS" in REGISTRIES
    assert "stare_tir.rollout.backends.hf" in registering_modules("ROLLOUT_BACKENDS")


@pytest.mark.parametrize("name", sorted(REGISTRIES))
def test_every_registering_module_is_loaded_by_its_registry(name):
    declared_in = REGISTRIES[name]
    registry = getattr(importlib.import_module(declared_in), name)
    assert isinstance(registry, Registry)
    loaded = {declared_in, *registry._load}
    missing = sorted(registering_modules(name) - loaded)
    assert not missing, f"{name} ({declared_in}) does not load {missing}: add them to its `load=`"
    for module in registry._load:  # and every module it loads exists
        assert importlib.util.find_spec(module) is not None, module


@pytest.mark.parametrize("name", sorted(REGISTRIES))
def test_every_entry_names_its_module(name):
    registry = getattr(importlib.import_module(REGISTRIES[name]), name)
    for entry in registry.entries():
        assert entry.module.split(".")[0] in PACKAGES, (name, entry.name, entry.module)
