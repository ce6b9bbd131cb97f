"""Host side of the worker protocol, shared by the local and docker backends.

`WorkerClient` talks to one fork server; `Proc` is one session interpreter it started. Everything
here is callback-driven on the event loop, so a trivial cell costs two small writes and two wake-ups.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import os
import signal
import socket
import time
from collections import deque

from ..base import ExecResult, ExecStatus, SandboxError, killed_status
from ._proto import Frames, pack


class WorkerClient:
    """One connection to a fork server: spawn session interpreters, kill them, learn their end."""

    def __init__(self, sock: socket.socket, name: str, stats: dict[str, int] | None = None):
        self.sock, self.name = sock, name
        self.stats = stats if stats is not None else new_stats()  # shared with the sandbox, which reports it
        self.loop = asyncio.get_running_loop()
        self.frames, self.procs, self.next_sid = Frames(), {}, 1
        self.parks: dict[int, asyncio.Future] = {}  # sid -> the worker's answer to "park"
        self.resumes: dict[int, asyncio.Future] = {}  # sid -> the worker's answer to "resume"
        self.hello: asyncio.Future = self.loop.create_future()
        self.dead: str | None = None
        sock.setblocking(False)
        self.loop.add_reader(sock.fileno(), self._on_readable)

    async def ready(self, timeout: float) -> dict:
        try:
            hello = await asyncio.wait_for(asyncio.shield(self.hello), timeout)
        except asyncio.TimeoutError:
            raise SandboxError(f"{self.name}: not ready after {timeout:g}s") from None
        if hello.get("op") != "ready":
            raise SandboxError(f"{self.name}: {hello.get('error', hello)}")
        return hello

    def _on_readable(self) -> bool:
        """Take what the worker sent; False once nothing more is there (or it is gone)."""
        try:
            data = self.sock.recv(1 << 16)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            self._lost(f"{self.name} exited")
            return False
        for msg, _ in self.frames.feed(data):
            op = msg.get("op")
            if op in ("ready", "fatal") and not self.hello.done():
                self.hello.set_result(msg)
            elif op == "exit" and msg.get("sid") in self.procs:
                self.procs.pop(msg["sid"])._exited(msg.get("status"), bool(msg.get("oom")))
            elif op == "parked" and msg.get("sid") in self.parks:
                fut = self.parks.pop(msg["sid"])
                if not fut.done():
                    fut.set_result(msg)
            elif op == "resumed" and msg.get("sid") in self.resumes:
                fut = self.resumes.pop(msg["sid"])
                if not fut.done():
                    fut.set_result(msg)
        return True

    def poll(self) -> None:
        """Read what the worker already sent, its end included, now rather than when the loop
        gets to it: a session found dead between cells then counts as lost with its worker."""
        while not self.dead and self._on_readable():
            pass

    def _lost(self, reason: str) -> None:
        if self.dead:
            return
        self.dead = reason
        self.loop.remove_reader(self.sock.fileno())
        if not self.hello.done():
            self.hello.set_result({"op": "fatal", "error": reason})
        for proc in self.procs.values():
            proc._exited(None, False)  # unknown: the worker that knew is gone
        self.procs.clear()
        for fut in (*self.parks.values(), *self.resumes.values()):
            if not fut.done():
                fut.set_result(None)
        self.parks.clear()
        self.resumes.clear()

    def _send(self, obj: dict, fds: tuple = ()) -> None:
        data = pack(obj)
        try:  # tiny messages into an almost empty buffer: a partial write means the worker is stuck
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            if self.sock.sendmsg([data], anc) != len(data):
                raise OSError("short write")
        except OSError as e:
            self._lost(f"{self.name}: {e}")
            raise SandboxError(f"{self.name} unreachable: {e}") from None

    async def spawn(self, timeout: float) -> Proc:
        if self.dead:
            raise SandboxError(f"{self.name} is gone: {self.dead}")
        sid, self.next_sid = self.next_sid, self.next_sid + 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        proc = self.procs[sid] = Proc(self, sid, ours)
        try:
            self._send({"op": "spawn", "sid": sid}, (theirs.fileno(),))
        finally:
            theirs.close()
        try:
            await proc.wait_ready(timeout)
        except BaseException:
            await asyncio.shield(proc.kill())
            raise
        return proc

    def kill(self, sid: int) -> None:
        if not self.dead:
            with contextlib.suppress(SandboxError):
                self._send({"op": "kill", "sid": sid})

    async def park(self, sid: int, timeout: float) -> dict | None:
        """Have the worker kill what the last cell left behind and stop the session until its
        next cell. Returns the worker's counts, or None if the worker is gone."""
        if self.dead:
            return None
        fut = self.parks[sid] = self.loop.create_future()
        self._send({"op": "park", "sid": sid})
        try:
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise SandboxError(f"{self.name}: no answer to park within {timeout:g}s") from None
        finally:
            self.parks.pop(sid, None)

    def resume(self, sid: int) -> asyncio.Future:
        """Let the stopped session run; the future resolves when the worker has done it (None if
        the worker is gone): the cell's clock starts then, not while the request waited."""
        fut = self.resumes[sid] = self.loop.create_future()
        try:
            self._send({"op": "resume", "sid": sid})
        except SandboxError:
            self.resumes.pop(sid, None)
            raise
        return fut

    def close(self) -> None:
        self._lost("closed")
        self.sock.close()  # idempotent


