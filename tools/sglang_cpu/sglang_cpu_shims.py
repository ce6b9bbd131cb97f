"""Import-time shims that let the real SGLang server start on a CPU-only machine (tests only).

Imported at interpreter start by the `.pth` file that `make sglang-cpu` writes into
.venv-sglang's site-packages (so SGLang's scheduler and detokenizer subprocesses get it too);
no installed file is edited.

torchvision: the PyPI torchvision wheel is a CUDA build. Its `__init__` imports
`torchvision._meta_registrations` (and `_autograd_registrations`), which register fake kernels
for its compiled ops; next to the CPU torch those ops cannot load and the registration raises,
so `import torchvision` dies. SGLang only uses `torchvision.transforms` (image preprocessing for
multimodal models, imported unconditionally), which needs neither module. Empty modules under
those names in `sys.modules` make the package import; calling a compiled torchvision op still
fails loudly inside torchvision.

sgl_kernel: see the stand-in package beside this file.
"""

from __future__ import annotations

import sys
import types

# Submodules whose only job is registering kernels of torchvision's compiled (CUDA) library.
_TORCHVISION_REGISTRATIONS = ("torchvision._meta_registrations", "torchvision._autograd_registrations")


def install() -> None:
    for name in _TORCHVISION_REGISTRATIONS:
        if name not in sys.modules:
            module = types.ModuleType(
                name,
                "left empty: the CPU SGLang test venv cannot load torchvision's compiled ops (see sglang_cpu_shims)",
            )
            sys.modules[name] = module


install()
