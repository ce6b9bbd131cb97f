"""The bounded queue in front of a sandbox's workers, shared by every backend."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from .base import SandboxError


class Slots:
    """At most `workers` cells run at once; at most `queue_size` calls wait, each for at most
    `timeout_s`. A full queue or a long wait is an infrastructure failure with a clear message."""

    def __init__(self, workers: int, queue_size: int, timeout_s: float):
        self.workers, self.queue_size, self.timeout_s = workers, queue_size, timeout_s
        self.free, self.waiting = workers, 0
        self.waiters: deque[asyncio.Future] = deque()

    @contextlib.asynccontextmanager
    async def slot(self):
        if self.free == 0:
            if self.waiting >= self.queue_size:
                raise SandboxError(
                    f"sandbox queue full: {self.waiting} calls already wait for "
                    f"{self.workers} workers (raise workers or queue_size)"
                )
            fut = asyncio.get_running_loop().create_future()
            self.waiters.append(fut)
            self.waiting += 1
            try:
                await asyncio.wait_for(fut, self.timeout_s)  # resolved with the slot handed over
            except asyncio.TimeoutError:
                if fut.done() and not fut.cancelled():
                    self._release()  # handed over just as we gave up: pass it on
                raise SandboxError(f"no sandbox worker became free within {self.timeout_s:g}s") from None
            except asyncio.CancelledError:
                if fut.done() and not fut.cancelled():
                    self._release()  # the slot arrived as we were cancelled: pass it on
                raise
            finally:
                self.waiting -= 1
        else:
            self.free -= 1
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        while self.waiters:
            fut = self.waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return
        self.free += 1
