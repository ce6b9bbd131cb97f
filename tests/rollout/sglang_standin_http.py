"""The SGLang stand-in's HTTP front (tests/rollout/sglang_standin.py): routes, JSON replies,
keep-alive like uvicorn, fatal errors that close the connection without an answer, and the
/generate answer's JSON."""

from __future__ import annotations

import json
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import Any

from sglang_standin_gen import Answer
from sglang_standin_quirks import PROMPT_PREFIX, Fatal

from stare_tir.rollout.backends.base import SamplingParams

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
                # http_server.py `abort_request`: an empty 200 whether or not the rid was in flight
                "/abort_request": lambda b: (HTTPStatus.OK, server.control.abort_request(b) or ""),
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


def answer_json(
    server: Any, prompt: list[int], answer: Answer, sp: dict, logprobs: bool, sampling: SamplingParams
) -> dict:
    """A /generate answer's JSON (entrypoints/http_server.py `generate_request`, tokenizer_manager.py
    meta_info) for one prompt."""
    gen = answer.gen
    if answer.aborted:  # schedule_batch.py FINISH_ABORT.to_json
        finish = {"type": "abort", "message": answer.message, "status_code": None, "err_type": None}
    elif "length_first" in server.quirks and len(gen.token_ids) >= sampling.max_new_tokens:
        finish = {"type": "length", "length": len(gen.token_ids)}
    elif gen.finish_reason == "eos":
        finish = {"type": "stop", "matched": gen.token_ids[-1]}
    elif gen.finish_reason == "stop":
        finish = {"type": "stop", "matched": gen.stop_text}
    else:
        finish = {"type": "length", "length": len(gen.token_ids)}
    text = server.tokenizer.decode(gen.token_ids, skip_special_tokens=bool(sp.get("skip_special_tokens", True)))
    if gen.stop_text and not sp.get("no_stop_trim", False):
        text = text[: text.find(gen.stop_text)]
    meta = {
        "id": uuid.uuid4().hex,
        "finish_reason": finish,
        "prompt_tokens": len(prompt),
        "completion_tokens": len(gen.token_ids),
        "cached_tokens": 0,
        # utils/weight_versions.py `add_weight_versions_to_meta_info`
        "weight_version": gen.weight_version or server.weight_version,
        "weight_versions": [{"version": v, "start": a, "end": b} for a, b, v in gen.weight_versions]
        or [{"version": server.weight_version, "start": 0, "end": 0}],
    }
    if logprobs:
        meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(gen.logprobs, gen.token_ids)]
    out_ids = list(gen.token_ids)
    if "output_ids_prefix" in server.quirks:
        out_ids = list(prompt[-PROMPT_PREFIX:]) + out_ids
    return {"text": text, "output_ids": out_ids, "meta_info": meta}
