"""The SGLang stand-in's HTTP front (tests/rollout/sglang_standin.py): routes, JSON replies,
keep-alive like uvicorn, fatal errors that close the connection without an answer."""

from __future__ import annotations

import json
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from sglang_standin_quirks import Fatal

_UPDATE_PATHS = {"/update_weights_from_disk", "/update_weights_from_tensor", "/update_weights_from_distributed"}
_SYNC_PATHS = {
    "/update_weights_from_disk",
    "/update_weights_from_tensor",
    "/update_weights_from_distributed",
    "/init_weights_update_group",
}


def make_handler(server: Any, keepalive_s: float):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like uvicorn
        timeout = keepalive_s  # an idle connection is closed after this, like uvicorn's keep-alive

        def setup(self) -> None:
            super().setup()
            server.connections.add(self.connection)

        def finish(self) -> None:
            server.connections.discard(self.connection)
            super().finish()

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            pass

        def _reply(self, status: int, payload: Any) -> None:
            if isinstance(payload, (dict, list)) or payload is None:
                data, ctype = json.dumps(payload).encode(), "application/json"
            else:
                data, ctype = str(payload).encode(), "text/plain"
            self.send_response(int(status))
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            return json.loads(raw) if raw else {}

        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            server.counts[path] += 1
            if path in ("/health", "/health_generate"):
                self._reply(HTTPStatus.OK, "")
            elif path in ("/model_info", "/get_model_info"):
                self._reply(
                    HTTPStatus.OK,
                    {
                        "model_path": server.model_path,
                        "tokenizer_path": server.model_path,
                        "is_generation": True,
                        "weight_version": server.weight_version,
                    },
                )
            elif path in ("/server_info", "/get_server_info"):
                self._reply(
                    HTTPStatus.OK,
                    {
                        "model_path": server.model_path,
                        "tp_size": server.tp_size,
                        "base_gpu_id": 0,  # server_args defaults: TP rank r on visible GPU r
                        "gpu_id_step": 1,
                        "dp_size": 1,
                        "pp_size": 1,
                        "nnodes": 1,
                        "enable_memory_saver": True,  # release/resume are modelled (generate 503s)
                        "weight_version": server.weight_version,
                        "version": server.version,
                    },
                )
            elif path == "/standin_stats":
                self._reply(HTTPStatus.OK, server.stats())
            elif path == "/flush_cache":
                self._reply(*server.flush())
            else:
                self._reply(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

        def do_POST(self) -> None:
            path = self.path.split("?")[0]
            server.counts[path] += 1
            try:
                body = self._body()
            except json.JSONDecodeError as exc:
                self._reply(HTTPStatus.BAD_REQUEST, {"error": {"message": f"bad JSON: {exc}"}})
                return
            routes = {
                "/generate": server.generate,
                "/update_weights_from_disk": server.update_from_disk,
                "/update_weights_from_tensor": server.update_from_tensor,
                "/init_weights_update_group": server.init_group,
                "/update_weights_from_distributed": server.update_from_distributed,
                "/destroy_weights_update_group": server.destroy_group,
                "/flush_cache": lambda b: server.flush(),
                "/begin_weight_update": lambda b: server.session(True),
                "/end_weight_update": lambda b: server.session(False),
                "/release_memory_occupation": lambda b: server.memory(b, True),
                "/resume_memory_occupation": lambda b: server.memory(b, False),
                "/standin_fault": server.set_fault,
                "/pause_generation": server.pause,
                "/continue_generation": lambda b: (HTTPStatus.OK, server.control.resume()),
            }
            if path not in routes:
                self._reply(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})
                return
            if path in _SYNC_PATHS:
                with server.lock:
                    server.syncing += 1
            try:
                if path in _UPDATE_PATHS:  # the update lock: after the requests in flight unless paused
                    with server.control.writing():
                        self._reply(*routes[path](body))
                else:
                    self._reply(*routes[path](body))
            except Fatal as exc:  # no answer: the connection closes and the server goes down
                self.close_connection = True
                server.die(str(exc))
            except Exception as exc:  # keep serving; report like a server error
                self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"message": repr(exc)}})
            finally:
                if path in _SYNC_PATHS:
                    with server.lock:
                        server.syncing -= 1

    return Handler
