"""e2b backend: cloud sandboxes through `e2b-code-interpreter`'s AsyncSandbox.

One cloud sandbox per session (its Jupyter kernel keeps the state); stateless sessions run every
cell in a fresh code context of that sandbox (fresh interpreter; the sandbox's files persist for
the session). Key and domain come from the config, else E2B_API_KEY / E2B_DOMAIN.

Mapping: logs.stdout/stderr -> stdout/stderr (the main result's text, as a notebook shows it, is
appended to stdout); `error` -> status error (MemoryError -> oom) with the traceback (ANSI codes
stripped) in stderr. Limits: wall time by our own clock (the service is known to enforce its own
at ~2x); output caps while streaming (the callbacks abort the request); memory, disk, processes
and network are whatever the e2b template enforces. After a timeout or an output overflow the
kernel may still be busy, so the session's sandbox is killed and the next cell gets a fresh one.
Transport errors: connection failures (the request never left) are retried `retries` times; an
error after the code may have started is retried only for stateless cells; what remains is
status=sandbox_error. Code timeouts are never retried.
"""

from __future__ import annotations

import asyncio
import os
import re
import time

from .base import SANDBOX_BACKENDS, ExecResult, ExecStatus, SandboxBase, SandboxError
from .config import E2BConfig, SandboxConfig
from .slots import Slots

ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class _OutputCap(Exception):
    pass


class E2BSession:
    def __init__(self, owner: E2BSandbox, stateless: bool):
        self.owner, self.cfg, self.stateless = owner, owner.cfg, stateless
        self.sbx = None
        self.lock = asyncio.Lock()
        self.closed = False

    async def _sandbox(self):
        if self.sbx is None:
            e2b = self.owner.sdk
            opts = {
                k: v
                for k, v in {
                    "api_key": self.cfg.e2b.api_key or None,
                    "domain": self.cfg.e2b.domain or None,
                    "sandbox_url": self.cfg.e2b.sandbox_url or None,
                    "debug": self.cfg.e2b.debug or None,
                    "request_timeout": self.cfg.e2b.request_timeout_s,
                }.items()
                if v is not None
            }
            if self.cfg.e2b.template:
                opts["template"] = self.cfg.e2b.template
            self.sbx = await self.owner.retry(
                lambda: e2b.AsyncSandbox.create(
                    timeout=self.cfg.e2b.sandbox_timeout_s, envs=self.cfg.code_env(dict(os.environ)), **opts
                ),
                safe=True,
            )
        return self.sbx

    async def _drop(self) -> None:
        sbx, self.sbx = self.sbx, None
        if sbx is not None:
            try:
                await asyncio.wait_for(sbx.kill(), self.cfg.e2b.request_timeout_s)
            except Exception:  # noqa: BLE001 - already gone; the service reaps it at its timeout
                pass

    async def run(self, code: str, timeout: float | None = None) -> ExecResult:
        t0 = time.monotonic()
        async with self.lock:
            if self.closed:
                return ExecResult.infra_failure("session is closed")
            try:
                async with self.owner.slots.slot():
                    return await self._run(code, self.owner.limits.wall_time(timeout), t0)
            except SandboxError as e:
                await self._drop()
                return ExecResult.infra_failure(str(e), time.monotonic() - t0)

    async def _run(self, code: str, wall: float, t0: float) -> ExecResult:
        cap = self.owner.limits.max_output_bytes
        out, err = [bytearray(), False], [bytearray(), False]

        def sink(buf):
            def take(msg) -> None:
                data = msg.line.encode("utf-8", "surrogatepass")
                room = cap - len(buf[0])
                buf[0] += data[:room]
                if len(data) > room:
                    buf[1] = True
                    raise _OutputCap()

            return take

        async def attempt():
            sbx = await self._sandbox()
            ctx = await sbx.create_code_context() if self.stateless else None
            try:
                return await asyncio.wait_for(
                    sbx.run_code(
                        code,
                        context=ctx,
                        on_stdout=sink(out),
                        on_stderr=sink(err),
                        timeout=wall,
                        request_timeout=self.cfg.e2b.request_timeout_s,
                    ),
                    wall,
                )
            finally:
                if ctx is not None and self.sbx is not None:
                    try:
                        await sbx.remove_code_context(ctx)
                    except Exception:  # noqa: BLE001 - the context dies with the sandbox anyway
                        pass

        status = None
        try:
            execution = await self.owner.retry(attempt, safe=self.stateless)
        except _OutputCap:
            status, execution = ExecStatus.OUTPUT_LIMIT, None
        except self.owner.timeouts as e:
            if time.monotonic() - t0 < 0.9 * wall:  # e.g. a 502 the SDK words as a timeout
                raise SandboxError(f"e2b: {type(e).__name__}: {e}") from None
            status, execution = ExecStatus.TIMEOUT, None
        if execution is None:
            await self._drop()  # the kernel may still be running it
        stdout = bytes(out[0]).decode("utf-8", "replace")
        stderr = bytes(err[0]).decode("utf-8", "replace")
        exit_code = 0
        if execution is not None:
            stdout += "".join(f"{r.text}\n" for r in execution.results if r.is_main_result and r.text)
            if execution.error is not None:
                e = execution.error
                stderr += ANSI.sub("", e.traceback or f"{e.name}: {e.value}")
                status = ExecStatus.OOM if e.name == "MemoryError" else ExecStatus.ERROR
                exit_code = 1
            else:
                status = ExecStatus.OK
        else:
            exit_code = None
        return ExecResult(
            status,
            exit_code,
            None,
            stdout[:cap],
            stderr[:cap],
            out[1],
            err[1],
            time.monotonic() - t0,
            "" if execution is not None else f"{status.value}: sandbox replaced",
        )

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.owner.sessions.discard(self)
            await self._drop()

    async def __aenter__(self) -> E2BSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


