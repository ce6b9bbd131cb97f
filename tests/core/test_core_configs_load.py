"""Every YAML in configs/ loads and validates against its schema; --help stays light."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from stare_tir.config import ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def schema_for(path: Path):
    if path.name.startswith("eval"):
        from stare_tir.eval.command import EvalRunConfig

        return EvalRunConfig
    from stare_tir.train_config import TrainConfig

    return TrainConfig


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_file_loads(path):
    cfg = load_config(schema_for(path), path)
    assert cfg is not None


def test_gpu_configs_hold_the_paper_settings():
    from stare_tir.train_config import TrainConfig

    stare = load_config(TrainConfig, ROOT / "configs" / "retool_qwen2.5_7b_stare.yaml")
    grpo = load_config(TrainConfig, ROOT / "configs" / "retool_qwen2.5_7b_grpo_ds.yaml")
    assert stare.algo.name == "stare" and grpo.algo.name == "grpo_ds"
    assert (stare.algo.stare.variant, stare.algo.stare.top_p, stare.algo.stare.w, stare.algo.stare.target_entropy) == (
        "O1",
        0.1,
        1.1,
        0.3,
    )
    for cfg in (stare, grpo):
        assert (cfg.algo.clip_low, cfg.algo.clip_high, cfg.learner.lr) == (0.2, 0.28, 1e-6)
        assert cfg.learner.zero_stage == 3 and cfg.learner.dtype == "bf16"
        assert cfg.rollout.n_per_prompt == 8 and cfg.trainer.backend == "sglang"
        assert cfg.data.train == "dapo17k"


def test_bad_override_of_train_config_names_the_key():
    from stare_tir.train_config import TrainConfig

    with pytest.raises(ConfigError, match=r"unknown key 'algo.stare.targt_entropy'"):
        load_config(TrainConfig, ROOT / "configs" / "tiny_cpu.yaml", ["algo.stare.targt_entropy=0.2"])
    with pytest.raises(ConfigError, match=r"algo.name='ppo': one of grpo, grpo_ds, stare, dapo, justrl, kl_cov"):
        load_config(TrainConfig, None, ["algo.name=ppo"])


def test_train_script_help_is_light_and_explains_flags():
    script = str(ROOT / "scripts" / "train_tir.py")
    code = (
        "import sys, runpy; sys.argv=['train_tir.py','--help'];\n"
        f"try:\n    runpy.run_path({script!r}, run_name='__main__')\n"
        "except SystemExit: pass\n"
        "print('HEAVY' if {'torch','transformers','deepspeed'} & set(sys.modules) else 'LIGHT')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert "--resume" in out and "KEY=VALUE" in out and "--print-config" in out
    assert out.strip().endswith("LIGHT")


def test_train_script_rejects_bad_key_with_exit_2():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "train_tir.py"), "trainer.stepz=3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "unknown key 'trainer.stepz'" in proc.stderr


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_config_file_names_its_base(path):
    """A YAML without `base:` is layered over configs/tiny_cpu.yaml: a complete config (a GPU
    recipe, an eval config) would silently take tiny-model values for the keys it leaves out."""
    import yaml

    data = yaml.safe_load(path.read_text()) or {}
    assert "base" in data, (
        f"{path.name}: add a top-level `base: null` (it stands on the schema's defaults) or "
        "`base: tiny_cpu.yaml` (it changes the CPU default), see README 'One command-line convention'"
    )
