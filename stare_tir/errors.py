"""The errors a user can fix, shared by every stage: one low module, so that the stages (sft, eval)
raise them without importing the application layer (`stare_tir.app`) above them.

The console entry points (`stare_tir.app.cli`) print such an error's message alone, one line per
problem, with exit status 2 (`--debug` shows the traceback instead).
"""

from __future__ import annotations


class StartupError(RuntimeError):
    """A setting that cannot work, found before the run started; the message says how to fix it."""
