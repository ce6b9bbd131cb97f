"""The session side of a cell: run code like `python -c`, report how it ended. Stdlib only.

The reply carries one thing the host cannot observe from outside: the exit code the code ended
with (0, 1 for an uncaught exception, its sys.exit() value). It is cell-reported: the runner lives
in the session's interpreter, which the code may change, so a cell can alter what later cells of
its own session report about themselves (as redefining `print` alters what they print). Output,
time, signals and memory kills are the host's own observations (sandbox/README.md).
"""

from __future__ import annotations

import builtins
import io
import linecache
import os
import signal
import socket
import sys
import traceback
import types
from typing import Callable

from _proto import pack, recv, send


def run_cell(code: bytes, main: types.ModuleType, name: str) -> int:
    """Execute one cell like `python -c` would; returns its exit code (0..255)."""
    try:
        text = code.decode("utf-8", "replace")
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)  # source in tracebacks
        compiled = compile(code, name, "exec", dont_inherit=True)
        exec(compiled, main.__dict__)
        return 0
    except SystemExit as e:  # sys.exit() ends the cell, not the session (as in a notebook)
        if e.code is None:
            return 0
        if isinstance(e.code, int):  # int's own "&": an int subclass cannot answer something else
            return int.__and__(e.code, 0xFF)
        _print_safely(e.code)
        return 1
    except BaseException as e:  # noqa: BLE001 - the code's exceptions are its result
        try:  # tb_next: leave out this function's frame
            traceback.print_exception(type(e), e, e.__traceback__.tb_next)
        except BaseException:  # noqa: BLE001 - a broken __str__ or a closed stderr
            pass
        return 1


def _print_safely(obj: object) -> None:
    try:
        print(str(obj), file=sys.stderr)
    except BaseException:  # noqa: BLE001 - a broken __str__ or a closed stderr
        pass


def _reset_stdio() -> None:
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), encoding="utf-8", errors="backslashreplace")
    sys.stderr = io.TextIOWrapper(
        io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
    )


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:  # noqa: BLE001 - the code may have closed or replaced them
            pass


def _reap_orphans() -> None:
    """As pid 1 of the session, collect exited orphans (e.g. leftovers the worker killed after
    the last cell): zombies would otherwise count against the session's process limit."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _drop_blocked_signals() -> None:
    """Signals that arrived while blocked (e.g. from a leftover before the worker killed it) are
    taken off here, between cells, instead of reaching a handler in a later cell."""
    try:
        pending = signal.sigpending()
        while pending:
            signal.sigtimedwait(pending, 0)
            pending = signal.sigpending()
    except (OSError, ValueError):
        pass


def serve_cells(ctl: socket.socket, cancel_timers: Callable[[], None] | None = None) -> None:
    """The session's loop: one frame per cell (code + its stdout/stderr pipes), one reply.
    Between cells stdout/stderr are /dev/null and the timers the cell armed are disarmed
    (`cancel_timers`), so nothing of one cell's output can land in the next one's."""
    me = os.getpid()
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    sys.argv = [""]
    devnull = os.open("/dev/null", os.O_RDWR)
    # a throwaway cell now takes the copy-on-write faults that would otherwise slow the first real one
    _reset_stdio()
    run_cell(b"print(end='')", types.ModuleType("__warmup__"), "<warmup>")
    _flush_stdio()
    pack({"op": "done", "cell": 0, "exit_code": 0})
    send(ctl, {"op": "ready"})
    for n in range(1, 1 << 62):
        msg, code, fds = recv(ctl, maxfds=2)
        if msg is None or len(fds) != 2:
            os._exit(0)  # the host closed the session
        _reap_orphans()  # a Python call: handlers of signals that came while stopped run now (/dev/null)
        _drop_blocked_signals()
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        os.close(fds[0])
        os.close(fds[1])
        _reset_stdio()
        exit_code = run_cell(code, main, f"<cell {n}>")
        _flush_stdio()
        if os.getpid() != me:  # a fork made by the cell fell through to here: it must not talk
            os._exit(exit_code)
        os.dup2(devnull, 1)  # the host sees EOF unless a lingering child still holds the pipes
        os.dup2(devnull, 2)
        if cancel_timers is not None:
            try:
                cancel_timers()
            except BaseException:  # noqa: BLE001 - a signal handler of the code raising in between
                pass
        # the host matches "cell" against the cell it sent; the worker then stops this process
        send(ctl, {"op": "done", "cell": msg.get("cell"), "exit_code": exit_code})
