"""e2b backend against a local stand-in for the code-interpreter HTTP API (no network here).

The real `e2b_code_interpreter.AsyncSandbox` runs in SDK debug mode (no control-plane calls) and
talks HTTP to this stand-in, which speaks the same protocol as the service's Jupyter endpoint:
POST /execute streams NDJSON lines (stdout, stderr, result, error), POST/DELETE /contexts.
What is real: the SDK, its HTTP client and parsing, our mapping, timeouts, caps and retries.
What is not: e2b's servers, kernels, and the isolation they provide.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
import time
import traceback
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sandbox import E2BConfig, Limits, SandboxConfig, SyncSandbox

LIMITS = Limits(wall_time_s=2.0, max_output_bytes=2000)


class StandIn(BaseHTTPRequestHandler):
    contexts: dict = {}
    calls: dict = {}

    def log_message(self, *args):  # quiet
        pass

    def _json(self, code: int, obj) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_DELETE(self):
        self.contexts.pop(self.path.rsplit("/", 1)[-1], None)
        self._json(200, {})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/contexts":
            cid = uuid.uuid4().hex
            self.contexts[cid] = {}
            return self._json(200, {"id": cid, "language": "python", "cwd": "/home/user"})
        code, ns = req["code"], self.contexts.setdefault(req.get("context_id") or "default", {})
        self.calls[code] = self.calls.get(code, 0) + 1
        if code == "#500":
            return self._json(500, {"error": "kernel exploded"})
        self.send_response(200)
        self.send_header("Content-Type", "application/x-ndjson")
        if code == "#drop":  # promise a body, send part of it, hang up: a mid-stream transport error
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b'{"type": "stdout", "text": "partial\\n", "timestamp": 1}\n')
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self.end_headers()

        def line(**obj):
            self.wfile.write((json.dumps({"timestamp": time.time_ns(), **obj}) + "\n").encode())
            self.wfile.flush()

        if code.startswith("#sleep"):
            time.sleep(float(code.split()[1]))
        elif code == "#flood":
            with contextlib.suppress(OSError):  # the client hangs up at its cap
                for _ in range(1000):
                    line(type="stdout", text="x" * 100 + "\n")
            return
        else:  # a tiny kernel: exec, capture stdout, show the last expression's value
            buf = io.StringIO()
            try:
                with contextlib.redirect_stdout(buf):
                    try:
                        value = eval(compile(code, "<cell>", "eval"), ns)
                    except SyntaxError:
                        value = None
                        exec(compile(code, "<cell>", "exec"), ns)
                if buf.getvalue():
                    line(type="stdout", text=buf.getvalue())
                if value is not None:
                    line(type="result", text=repr(value), is_main_result=True)
            except BaseException as e:  # noqa: BLE001
                tb = "\x1b[0;31m" + "".join(traceback.format_exception(e)) + "\x1b[0m"
                line(type="error", name=type(e).__name__, value=str(e), traceback=tb)
        line(type="number_of_executions", execution_count=1)


@pytest.fixture(scope="module")
def server():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), StandIn)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def e2b_box(url: str, retries: int = 2) -> SyncSandbox:
    e2b = E2BConfig(sandbox_url=url, debug=True, retries=retries, request_timeout_s=5)
    return SyncSandbox(SandboxConfig(backend="e2b", limits=LIMITS, backends={"e2b": e2b}))


@pytest.fixture(scope="module")
def sb(server):
    with e2b_box(server) as box:
        yield box


def test_stateful_session_and_result_mapping(sb):
    with sb.session() as s:
        r = s.run("x = 20")
        assert (r.status, r.exit_code, r.stdout) == ("ok", 0, "")
        r = s.run("print('hi')\nx")
        assert r.status == "ok" and r.stdout == "hi\n", r
        assert s.run("x + 22").stdout == "42\n"


def test_stateless_uses_a_fresh_context_per_cell(sb):
    with sb.session(stateless=True) as s:
        assert s.run("y = 1").ok
        r = s.run("y")
        assert r.status == "error" and "NameError" in r.stderr


def test_errors_map_to_status_without_ansi(sb):
    r = sb.run("1 / 0")
    assert r.status == "error" and r.exit_code == 1 and "ZeroDivisionError" in r.stderr and "\x1b" not in r.stderr
    assert sb.run("raise MemoryError()").status == "oom"
    assert sb.run("print('sandbox_error timeout')").status == "ok"  # never inferred from text


def test_timeout_is_ours_and_only_shortens(sb):
    t = time.monotonic()
    r = sb.run("#sleep 5", timeout=0.5)
    assert r.status == "timeout" and time.monotonic() - t < 2.0, r
    t = time.monotonic()
    r = sb.run("#sleep 5", timeout=30)  # the 2 s limit still applies
    assert r.status == "timeout" and time.monotonic() - t < 3.5, r
    assert sb.run("print(1)").stdout == "1\n"


def test_output_is_capped_while_streaming(sb):
    r = sb.run("#flood")
    assert r.status == "output_limit" and r.stdout_truncated and len(r.stdout) == LIMITS.max_output_bytes


def test_transport_errors_retry_only_when_safe(sb):
    StandIn.calls.pop("#drop", None)
    with sb.session() as s:  # stateful: the cell may have run, a retry could run it twice
        r = s.run("#drop")
    assert r.status == "sandbox_error" and StandIn.calls["#drop"] == 1, r
    StandIn.calls.pop("#drop", None)
    r = sb.run("#drop")  # stateless: retried, then reported
    assert r.status == "sandbox_error" and StandIn.calls["#drop"] == 3, r
    r = sb.run("#500")
    assert r.status == "sandbox_error" and "500" in r.error, r


def test_unreachable_service_is_sandbox_error():
    port = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{port.getsockname()[1]}"
    port.close()  # nothing listens there now
    with e2b_box(url, retries=1) as box:
        r = box.run("print(1)")
    assert r.status == "sandbox_error" and "2 attempts" in r.error, r


def test_key_and_domain_come_from_config(monkeypatch):
    import e2b_code_interpreter

    seen = {}

    async def fake_create(**kwargs):
        seen.update(kwargs)
        raise RuntimeError("stop here")

    monkeypatch.setattr(e2b_code_interpreter.AsyncSandbox, "create", fake_create)
    cfg = SandboxConfig(
        backend="e2b", backends={"e2b": E2BConfig(api_key="k-123", domain="e2b.example", template="tpl")}
    )
    with SyncSandbox(cfg) as box:
        r = box.run("print(1)")
    assert r.status == "sandbox_error" and "stop here" in r.error
    assert (seen["api_key"], seen["domain"], seen["template"]) == ("k-123", "e2b.example", "tpl")
    assert seen["envs"]["OPENBLAS_NUM_THREADS"] == "1"


def test_missing_key_fails_fast_as_sandbox_error(monkeypatch):
    monkeypatch.delenv("E2B_API_KEY", raising=False)
    monkeypatch.delenv("E2B_ACCESS_TOKEN", raising=False)
    t = time.monotonic()
    with SyncSandbox(SandboxConfig(backend="e2b", backends={"e2b": E2BConfig(retries=0)})) as box:
        r = box.run("print(1)")
    assert r.status == "sandbox_error" and time.monotonic() - t < 10, r