@SANDBOX_BACKENDS.register("e2b", config=E2BConfig)
class E2BSandbox(SandboxBase):
    def __init__(self, cfg: SandboxConfig | None = None):
        super().__init__()
        self.cfg = cfg or SandboxConfig(backend="e2b")
        self.limits = self.cfg.limits
        self.slots = Slots(self.cfg.workers, self.cfg.queue_size, self.cfg.queue_timeout_s)
        self.sessions: set[E2BSession] = set()
        self.sdk = None

    async def start(self) -> None:
        try:
            import e2b
            import e2b_code_interpreter
            import httpx
        except ImportError as e:
            raise SandboxError(f"e2b backend needs `pip install e2b-code-interpreter`: {e}") from None
        self.sdk = e2b_code_interpreter
        self.timeouts = (asyncio.TimeoutError, e2b.TimeoutException)
        self.connect_errors = (httpx.ConnectError, httpx.ConnectTimeout, e2b.RateLimitException)
        self.transport_errors = (httpx.TransportError, e2b.SandboxException)
        self.info = {
            "backend": "e2b",
            "not_enforced": ["memory, disk, processes and network limits are the e2b template's, not ours"],
        }

    async def retry(self, fn, safe: bool):
        """Run fn; retry transport errors (connect-phase always, others only when `safe`)."""
        last = None
        for i in range(self.cfg.e2b.retries + 1):
            try:
                return await fn()
            except self.timeouts:
                raise  # a code timeout: never re-run it
            except self.connect_errors as e:
                last = e
            except self.transport_errors as e:
                if not safe:
                    raise SandboxError(f"e2b transport error: {type(e).__name__}: {e}") from None
                last = e
            except _OutputCap:
                raise
            except Exception as e:  # noqa: BLE001 - auth, bad config, SDK bugs: infrastructure
                raise SandboxError(f"e2b: {type(e).__name__}: {e}") from None
            await asyncio.sleep(min(2.0, 0.1 * 2**i))
        raise SandboxError(f"e2b unreachable after {self.cfg.e2b.retries + 1} attempts: {type(last).__name__}: {last}")

    def session(self, stateless: bool = False) -> E2BSession:
        s = E2BSession(self, stateless)
        self.sessions.add(s)
        return s

    async def close(self) -> None:
        await asyncio.gather(*(s.close() for s in list(self.sessions)), return_exceptions=True)
