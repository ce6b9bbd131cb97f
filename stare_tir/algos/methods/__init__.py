"""The registered token methods, one per module (the registry `TOKEN_METHODS` of
stare_tir/algos/token_methods.py lists them in `METHOD_MODULES` and loads them on first lookup).

Importing any of them imports them all, in that order, so the names are listed the same way however
the first one was reached.
"""

from __future__ import annotations

import importlib

from stare_tir.algos.token_methods import METHOD_MODULES

for _module in METHOD_MODULES:
    importlib.import_module(_module)
