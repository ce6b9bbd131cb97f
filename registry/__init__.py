"""Names -> things of one kind, written once where the thing is defined.

Every registry of the project is one `Registry`: advantage estimators, policy losses and token
methods (stare_tir.algos), rollout backends (stare_tir.rollout), graders (envs.grading) and sandbox
backends (sandbox). A name is written once, in the decorator on the function or class it names;
the config's allowed values, `--help`, presets and error hints read the registry.

    TOKEN_METHODS = Registry("token method", load=("stare_tir.algos.token_methods",))

    @TOKEN_METHODS.register("kl_cov", config=KLCovConfig)
    def kl_cov(inputs, cfg): ...

    TOKEN_METHODS.get("kl_cov")          # the function; an unknown name lists the valid ones
    TOKEN_METHODS.config_of("kl_cov")    # its settings dataclass (or None)

`load` names the modules that define the built-in entries; they are imported on the first lookup,
so a registry can be declared in a light module and filled by the modules that define its entries.
Those modules must themselves be light where a light caller (a config, `--help`) reads the names.

It is its own package below the three (stare_tir -> envs -> sandbox -> registry) so that every layer
can use it without importing another layer by name (a tensor function must not import the
code-execution package); it knows nothing of what it holds and imports nothing of the project.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Generic, Iterator, Sequence, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    config: type | None  # the dataclass of its settings, if it has any
    module: str  # where it was defined (for messages and docs)


class Registry(Generic[T]):
    """A named set of functions or classes of one kind, found by name."""

    def __init__(self, kind: str, *, load: Sequence[str] = ()) -> None:
        self.kind = kind
        self._load = tuple(load)
        self._loaded = not self._load
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, *, config: type | None = None) -> Callable[[T], T]:
        """Decorator: make the decorated function or class selectable by `name`."""

        def wrap(obj: T) -> T:
            self.add(name, obj, config=config)
            return obj

        return wrap

    def add(self, name: str, obj: T, *, config: type | None = None) -> None:
        if not self._loaded and getattr(obj, "__module__", "?") not in self._load:
            self._ensure_loaded()  # a plugin's entry: the built-in ones first, in their own order
        if not name or not isinstance(name, str):
            raise ValueError(f"{self.kind} name {name!r}: must be a non-empty string")
        if name in self._entries:
            raise ValueError(f"{self.kind} {name!r} registered twice ({self._entries[name].module})")
        self._entries[name] = Entry(name, obj, config, getattr(obj, "__module__", "?"))

    def remove(self, name: str) -> None:
        self._entries.pop(name, None)

    @contextmanager
    def temporarily(self, name: str, obj: T, *, config: type | None = None) -> Iterator[T]:
        """Register `obj` for the duration of a `with` block (tests, one-off experiments)."""
        self._ensure_loaded()
        self.add(name, obj, config=config)
        try:
            yield obj
        finally:
            self.remove(name)

    def _ensure_loaded(self) -> None:
        if not self._loaded:
            self._loaded = True  # first, so a module that reads the registry while loading sees no loop
            for module in self._load:
                importlib.import_module(module)

    def names(self) -> tuple[str, ...]:
        self._ensure_loaded()
        return tuple(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self.names()

    def entry(self, name: str) -> Entry[T]:
        self._ensure_loaded()
        try:
            return self._entries[name]
        except KeyError:
            raise ValueError(self.unknown(name)) from None

    def get(self, name: str) -> T:
        """The registered object; an unknown name raises ValueError listing the valid ones."""
        return self.entry(name).obj

    def config_of(self, name: str) -> type | None:
        return self.entry(name).config

    def entries(self) -> tuple[Entry[T], ...]:
        self._ensure_loaded()
        return tuple(self._entries.values())

    def settings(self, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """One settings object per entry that has a config class, as a config's sections hold them:
        `given[name]` (an instance, or a mapping of its fields) or the class's defaults. A config
        dataclass declares `SECTIONS = (field, registry)` and fills that field with this (see
        stare_tir/config.py), so a plugin's entry gets its own section like a built-in one."""
        given = dict(given or {})
        out: dict[str, Any] = {}
        for entry in self.entries():
            if entry.config is None:
                continue
            value = given.pop(entry.name, None)
            if value is None:
                value = entry.config()
            elif isinstance(value, dict):
                value = entry.config(**value)
            out[entry.name] = value
        if given:  # a name that is no entry with settings
            name = sorted(given)[0]
            raise ValueError(f"{name}: no {self.kind} with settings by that name ({self.unknown(name)})")
        return out

    def unknown(self, name: Any, key: str = "") -> str:
        """The one-line message for a name this registry does not hold."""
        where = f"{key}={name!r}" if key else repr(name)
        return f"{where}: unknown {self.kind}; choose one of {', '.join(self.names())}"

    def check(self, name: Any, key: str = "") -> None:
        """Raise ValueError naming `key` when `name` is not registered."""
        if name not in self.names():
            raise ValueError(self.unknown(name, key))
