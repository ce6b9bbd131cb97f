"""A user's own modules, imported before a config is validated: the way to extend without forking.

A plugin is a Python module that registers entries into the registries (a token method, an
advantage estimator, a policy loss, a grader, a rollout or sandbox backend); once imported, its
names are valid config values and its settings sections are config keys, exactly like the
built-in ones. Name it in the run config or on the command line:

    plugins: [mylab.methods, ./my_reward.py]          # YAML, a top-level key
    stare-train --plugin mylab.methods algo.name=my_pos_scale

A plugin is a dotted module name (found on `sys.path`: install it, or put its directory on
PYTHONPATH) or the path of a `.py` file (its directory is put first on `sys.path` and it is
imported by its file name, so a reward function in it is `my_reward:fn`). Plugins are imported in
order, once per process (a module already imported is not run again), and saved in the run's
config.yaml so that `--resume` and every rank import them again. See docs/extending.md.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Iterable


class PluginError(ValueError):
    """A plugin could not be imported (the message is one line naming it and the cause)."""


def module_name(plugin: str) -> str:
    """The module a plugin names: a dotted name as is, a `.py` path by its file name (its
    directory put first on sys.path)."""
    if plugin.endswith(".py"):
        path = Path(plugin).expanduser().resolve()
        if not path.is_file():
            raise PluginError(f"plugin {plugin!r}: no such file")
        folder = str(path.parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        return path.stem
    return plugin


def import_plugins(plugins: Iterable[str]) -> None:
    """Import each plugin (see the module docstring); the first that fails raises `PluginError`."""
    for plugin in plugins:
        if not isinstance(plugin, str) or not plugin.strip():
            raise PluginError(f"plugins: {plugin!r}: expected a module name or the path of a .py file")
        name = module_name(plugin.strip())
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - any failure of a user's module is one line naming it
            cause = (str(e).strip().splitlines() or [""])[0]
            hint = (
                "; install it, put its directory on PYTHONPATH, or pass the path of its .py file"
                if isinstance(e, ModuleNotFoundError) and e.name and name.startswith(e.name)
                else ""
            )
            raise PluginError(f"plugin {plugin!r} cannot be imported ({type(e).__name__}: {cause}){hint}") from e


def plugins_of(tree: dict) -> list[str]:
    """The `plugins` list of a raw config tree (a YAML's values and overrides, not yet validated)."""
    value = tree.get("plugins") or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise PluginError(f"plugins={value!r}: expected a list of module names or .py paths")
    return [str(v) for v in value]
