"""`stare-env`: the versions and devices a bug report needs, one `name: value` line each.

Reads installed package metadata (no import of the heavy packages, except torch for its build and
devices when it is installed), so it runs even where the training stack is broken.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata

PACKAGES = (
    "stare-tir",
    "torch",
    "deepspeed",
    "transformers",
    "tokenizers",
    "accelerate",
    "sglang",
    "sglang-router",
    "math-verify",
    "sympy",
    "datasets",
    "huggingface-hub",
    "e2b-code-interpreter",
    "docker",
    "wandb",
    "tensorboard",
)


def _version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def report() -> list[tuple[str, str]]:
    """(name, value) pairs: Python, the platform, package versions, torch's build and its devices."""
    rows = [
        ("python", sys.version.split()[0] + f" ({sys.executable})"),
        ("platform", platform.platform()),
        ("cpus", str(os.cpu_count())),
    ]
    rows += [(name, _version(name)) for name in PACKAGES]
    try:
        import torch
    except ImportError:
        return rows
    rows.append(("torch build", f"cuda {torch.version.cuda or 'none'}, threads {torch.get_num_threads()}"))
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            rows.append(
                (
                    f"cuda:{i}",
                    f"{props.name}, {props.total_memory / 2**30:.0f} GiB, bf16 {torch.cuda.is_bf16_supported()}",
                )
            )
        rows.append(("nccl", ".".join(map(str, torch.cuda.nccl.version()))))
    else:
        rows.append(("cuda", "no GPU visible (CPU run: fp32, gloo)"))
    for var in ("CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE", "HF_ENDPOINT", "OMP_NUM_THREADS", "SLURM_JOB_ID"):
        if os.environ.get(var):
            rows.append((var, os.environ[var]))
    return rows


def main(argv: list[str] | None = None) -> int:
    import argparse

    argparse.ArgumentParser(prog="stare-env", description=__doc__.split("\n\n")[0]).parse_args(argv)
    rows = report()
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
