"""Synchronous wrapper for scripts and tests: an event loop in a background thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncContextManager, Coroutine

from .base import ExecResult, Sandbox, Session


class SyncSession:
    def __init__(self, owner: SyncSandbox, session: AsyncContextManager[Session]):
        self.owner, self.session = owner, session  # a backend's session object (it is its own context)

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        return self.owner._call(self.session.run(code, timeout))

    def close(self) -> None:
        self.owner._call(self.session.close())

    def __enter__(self) -> SyncSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SyncSandbox:
    """`with SyncSandbox(cfg) as sb: sb.run("print(1)")` - the async API, blocking."""

    def __init__(self, cfg: Any = None):
        from . import make_sandbox
        from .config import SandboxConfig

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sandbox-loop", daemon=True)
        self.thread.start()
        self.sandbox: Sandbox = make_sandbox(cfg or SandboxConfig())
        try:
            self._call(self.sandbox.__aenter__())
        except BaseException:
            self._stop()
            raise

    def _call(self, coro: Coroutine) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def run(self, code: str, timeout: float | None = None) -> ExecResult:
        return self._call(self.sandbox.run(code, timeout))

    def session(self, stateless: bool = False) -> SyncSession:
        return SyncSession(self, self.sandbox.session(stateless=stateless))

    def close(self) -> None:
        if self.thread.is_alive():
            try:
                self._call(self.sandbox.close())
            finally:
                self._stop()

    def _stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()

    def __enter__(self) -> SyncSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
