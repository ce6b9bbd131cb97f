"""A stand-in for an SGLang server, for machines without CUDA (tests, CPU development).

It speaks the subset of SGLang's native HTTP API that `SGLangBackend` uses, with the same JSON
fields, on top of the in-process HF backend (so it batches concurrent requests like a server):

    GET  /health, /health_generate, /get_model_info, /get_server_info
    POST /generate                      input_ids, sampling_params, return_logprob -> text,
                                        output_ids, meta_info{finish_reason, output_token_logprobs}
    POST /flush_cache
    POST /update_weights_from_disk      {"model_path"}
    POST /update_weights_from_tensor    {"serialized_named_tensors": [b64 pickle per TP rank]}
    POST /init_weights_update_group     {"master_address", "master_port", "rank_offset",
                                         "world_size", "group_name", "backend"}
    POST /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name"}
    POST /destroy_weights_update_group
    POST /release_memory_occupation, /resume_memory_occupation  {"tags"}
    GET  /standin_stats                 (not SGLang: request counts, for tests)

What it does not reproduce: SGLang's scheduler, radix cache, CUDA graphs, TP sharding, its exact
error payloads, and the CUDA-IPC side of update_weights_from_tensor (it unpickles whatever it
receives: CPU tensors by value). It binds only to the loopback interface and trusts its caller.

Run: python -m stare_tir.rollout.backends.sglang_standin --model-path DIR [--port 0]
It prints "STANDIN_READY port=<port>" once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import pickle
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Optional

from stare_tir.rollout.backends.base import SamplingParams

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# sampling_params keys the stand-in understands; others are refused (400), not silently ignored.
_SAMPLING_KEYS = {"temperature", "top_p", "top_k", "max_new_tokens", "stop", "no_stop_trim",
                  "skip_special_tokens", "spaces_between_special_tokens", "sampling_seed"}


class StandinServer:
    """The HTTP server and its HF model (see module docstring)."""

    def __init__(self, model_path: str, host: str = "127.0.0.1", port: int = 0,
                 max_batch_size: int = 64) -> None:
        if host not in LOOPBACK:
            raise ValueError(f"host={host!r}: the stand-in binds to the loopback interface only")
        from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig

        self.model_path = str(model_path)
        self.backend = HFBackend(self.model_path, cfg=HFBackendConfig(max_batch_size=max_batch_size))
        self.tokenizer = self.backend.tokenizer
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                             name="standin-loop")
        self._loop_thread.start()
        self.counts: Counter = Counter()
        self.released: set[str] = set()
        self.groups: dict[str, Any] = {}
        self.weight_version = "default"
        self.httpd = ThreadingHTTPServer((host, port), _make_handler(self))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def start(self) -> "StandinServer":
        threading.Thread(target=self.httpd.serve_forever, daemon=True, name="standin-http").start()
        return self

    def shutdown(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=10)
        self.backend.close()

    # -- endpoint logic (called from HTTP handler threads)
    def generate(self, body: dict) -> tuple[int, Any]:
        if self.released:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": {"message": "memory released"}}
        ids = body.get("input_ids")
        if not ids:
            return HTTPStatus.BAD_REQUEST, {"error": {"message": "input_ids is required"}}
        sp = dict(body.get("sampling_params") or {})
        unknown = set(sp) - _SAMPLING_KEYS
        if unknown:
            return HTTPStatus.BAD_REQUEST, {
                "error": {"message": f"sampling_params not supported by the stand-in: {sorted(unknown)}"}}
        stop = sp.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        try:
            sampling = SamplingParams(temperature=float(sp.get("temperature", 1.0)),
                                      top_p=float(sp.get("top_p", 1.0)),
                                      top_k=int(sp.get("top_k", -1)),
                                      max_new_tokens=int(sp.get("max_new_tokens", 128)),
                                      seed=sp.get("sampling_seed"))
        except ValueError as exc:
            return HTTPStatus.BAD_REQUEST, {"error": {"message": str(exc)}}
        batched = isinstance(ids[0], list)
        prompts = ids if batched else [ids]
        futs = [asyncio.run_coroutine_threadsafe(self.backend.generate(p, sampling, stop), self.loop)
                for p in prompts]
        outs = [self._answer(p, f.result(), sp, bool(body.get("return_logprob")))
                for p, f in zip(prompts, futs)]
        return HTTPStatus.OK, (outs if batched else outs[0])

    def _answer(self, prompt: list[int], gen, sp: dict, logprobs: bool) -> dict:
        if gen.finish_reason == "eos":
            finish = {"type": "stop", "matched": gen.token_ids[-1]}
        elif gen.finish_reason == "stop":
            finish = {"type": "stop", "matched": gen.stop_text}
        else:
            finish = {"type": "length", "length": len(gen.token_ids)}
        text = self.tokenizer.decode(gen.token_ids,
                                     skip_special_tokens=bool(sp.get("skip_special_tokens", True)))
        if gen.stop_text and not sp.get("no_stop_trim", False):
            text = text[: text.find(gen.stop_text)]
        meta = {"id": uuid.uuid4().hex, "finish_reason": finish, "prompt_tokens": len(prompt),
                "completion_tokens": len(gen.token_ids), "cached_tokens": 0,
                "weight_version": self.weight_version}
        if logprobs:
            meta["output_token_logprobs"] = [[lp, t, None] for lp, t in zip(gen.logprobs, gen.token_ids)]
        return {"text": text, "output_ids": list(gen.token_ids), "meta_info": meta}

    def update_from_disk(self, body: dict) -> tuple[int, Any]:
        try:
            self.backend.update_weights_from_disk(body["model_path"])
        except Exception as exc:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{exc!r}",
                                            "num_paused_requests": 0}
        self._bump(body)
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to update model weights.",
                               "num_paused_requests": 0}

    def update_from_tensor(self, body: dict) -> tuple[int, Any]:
        if body.get("load_format") not in (None, "direct"):
            return HTTPStatus.BAD_REQUEST, {"success": False,
                                            "message": f"load_format={body.get('load_format')!r} "
                                                       "not supported by the stand-in"}
        try:
            blob = body["serialized_named_tensors"][0]  # this server's single "TP rank"
            named = pickle.loads(base64.b64decode(blob))
            self.backend.update_weights(named)
        except Exception as exc:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{exc!r}"}
        self._bump(body)
        return HTTPStatus.OK, {"success": True, "message": "Success"}

    def init_group(self, body: dict) -> tuple[int, Any]:
        from stare_tir.rollout.backends.sglang import init_weight_update_group

        try:
            name = body.get("group_name", "weight_update_group")
            self.groups[name] = init_weight_update_group(
                body.get("backend", "nccl"), f"tcp://{body['master_address']}:{body['master_port']}",
                int(body["world_size"]), int(body["rank_offset"]), name)
        except Exception as exc:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{exc!r}"}
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to initialize custom process group."}

    def update_from_distributed(self, body: dict) -> tuple[int, Any]:
        import torch

        from stare_tir.rollout.backends.sglang import broadcast_from_rank0

        group = self.groups.get(body.get("group_name", "weight_update_group"))
        if group is None:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": "group not initialized"}
        try:
            named = []
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                broadcast_from_rank0(group, t)
                named.append((name, t))
            self.backend.update_weights(named)
        except Exception as exc:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{exc!r}"}
        self._bump(body)
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to update parameter online."}

    def destroy_group(self, body: dict) -> tuple[int, Any]:
        import torch.distributed as dist

        group = self.groups.pop(body.get("group_name", "weight_update_group"), None)
        if group is None:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": "no such group"}
        dist.destroy_process_group(group)
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to destroy custom process group."}

    def _bump(self, body: dict) -> None:
        version = body.get("weight_version")
        self.weight_version = str(version) if version is not None else \
            str(self.backend.weight_version)


def _make_handler(server: StandinServer):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like uvicorn

        def log_message(self, fmt: str, *args: Any) -> None:  # quiet
            pass

        def _reply(self, status: int, payload: Any) -> None:
            if isinstance(payload, (dict, list)):
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
            elif path == "/get_model_info":
                self._reply(HTTPStatus.OK, {"model_path": server.model_path,
                                            "tokenizer_path": server.model_path,
                                            "is_generation": True,
                                            "weight_version": server.weight_version})
            elif path == "/get_server_info":
                self._reply(HTTPStatus.OK, {"model_path": server.model_path, "tp_size": 1,
                                            "version": "stand-in"})
            elif path == "/standin_stats":
                self._reply(HTTPStatus.OK, {"counts": dict(server.counts),
                                            "weight_version": server.weight_version,
                                            "released": sorted(server.released)})
            elif path == "/flush_cache":
                self._reply(HTTPStatus.OK, "Cache flushed.\n")
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
            }
            if path in routes:
                try:
                    self._reply(*routes[path](body))
                except Exception as exc:  # keep serving; report like a server error
                    self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": {"message": repr(exc)}})
            elif path == "/flush_cache":
                self._reply(HTTPStatus.OK, "Cache flushed.\n")
            elif path in ("/release_memory_occupation", "/resume_memory_occupation"):
                tags = set(body.get("tags") or ["weights", "kv_cache"])
                if path.startswith("/release"):
                    server.released |= tags
                else:
                    server.released -= tags
                self._reply(HTTPStatus.OK, "")
            else:
                self._reply(HTTPStatus.NOT_FOUND, {"detail": "Not Found"})

    return Handler


def launch_standin(model_path: str, port: int = 0, timeout_s: float = 120.0,
                   extra_args: Optional[list[str]] = None) -> tuple[subprocess.Popen, str]:
    """Start a stand-in server in a subprocess; returns (process, base URL) once it serves."""
    cmd = [sys.executable, "-m", "stare_tir.rollout.backends.sglang_standin",
           "--model-path", str(model_path), "--port", str(port)] + list(extra_args or [])
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("STANDIN_READY port="):
            # keep draining stdout so a chatty child never blocks on a full pipe
            threading.Thread(target=proc.stdout.read, daemon=True).start()
            return proc, f"http://127.0.0.1:{int(line.split('=')[1])}"
    proc.kill()
    raise RuntimeError(f"stand-in server did not start (exit code {proc.poll()})")


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description="SGLang HTTP API stand-in on a Hugging Face model "
                                             "(CPU tests; loopback only).")
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    args = ap.parse_args(argv)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    server = StandinServer(args.model_path, args.host, args.port, args.max_batch_size)
    # SIGTERM keeps its default action (exit at once): a test helper has nothing to flush.
    print(f"STANDIN_READY port={server.port}", flush=True)
    try:
        server.httpd.serve_forever()
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