class Proc:
    """One session interpreter: its control socket, and how it ended (from the worker).

    The channel is read only while a cell runs and only up to its one reply: anything else the
    session sends (a second frame, a frame between cells, a malformed one) stays in the kernel's
    socket buffer or is never parsed, and marks the session as tampered with."""

    def __init__(self, client: WorkerClient, sid: int, ctl: socket.socket):
        self.client, self.sid, self.ctl = client, sid, ctl
        self.loop = client.loop
        self.frames, self.msgs = Frames(limit=SESSION_FRAME_MAX), deque()
        self.wake: asyncio.Future | None = None
        self.eof = self.reading = self.tampered = self.parked = self.restarted = False
        self.cells = 0
        # False while the last cell could not have started: its session was stopped and the worker
        # never answered "resumed" (it was gone). Such a cell's code never ran.
        self.cell_started = True
        self.exit: asyncio.Future = self.loop.create_future()  # -> (wait status | None, oom)
        ctl.setblocking(False)
        self._listen(True)  # until the session says it is ready

    @property
    def alive(self) -> bool:
        return not self.eof and not self.exit.done()

    def _listen(self, on: bool) -> None:
        if on != self.reading and self.ctl.fileno() >= 0:
            self.reading = on
            if on:
                self.loop.add_reader(self.ctl.fileno(), self._on_ctl)
            else:
                self.loop.remove_reader(self.ctl.fileno())

    def _on_ctl(self) -> None:
        try:
            data = self.ctl.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        try:
            for msg, _ in self.frames.feed(data):
                self.msgs.append(msg)
        except ValueError:  # the code wrote garbage into our channel
            self.tampered = True
            self.msgs.append({"op": "corrupt"})
        if len(self.msgs) > 1 or self.tampered:  # one reply is all we take: stop reading
            self.tampered = True
            self._listen(False)
        if not data:
            self._close_ctl()
        self._deliver()

    def _deliver(self) -> None:
        if self.wake is not None and (self.msgs or self.eof):
            wake, self.wake = self.wake, None
            if not wake.done():
                wake.set_result(self.msgs.popleft() if self.msgs else None)

    def next_msg(self) -> asyncio.Future:
        """The next message from the session; None once its channel is closed."""
        self.wake = self.loop.create_future()
        fut = self.wake
        self._deliver()
        return fut

    def idle_state(self) -> str:
        """What the channel shows since the last reply: 'ok', 'dead' (the session ended, e.g.
        after a restart for leftover threads) or 'tampered' (it sent more than its one reply)."""
        if self.tampered or self.msgs:
            return "tampered"
        if not self.alive:
            return "dead"
        try:
            data = self.ctl.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return "ok"
        except OSError:
            return "dead"
        return "tampered" if data else "dead"

    def _exited(self, status: int | None, oom: bool) -> None:
        if not self.exit.done():
            self.exit.set_result((status, oom))
        self._close_ctl()

    def _close_ctl(self) -> None:
        self._listen(False)
        if self.ctl.fileno() >= 0:
            self.ctl.close()
        self.eof = True
        self._deliver()

    async def wait_ready(self, timeout: float) -> None:
        try:
            msg = await asyncio.wait_for(self.next_msg(), timeout)
        except asyncio.TimeoutError:
            raise SandboxError(f"session process not ready after {timeout:g}s") from None
        finally:
            self._listen(False)
        if msg is None or msg.get("op") != "ready":
            why = msg.get("error", msg) if msg else "it exited"
            raise SandboxError(f"session process failed to start: {why}")

    async def kill(self, timeout: float = 10.0) -> tuple[int | None, bool]:
        """Kill the session (all its processes) and wait until the worker has reaped it."""
        if not self.exit.done():
            self.client.kill(self.sid)
        try:
            return await asyncio.wait_for(asyncio.shield(self.exit), timeout)
        except asyncio.TimeoutError:
            raise SandboxError(f"session process survived SIGKILL for {timeout:g}s") from None
        finally:
            self._close_ctl()

    async def run_cell(self, code: str, wall: float, cap: int, park: bool = True) -> ExecResult:
        """Run one cell; its status comes from what the host observes: a well-formed reply to this
        cell (its exit code is the one cell-reported field), the output read from the cell's pipes,
        the wait status, the cgroup OOM counter and our own clock. `park`: afterwards stop the
        session and kill what the cell left behind, until its next cell (stateful sessions)."""
        t0, loop = time.monotonic(), self.loop
        payload = code.encode("utf-8", "surrogatepass")  # lone surrogates survive; compile rejects them
        (out_r, out_w), (err_r, err_w) = os.pipe(), os.pipe()
        bufs, cut = {out_r: bytearray(), err_r: bytearray()}, {out_r: False, err_r: False}
        done = loop.create_future()
        self.cells += 1
        cell, note = self.cells, ""

        def finish(kind: str, msg: dict | None = None) -> None:
            if not done.done():
                done.set_result((kind, msg))

        def take(fd: int, chunk: bytes) -> None:
            room = cap - len(bufs[fd])
            bufs[fd] += chunk[:room]
            if len(chunk) > room:
                cut[fd] = True
                finish("output_limit")

        def on_pipe(fd: int) -> None:
            try:
                chunk = os.read(fd, 1 << 16)
            except BlockingIOError:
                return
            if chunk:
                take(fd, chunk)
            else:
                loop.remove_reader(fd)

        try:
            for fd in bufs:
                os.set_blocking(fd, False)
                loop.add_reader(fd, on_pipe, fd)
            resumed = None
            self.cell_started = True
            if self.parked:  # stopped since its last cell; the run frame waits in the socket meanwhile
                self.parked = False
                try:
                    resumed = self.client.resume(self.sid)
                except SandboxError:
                    self.cell_started = False  # the worker was already gone: nothing was resumed
                    os.close(out_w)
                    os.close(err_w)
                    raise
            frame = pack({"op": "run", "cell": cell}, payload)
            anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", (out_w, err_w)))]
            try:
                sent = self.ctl.sendmsg([frame], anc)
            except OSError:  # the session closed its end: it ended, its wait status says how
                sent = -1
            finally:
                os.close(out_w)
                os.close(err_w)
            # The limit counts from when the code can run: at once for a running session, from the
            # worker's answer for a stopped one (however long other sessions' requests held it)
            timer = Deadline(loop, wall, lambda: finish("timeout"))
            if resumed is None:
                timer.start()
            else:
                resumed.add_done_callback(lambda _f: timer.start())
            self._listen(True)
            reply = self.next_msg()
            reply.add_done_callback(lambda f: f.cancelled() or finish("reply", f.result()))
            if sent < 0:
                finish("reply", None)
            elif sent < len(frame):  # large code: the rest streams while the deadline already runs
                send_rest = asyncio.ensure_future(loop.sock_sendall(self.ctl, frame[sent:]))
                send_rest.add_done_callback(lambda f: f.cancelled() or f.exception() and finish("reply", None))
            kind, msg = await done
            timer.cancel()
            if resumed is not None:
                self.cell_started = resumed.done() and resumed.result() is not None
            self._listen(False)
            if kind == "reply" and _is_reply(msg, cell) and not self.tampered and not self.msgs:
                status, oom, killed = None, False, False
                if park:
                    note = await self._park()
            else:
                if not reply.done():
                    reply.cancel()
                    self.wake = None
                status, oom = await self.kill()
                killed = True
            for fd in bufs:  # what is already in the pipes belongs to this cell
                loop.remove_reader(fd)
                while True:
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        break  # a lingering child still holds the pipe: we do not wait for it
                    if not chunk:
                        break
                    take(fd, chunk)
        finally:
            for fd in bufs:
                loop.remove_reader(fd)
                os.close(fd)
        out, err = (bytes(bufs[fd]).decode("utf-8", "replace") for fd in (out_r, err_r))
        res = ExecResult(ExecStatus.OK, 0, None, out, err, cut[out_r], cut[err_r], time.monotonic() - t0, note)
        if kind == "timeout":
            res.status, res.exit_code, res.signal = ExecStatus.TIMEOUT, 128 + 9, signal.SIGKILL
            res.error = f"wall-time limit {wall:g}s exceeded; the session was killed"
        elif kind == "output_limit" or (res.stdout_truncated or res.stderr_truncated):
            res.status = ExecStatus.OUTPUT_LIMIT
            if killed:
                res.exit_code, res.signal = 128 + 9, signal.SIGKILL
            else:
                res.exit_code = msg["exit_code"]
            res.error = f"output over {cap} bytes per stream"
        elif not killed:  # the exit code is cell-reported; oom only ever comes from the kernel (below)
            res.exit_code = msg["exit_code"]
            res.status = ExecStatus.OK if res.exit_code == 0 else ExecStatus.ERROR
        elif msg is not None or self.tampered:  # anything but one well-formed reply: tampering
            self.client.stats["tampered"] += 1
            res.status, res.exit_code = ExecStatus.ERROR, None
            res.error = TAMPERED
        elif status is None and self.client.dead:  # the only outcome the code cannot cause
            res.status, res.exit_code = ExecStatus.SANDBOX_ERROR, None
            res.error = f"worker lost: {self.client.dead}"
        elif status is None:
            res.status, res.exit_code = ExecStatus.ERROR, None
            res.error = "the session ended during the cell"
        elif os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            res.status, res.exit_code, res.signal = killed_status(sig, oom), 128 + sig, sig
        else:
            res.exit_code = os.WEXITSTATUS(status)  # the code called os._exit()
            res.status = ExecStatus.OK if res.exit_code == 0 else ExecStatus.ERROR
        return res

    async def _park(self) -> str:
        """Stop the session until its next cell; returns a note for the result if the worker had
        to kill leftovers (processes: the session goes on; threads: the session was restarted)."""
        parked = await self.client.park(self.sid, PARK_TIMEOUT_S)
        if parked is None:  # the worker is gone: the next cell finds the session dead
            return ""
        procs, threads = int(parked.get("procs", 0)), int(parked.get("threads", 0))
        self.client.stats["leftover_processes_killed"] += procs
        note = f"{procs} process(es) the cell left running were killed. " if procs else ""
        if parked.get("failed"):
            self.client.stats["unstoppable_restarts"] += 1
            self.restarted = True
            await self.kill()
            return note + (
                f"the session could not be stopped after the cell ({parked['failed']}): it was "
                "restarted (its state is lost), so nothing of it runs until the next cell"
            )
        if threads:
            self.client.stats["leftover_thread_restarts"] += 1
            self.restarted = True
            await self.kill()
            return note + (
                f"the cell left {threads} thread(s) running: the session was restarted "
                "(its state is lost), so their output cannot reach a later cell"
            )
        self.parked = True
        return note.strip()


