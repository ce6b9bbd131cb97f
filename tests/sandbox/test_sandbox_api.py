"""The public surface: config validation, light import, result types, backend selection."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from sandbox import SANDBOX_BACKENDS, ExecResult, ExecStatus, Limits, SandboxConfig, make_sandbox
from sandbox.local._proto import Frames, pack


def test_import_is_light():
    code = (
        "import sys, time; t = time.perf_counter(); import sandbox; dt = time.perf_counter() - t\n"
        "heavy = [m for m in ('numpy', 'sympy', 'torch', 'transformers', 'docker', 'e2b', 'httpx') if m in sys.modules]\n"
        "print(heavy, dt < 2.0)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out == "[] True\n"


def test_limits_validate_and_timeouts_only_shorten():
    with pytest.raises(ValueError, match=r"wall_time_s=0: must be > 0"):
        Limits(wall_time_s=0)
    lim = Limits(wall_time_s=5)
    assert [lim.wall_time(t) for t in (None, 1, 100, 0, -3)] == [5, 1, 5, 5, 5]


def test_config_validates_and_loads_from_dicts():
    with pytest.raises(ValueError, match="workers=0"):
        SandboxConfig(workers=0)
    names = ", ".join(SANDBOX_BACKENDS.names())
    with pytest.raises(ValueError, match=f"^backend='gpu': unknown sandbox backend; choose one of {names}$"):
        SandboxConfig(backend="gpu")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        SandboxConfig(env=["NOEQ"])
    cfg = SandboxConfig(limits={"wall_time_s": 2}, backends={"docker": {"warm": 0}, "e2b": {"retries": 0}})
    assert cfg.limits == Limits(wall_time_s=2) and cfg.docker.warm == 0 and cfg.e2b.retries == 0


def test_code_environment_is_an_allow_list():
    cfg = SandboxConfig(env=["A=1=2"], env_passthrough=["KEEP"])
    env = cfg.code_env({"KEEP": "k", "AWS_SECRET_ACCESS_KEY": "x", "HOME": "/root"})
    assert env["A"] == "1=2" and env["KEEP"] == "k" and env["HOME"] == "/tmp" and "AWS_SECRET_ACCESS_KEY" not in env


def test_reading_the_backend_names_imports_no_sdk():
    """The config checks its backend against the registry, which imports every backend's module:
    those must not import the Docker or e2b SDKs (or numpy) until a sandbox starts."""
    code = (
        "import sys, sandbox\nprint(sandbox.SANDBOX_BACKENDS.names(), sandbox.SandboxConfig(backend='docker').backend)\n"
        "print([m for m in ('numpy', 'docker', 'e2b', 'e2b_code_interpreter', 'httpx', 'importlib.metadata') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    names, modules = out.splitlines()
    assert names == f"{SANDBOX_BACKENDS.names()} docker" and modules == "[]", out


def test_a_backend_is_one_class_and_one_registered_name():
    """A new backend: a class keeping the Sandbox protocol, registered under its name; config
    validation and make_sandbox find it with nothing else to edit."""
    from sandbox import SANDBOX_BACKENDS, Sandbox, SandboxBase

    class Echo(SandboxBase):
        def __init__(self, cfg: SandboxConfig):
            super().__init__()
            self.cfg = cfg

        async def start(self) -> None:
            self.info = {"backend": "echo", "not_enforced": ["everything"]}

        def session(self, stateless: bool = False):
            box = self

            class _S:
                async def run(self, code, timeout=None):
                    return ExecResult(ExecStatus.OK, 0, None, code, "", False, False, 0.0)

                async def close(self):
                    pass

                async def __aenter__(self):
                    return self

                async def __aexit__(self, *exc):
                    box.stats["closed"] = box.stats.get("closed", 0) + 1

            return _S()

        async def close(self) -> None:
            pass

    async def use(sb: Sandbox) -> tuple[str, dict, dict]:
        async with sb:
            r = await sb.run("hello")  # SandboxBase's default: one cell in a stateless session
            return r.stdout, sb.info, sb.stats

    with SANDBOX_BACKENDS.temporarily("echo", Echo):
        sb = make_sandbox(SandboxConfig(backend="echo"))
        assert isinstance(sb, Sandbox)
        assert asyncio.run(use(sb)) == ("hello", {"backend": "echo", "not_enforced": ["everything"]}, {"closed": 1})
    with pytest.raises(ValueError, match="unknown sandbox backend"):
        SandboxConfig(backend="echo")


@pytest.mark.parametrize("name", SANDBOX_BACKENDS.names())
def test_every_registered_backend_keeps_the_protocol(name):
    """Each entry, whatever registered it: a SandboxBase built (not started) from a SandboxConfig
    that selects it, keeping the Sandbox protocol, its settings (if any) a dataclass that is
    `sandbox.<name>`. Nothing is started: no engine, no cloud."""
    import dataclasses

    from sandbox import Sandbox, SandboxBase

    entry = SANDBOX_BACKENDS.entry(name)
    assert issubclass(entry.obj, SandboxBase)
    cfg = SandboxConfig(backend=name)
    sb = make_sandbox(cfg)
    assert isinstance(sb, entry.obj) and isinstance(sb, Sandbox) and sb.info == {} and isinstance(sb.stats, dict)
    for m in ("start", "session", "close"):
        assert m in {k for c in type(sb).__mro__[:-1] if c is not SandboxBase for k in vars(c)}, (name, m)
    if entry.config is not None:
        assert dataclasses.is_dataclass(entry.config) and isinstance(getattr(cfg, name), entry.config)


def test_result_helpers():
    r = ExecResult.infra_failure("engine down", 0.5)
    assert r.status == ExecStatus.SANDBOX_ERROR == "sandbox_error" and r.error == "engine down" and not r.ok


def test_protocol_rejects_oversized_or_malformed_frames():
    assert Frames().feed(pack({"op": "done"}, b"xy")) == [({"op": "done"}, b"xy")]
    with pytest.raises(ValueError):
        Frames().feed(b"\xff\xff\xff\xff\x00\x00\x00\x00")  # a 4 GB header
    with pytest.raises(ValueError):
        Frames().feed(pack([1, 2]))  # not an object
