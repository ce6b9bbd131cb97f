"""Rollout backends are found by name in one registry, and their contract is one Protocol."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from stare_tir.components import make_backend
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS, Backend, BackendBase
from stare_tir.rollout.backends.sglang import SGLangEngineBackend
from stare_tir.rollout.engine import RolloutConfig
from stare_tir.train_config import TrainerConfig

ROOT = Path(__file__).resolve().parents[2]


class EchoBackend(BackendBase):
    """A throwaway backend: registered at run time, built by make_backend without an if-branch."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path

    @classmethod
    def from_config(cls, model_path, tokenizer, rollout, trust_remote_code=False):
        return cls(model_path)

    async def generate(self, prompt_ids, sampling, stop):
        raise NotImplementedError

    def update_weights(self, named_tensors, version=None): ...

    def update_weights_from_disk(self, path): ...


@pytest.mark.parametrize("name", ROLLOUT_BACKENDS.names())
def test_every_registered_backend_conforms(name):
    """Each entry, whatever registered it: a BackendBase with every Protocol member, its settings a
    dataclass constructible at its defaults that is `rollout.<name>`, and a `check_config` that
    accepts the default settings or refuses them with one ValueError naming the key. No model is
    loaded and no server started."""
    import dataclasses

    entry = ROLLOUT_BACKENDS.entry(name)
    cls = entry.obj
    assert issubclass(cls, BackendBase) and entry.module.startswith(cls.__module__.split(".")[0])
    required = ("generate", "update_weights", "update_weights_from_disk")
    declared = set(Backend.__annotations__) | {m for m in vars(Backend) if not m.startswith("_")}
    for m in sorted(declared):
        assert hasattr(cls, m), f"{name}: {cls.__name__} lacks {m}"
    for m in required:
        assert inspect.isfunction(getattr(cls, m)), f"{name}: {cls.__name__}.{m} is not its own"
    assert inspect.iscoroutinefunction(cls.generate)
    assert "from_config" in vars(cls), f"{name}: {cls.__name__} does not say how it is built from a run's settings"
    if entry.config is not None:
        assert dataclasses.is_dataclass(entry.config)
        rollout = RolloutConfig()
        assert isinstance(getattr(rollout, name), entry.config) and isinstance(entry.config(), entry.config)
    try:
        cls.check_config(RolloutConfig(), "trainer.backend")
    except ValueError as e:
        assert "\n" not in str(e) and f"={name}" in str(e) or f"rollout.{name}" in str(e), str(e)


def test_a_backend_registered_at_run_time_is_selectable_by_config_and_built_by_name():
    names = ", ".join(ROLLOUT_BACKENDS.names())
    with pytest.raises(ValueError, match=f"^backend='echo': unknown rollout backend; choose one of {names}$"):
        TrainerConfig(backend="echo")
    with ROLLOUT_BACKENDS.temporarily("echo", EchoBackend):
        assert TrainerConfig(backend="echo").backend == "echo"
        built = make_backend("echo", "some/model", None, RolloutConfig())
        assert isinstance(built, EchoBackend) and built.model_path == "some/model"
    assert "echo" not in ROLLOUT_BACKENDS


def test_sglang_without_urls_is_refused_by_its_own_class_check():
    with pytest.raises(ValueError, match=r"backend=sglang needs rollout.sglang.urls"):
        make_backend("sglang", "m", None, RolloutConfig())


@pytest.mark.parametrize("cls", [SGLangEngineBackend, BackendBase])
def test_the_unregistered_backends_have_every_member_of_the_protocol_too(cls):
    """What the trainer and engine call is declared once (Backend) and present on every backend,
    so no caller probes with getattr/hasattr (the registered ones: the conformance test above)."""
    required = ("generate", "update_weights", "update_weights_from_disk")
    declared = set(Backend.__annotations__) | {m for m in vars(Backend) if not m.startswith("_")}
    members = sorted(declared - set(required))
    assert {"shared_by_ranks", "colocated", "take_route_stats", "aclose", "allow_in_flight_updates"} <= set(members)
    for m in members:
        assert hasattr(cls, m), f"{cls.__name__} lacks {m}"
    if cls is not BackendBase:
        for m in required:
            assert inspect.isfunction(getattr(cls, m)), f"{cls.__name__}.{m}"


def test_no_attribute_probes_of_the_backend_in_the_trainer_or_engine():
    files = [*sorted((ROOT / "stare_tir" / "trainer").glob("*.py")), ROOT / "stare_tir" / "rollout" / "engine.py"]
    for path in files:
        for line in path.read_text().splitlines():
            if "backend" in line:
                assert "getattr(" not in line and "hasattr(" not in line, f"{path.name}: {line.strip()}"


def test_backend_names_in_help_come_from_the_registry_without_torch():
    code = (
        "import sys; from stare_tir.app.cli import *; from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS; "
        "from stare_tir.app.command_line import config_keys; from stare_tir.train_config import TrainConfig; "
        "line = next(k for k in config_keys(TrainConfig) if k.startswith('  trainer.backend=')); "
        "print(all(n in line for n in ROLLOUT_BACKENDS.names()), 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "True False"
