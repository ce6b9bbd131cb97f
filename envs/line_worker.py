"""A child Python process that answers one JSON request per line, under a hard time bound per call.

Used by the grader's symbolic stage (envs.grading) and by a user's reward function (envs.reward).
The child prints `ready` once it has started, then one JSON reply line per request line. A call
whose child overruns the bound, has died, or answers with a line that is not JSON kills the child
(the next call starts another): a hang in C code never holds the caller past the bound. Fork-safe:
a forked process starts a child of its own instead of writing into its parent's pipes. Stdlib only.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from typing import Callable, Sequence


class LineWorker:
    """`python -u -m ARGV...` as a request/reply worker. One call at a time (callers serialize)."""

    def __init__(
        self,
        argv: Sequence[str],
        environment: Callable[[], dict[str, str]],
        *,
        stderr: int | None,
        startup_timeout_s: float,
        warm_restart: bool = False,
    ) -> None:
        self.argv = list(argv)
        self.environment = environment  # the child's environment, read at each start
        self.stderr = stderr
        self.startup_timeout_s = startup_timeout_s
        self.warm_restart = warm_restart  # after a timeout, start the replacement at once
        self.proc: subprocess.Popen | None = None
        self.owner_pid = os.getpid()
        self.ready = False
        self.buf = b""

    def call(self, request: dict, read_timeout_s: float) -> tuple[dict | None, str]:
        """(the reply, "") or (None, why): why is "start: <error>", "not ready", "gone: <error>",
        "timeout" or "unreadable"; the child is gone after every failure."""
        if self.owner_pid != os.getpid():  # a forked process: the pipes are its parent's
            self.proc, self.ready, self.buf, self.owner_pid = None, False, b"", os.getpid()
        try:
            if self.proc is None or self.proc.poll() is not None:
                self.spawn()
        except OSError as e:  # (no process slots, E2BIG environment, ...): a failed call, never a crash
            self.proc = None
            return None, f"start: {e}"
        if not self.ready:
            if self._readline(time.monotonic() + self.startup_timeout_s) != b"ready":
                self.kill()
                return None, "not ready"
            self.ready = True
        try:
            assert self.proc is not None and self.proc.stdin is not None
            self.proc.stdin.write((json.dumps(request, default=str) + "\n").encode())
        except (OSError, ValueError) as e:
            self.kill()
            return None, f"gone: {type(e).__name__}"
        line = self._readline(time.monotonic() + read_timeout_s)
        if line is None:
            self.kill()  # hung (in C code too), or died
            if self.warm_restart:
                try:
                    self.spawn()  # the next call finds its replacement warm
                except OSError:
                    self.proc = None
            return None, "timeout"
        try:
            return json.loads(line), ""
        except ValueError:
            self.kill()  # out of step with the child: start over rather than misread answers
            return None, "unreadable"

    def spawn(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", *self.argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            bufsize=0,
            env=self.environment(),
            close_fds=True,
        )
        self.ready, self.buf = False, b""

    def kill(self) -> None:
        if self.proc is not None and self.owner_pid == os.getpid():
            try:
                self.proc.kill()
                self.proc.wait(timeout=5)
            except Exception:  # noqa: BLE001 - already gone
                pass
        self.proc, self.ready = None, False

    def _readline(self, deadline: float) -> bytes | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the child died
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line
