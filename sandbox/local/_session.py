"""The public Session over worker processes (the local backend's, and the Docker backend's: the
same worker runs in its containers)."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

from ..base import ExecResult, ExecStatus, Limits, SandboxError
from ..slots import Slots
from ._client import TAMPERED, Proc


class ProcSession:
    """A Session over worker processes: stateful (one interpreter for all cells) or stateless.
    An interpreter that died (timeout, crash, os._exit) is replaced at the next cell, with fresh
    state; every internal failure becomes a sandbox_error result here, at one boundary."""

    def __init__(
        self,
        spawn: Callable[[], Awaitable[Proc]],
        slots: Slots,
        limits: Limits,
        stateless: bool = False,
        on_close: Callable[[], Awaitable[None]] | None = None,
    ):
        self.spawn, self.slots, self.limits, self.stateless = spawn, slots, limits, stateless
        self.on_close = on_close
        self.proc: Proc | None = None
        self.lock = asyncio.Lock()
        self.closed = False

    async def run(self, code: str, timeout: float | None = None) -> ExecResult:
        t0 = time.monotonic()
        async with self.lock:
            if self.closed:
                return ExecResult.infra_failure("session is closed")
            try:
                async with self.slots.slot():
                    if self.proc is not None:
                        self.proc.client.poll()  # a worker that died with the session is known first
                    state = "dead" if self.proc is None else self.proc.idle_state()
                    if state == "tampered":  # it wrote into its channel after its last reply
                        self.proc.client.stats["tampered"] += 1
                        await self._drop()
                        return ExecResult.cell_failure(TAMPERED + " after its previous cell", time.monotonic() - t0)
                    if state == "dead" and self.proc is not None and not (self.proc.restarted or self.proc.client.dead):
                        # it ended after its last reply although it was stopped: that cell's doing
                        # (e.g. it closed the control socket). Failed code, never sandbox_error.
                        self.proc.client.stats["died_between_cells"] += 1
                        await self._drop()
                        return ExecResult.cell_failure(
                            "the session's interpreter ended after its previous cell returned; "
                            "this cell did not run, the next one gets a fresh interpreter",
                            time.monotonic() - t0,
                        )
                    lost = self.proc.client.dead if state == "dead" and self.proc is not None else None
                    if state == "dead":  # replaced, with fresh state (like a notebook kernel restart)
                        await self._drop()
                        self.proc = await self.spawn()
                    res = await self._run_cell(code, timeout)
                    if res is None or (res.status == ExecStatus.SANDBOX_ERROR and not self.proc.cell_started):
                        # The worker had died between cells, but its end was not read yet when this
                        # cell came: the cell never started (its session stayed stopped). It runs on
                        # a fresh worker, as it would have had the loss been seen first.
                        lost = lost or self.proc.client.dead or "the sandbox worker exited"
                        await self._drop()
                        self.proc = await self.spawn()
                        res = await self._run_cell(code, timeout)
                        if res is None:
                            return ExecResult.infra_failure(
                                f"the sandbox worker was lost twice before the cell could start ({lost})",
                                time.monotonic() - t0,
                            )
                    if lost:  # never silent: the caller learns that its earlier state is gone
                        note = (
                            f"the sandbox worker was lost since the previous cell ({lost}): this cell ran in "
                            "a fresh interpreter, the session's earlier state is gone"
                        )
                        res.error = f"{res.error} {note}".strip()
                    if not self.proc.alive:
                        await self._drop()
                    elif self.stateless:  # teardown (~5 ms of kernel work) need not delay the result
                        self._abandon()
                    return res
            except asyncio.CancelledError:
                self._abandon()
                raise
            except Exception as e:  # noqa: BLE001 - the boundary: infrastructure failures become results
                self._abandon()
                msg = str(e) if isinstance(e, SandboxError) else f"internal error: {type(e).__name__}: {e}"
                return ExecResult.infra_failure(msg, time.monotonic() - t0)

    async def _run_cell(self, code: str, timeout: float | None) -> ExecResult | None:
        """Run the cell on the current interpreter; None if it could not start because the worker
        was already gone (anything else is raised)."""
        try:
            return await self.proc.run_cell(
                code, self.limits.wall_time(timeout), self.limits.max_output_bytes, park=not self.stateless
            )
        except SandboxError:
            if self.proc.cell_started or not self.proc.client.dead:
                raise
            return None

    def _abandon(self) -> None:
        if self.proc is not None:
            self.proc.client.kill(self.proc.sid)
            self.proc._close_ctl()
            self.proc = None

    async def _drop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            await proc.kill()

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            await self._drop()
        except SandboxError:
            pass
        finally:
            if self.on_close is not None:
                await self.on_close()

    async def __aenter__(self) -> ProcSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
