"""Log lines reach the stderr of the test that is running.

loguru's default sink is the stderr object of import time; under pytest that is a capture stream
an earlier test may have closed, and in-process runs of the entry points log (start-up checks,
data loading) before their one-line error. A sink that looks sys.stderr up at each write goes to
the current test's capture instead, and file sinks a test's run added do not outlive it.
"""

from __future__ import annotations

import sys

import pytest
from loguru import logger


@pytest.fixture(autouse=True)
def loguru_to_current_stderr():
    logger.remove()
    logger.add(lambda message: sys.stderr.write(message), level="DEBUG")
    yield
    logger.remove()
    logger.add(lambda message: sys.stderr.write(message), level="DEBUG")
