"""scripts/gpu_check.py: its --help, and its CPU dry run (the same code paths as on a GPU)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu_check.py"


def test_help_documents_every_flag_without_importing_torch():
    res = subprocess.run(
        [sys.executable, "-X", "importtime", str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr[-2000:]
    for flag in (
        "--device",
        "--tiny",
        "--seqs",
        "--prompt-len",
        "--response-len",
        "--micro-batch-tokens",
        "--steps",
        "--stages",
        "--decode-batch",
        "--decode-tokens",
        "--peak-tflops",
        "--wheel-dir",
        "--skip-decode",
        "--skip-nonfinite",
        "--skip-untied",
        "--skip-sync",
        "--skip-learner",
        "--layers",
        "--tp",
        "--bucket-mb",
    ):
        assert flag in res.stdout
    assert "pip wheel --no-deps" in res.stdout  # says which wheels to bring
    assert " torch" not in res.stderr.replace("torch_", "")  # -X importtime lists imports on stderr


def test_on_a_machine_without_a_gpu_it_fails_fast_with_one_line():
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    took = time.perf_counter() - t0
    if Path("/dev/nvidia0").exists():
        pytest.skip("this machine has a GPU")
    assert res.returncode == 2 and took < 10, (took, res.stderr[-2000:])
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert len(lines) == 1 and "needs an NVIDIA GPU" in lines[0] and "--device cpu --tiny" in lines[0]


def test_bad_flag_values_are_refused_with_the_flag_named():
    res = subprocess.run([sys.executable, str(SCRIPT), "--stages", "0,5"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--stages" in res.stderr and "0, 1, 2 or 3" in res.stderr


@pytest.mark.slow
def test_cpu_dry_run_prints_the_result_line():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    t0 = time.perf_counter()
    res = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--tiny", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("RESULT "), out[-4000:]
    fields = dict(kv.split("=", 1) for kv in last.split()[1:])
    assert fields["deepspeed"] == "1" and fields["nonfinite_skip"] == "pass"
    assert fields["sync_bit_exact"] == "pass"  # the weight-sync half ran first (CPU tensors)
    for stage in range(4):  # every stage measured, its skip checked on fp32 masters + Adam state
        assert float(fields[f"zero{stage}_tok_s"]) > 0 and fields[f"nonfinite_zero{stage}"] == "pass", stage
    assert float(fields["decode_tok_s"]) > 0
    # the untied shape with gradient checkpointing ran and matched the step without it
    assert fields["untied_gc_matches"] == "pass" and float(fields["untied_gc_tok_s"]) > 0
    assert "untied 7B-like" in res.stdout
    print(f"dry run: {time.perf_counter() - t0:.1f} s")


# Runs the script as on a GPU machine without DeepSpeed: `import deepspeed` finds nothing and its
# distribution hidden from importlib.metadata. A finder that raises instead is not such a machine:
# transformers and accelerate decide that DeepSpeed is installed from its distribution metadata
# and then import it, which fails half-way (model classes become unimportable).
_WITHOUT_DEEPSPEED = """
import importlib.metadata as md, runpy, sys
class Hide:  # every finder finds no deepspeed: find_spec is None, an import raises ModuleNotFoundError
    def __init__(self, finder):
        self.finder = finder
    def find_spec(self, name, path=None, target=None):
        if name == "deepspeed" or name.startswith("deepspeed."):
            return None
        return self.finder.find_spec(name, path, target)
    def __getattr__(self, attr):
        return getattr(self.finder, attr)
sys.meta_path[:] = [Hide(f) if hasattr(f, "find_spec") else f for f in sys.meta_path]
_from_name = md.Distribution.from_name.__func__
def from_name(cls, name):
    if name.lower().replace("_", "-") == "deepspeed":
        raise md.PackageNotFoundError(name)
    return _from_name(cls, name)
md.Distribution.from_name = classmethod(from_name)
_distributions = md.distributions
md.distributions = lambda **kw: (d for d in _distributions(**kw) if (d.metadata["Name"] or "").lower() != "deepspeed")
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.slow
def test_without_deepspeed_zero0_runs_on_plain_torch_and_the_rest_says_why():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [
            sys.executable,
            "-c",
            _WITHOUT_DEEPSPEED,
            str(SCRIPT),
            "--device",
            "cpu",
            "--tiny",
            "--steps",
            "1",
            "--skip-decode",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert "pip wheel --no-deps --no-build-isolation -w wheels deepspeed==" in res.stdout
    assert "ZeRO-0 (plain torch, no DeepSpeed)" in res.stdout
    fields = dict(kv.split("=", 1) for kv in res.stdout.strip().splitlines()[-1].split()[1:])
    assert fields["deepspeed"] == "0" and float(fields["zero0_tok_s"]) > 0
    assert fields["zero3_tok_s"] == "skipped" and fields["nonfinite_skip"] == "not_run_no_deepspeed"
    assert "untied_gc_matches" not in fields  # needs DeepSpeed (ZeRO-3)
