"""Sandbox configuration: plain typed dataclasses with documented defaults."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, ClassVar

from registry import Registry

from .base import SANDBOX_BACKENDS, Limits


@dataclass
class DockerConfig:
    image: str = "stare-sandbox:latest"  # built offline by `python -m sandbox.docker.build`
    cpus: float = 1.0  # CPU quota per container; a hog cannot starve the trainer
    warm: int = 2  # containers kept for reuse between sessions (~1 s to start one); set it near the
    # number of sessions open at once (rollout concurrency), each idle one holds ~100 MB
    base_url: str = ""  # Docker engine address; "" = DOCKER_HOST or the local socket

    def __post_init__(self) -> None:
        if self.cpus <= 0:
            raise ValueError(f"cpus={self.cpus!r}: must be > 0")
        if self.warm < 0:
            raise ValueError(f"warm={self.warm!r}: must be >= 0")


@dataclass
class E2BConfig:
    api_key: str = ""  # "" = the E2B_API_KEY environment variable
    domain: str = ""  # "" = E2B_DOMAIN or e2b.app; set it for a self-hosted deployment
    template: str = ""  # "" = the SDK's default code-interpreter template
    sandbox_timeout_s: int = 600  # lifetime of one cloud sandbox (one per session)
    request_timeout_s: float = 30.0  # connect/control-plane timeout of each HTTP request
    retries: int = 2  # extra attempts after a transport error where a retry cannot re-run code
    sandbox_url: str = ""  # talk to this code-interpreter URL directly (self-hosted or test stand-in)
    debug: bool = False  # SDK debug mode: no control-plane calls (used with sandbox_url)

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries={self.retries!r}: must be >= 0")
        if self.request_timeout_s <= 0:
            raise ValueError(f"request_timeout_s={self.request_timeout_s!r}: must be > 0")


@dataclass
class SandboxConfig:
    # a name of SANDBOX_BACKENDS (sandbox/base.py): local = namespaces+cgroups on this host (default),
    # docker = the same worker in one container per session, e2b = cloud sandboxes
    backend: str = field(default="local", metadata={"choices": SANDBOX_BACKENDS.names})
    limits: Limits = field(default_factory=Limits)  # per-cell limits, enforced by every backend
    workers: int = 2  # cells executing at once; more calls wait in the queue (one per core is right)
    queue_size: int = 1024  # calls allowed to wait for a worker; beyond it a call fails at once
    queue_timeout_s: float = 600.0  # a call that waited this long for a worker fails (sandbox_error)
    # Imported once by workers; also what the code can import besides the stdlib: the root holds
    # exactly these packages' distributions with their dependencies, on every backend (the Docker
    # image is built with the same list: `python -m sandbox.docker.build --packages ...`)
    preload: list[str] = field(default_factory=lambda: ["numpy", "sympy"])
    env: list[str] = field(default_factory=list)  # extra "KEY=VALUE" variables the code sees
    env_passthrough: list[str] = field(default_factory=list)  # host variable names copied in
    seccomp: bool = True  # local: a seccomp filter (needs libseccomp); False turns it off on purpose
    # Nothing weakens silently: the local backend refuses to start when libseccomp does not load
    # or (as root) per-session cgroups cannot be made, unless these allow it. Rootless mode (not
    # root) never has cgroups; it starts anyway, with a warning, and says what it does not enforce
    # in sandbox.info["not_enforced"] (see sandbox/README.md).
    allow_no_seccomp: bool = False
    allow_no_cgroups: bool = False
    spawn_timeout_s: float = 30.0  # a worker/container that is not ready by then is an infra failure
    # local: where the root file system tree is cached ("" = ~/.cache/stare-sandbox, or a private
    # directory in the temp dir); one tree per interpreter/packages/programs version, hard links
    rootfs_cache: str = ""
    # One settings section per registered backend that has settings, read and written as
    # sandbox.<its name> (sandbox.docker.*, sandbox.e2b.*, a plugin's backend's own), each at its
    # defaults unless set; `sandbox.docker` reads its section. The local backend's settings are the
    # fields above. Built directly: SandboxConfig(backends={"docker": DockerConfig(warm=0)}).
    backends: dict[str, Any] = field(default_factory=dict)

    SECTIONS: ClassVar[tuple[str, Registry]] = ("backends", SANDBOX_BACKENDS)

    def __post_init__(self) -> None:
        if isinstance(self.limits, dict):  # loaded from YAML
            self.limits = Limits(**self.limits)
        SANDBOX_BACKENDS.check(self.backend, "backend")
        self.backends = SANDBOX_BACKENDS.settings(self.backends)
        if self.workers < 1:
            raise ValueError(f"workers={self.workers!r}: must be >= 1")
        if self.queue_size < 0:
            raise ValueError(f"queue_size={self.queue_size!r}: must be >= 0")
        for name in ("queue_timeout_s", "spawn_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be > 0")
        for item in self.env:
            if "=" not in item:
                raise ValueError(f"env={item!r}: entries must be 'KEY=VALUE'")

    def __getattr__(self, name: str) -> Any:
        """A backend's settings section by its name (`sandbox.docker.image`)."""
        sections = self.__dict__.get("backends")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__} has no {name!r} (nor a sandbox backend's settings by that name)")

    def code_env(self, host_env: dict[str, str]) -> dict[str, str]:
        """The environment the code sees: a fixed minimal set plus what the config allows in."""
        env = {
            # the interpreter's own directory first (a virtualenv's bin): the same on every backend
            "PATH": f"{os.path.dirname(sys.executable)}:/usr/local/bin:/usr/bin:/bin",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONIOENCODING": "utf-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            # one thread per BLAS: many sessions share few cores, and threads count as processes
            "OPENBLAS_NUM_THREADS": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
        }
        env.update({k: host_env[k] for k in self.env_passthrough if k in host_env})
        env.update(item.split("=", 1) for item in self.env)
        return env