class Deadline:
    """A cell's wall-time limit, armed once the code can run."""

    def __init__(self, loop: asyncio.AbstractEventLoop, seconds: float, expire) -> None:
        self.loop, self.seconds, self.expire = loop, seconds, expire
        self.handle: asyncio.TimerHandle | None = None
        self.cancelled = False

    def start(self) -> None:
        if not self.cancelled and self.handle is None:
            self.handle = self.loop.call_later(self.seconds, self.expire)

    def cancel(self) -> None:
        self.cancelled = True
        if self.handle is not None:
            self.handle.cancel()


PARK_TIMEOUT_S = 10.0
SESSION_FRAME_MAX = 4096  # a session's replies are tiny: a bigger frame is tampering, never buffered
TAMPERED = (
    "the code wrote into the sandbox's control channel (a forged, malformed or extra frame); the session was killed"
)


def new_stats() -> dict[str, int]:
    """Counters a sandbox reports: what the host discarded or killed, so nothing is silent."""
    return {
        "tampered": 0,
        "leftover_processes_killed": 0,
        "leftover_thread_restarts": 0,
        "unstoppable_restarts": 0,
        "died_between_cells": 0,
    }


def _is_reply(msg: dict | None, cell: int) -> bool:
    """Exactly the runner's reply to this cell, nothing more or less. It has no field whose size
    the code chooses (no exception name, no text): a legitimate reply is always a few dozen bytes."""
    if msg is None or set(msg) != {"op", "cell", "exit_code"} or msg["op"] != "done":
        return False
    code = msg["exit_code"]
    return type(msg["cell"]) is int and msg["cell"] == cell and type(code) is int and 0 <= code <= 255
