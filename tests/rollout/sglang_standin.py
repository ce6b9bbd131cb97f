"""A stand-in for an SGLang server, for tests on machines where SGLang does not run.

It speaks the subset of SGLang's native HTTP API that `SGLangBackend` uses, with the same JSON
fields, on top of the in-process HF backend (so it batches concurrent requests like a server).
Each behaviour names the upstream file it mirrors (python/sglang/srt/... of SGLang 0.5.23 unless
a version is given):

    GET  /health, /health_generate, /[get_]model_info, /[get_]server_info  entrypoints/http_server.py
                                        (server info: tp_size, dp_size, pp_size, nnodes,
                                        enable_memory_saver, base_gpu_id, gpu_id_step,
                                        version: utils/common.py
                                        `build_server_info`)
    POST /generate                      input_ids, sampling_params, return_logprob -> text,
                                        output_ids, meta_info{finish_reason, output_token_logprobs,
                                        weight_version, weight_versions} (finish_reason JSON:
                                        managers/schedule_batch.py FINISH_*; versions:
                                        utils/weight_versions.py)
    POST /abort_request                 {"rid"} or {"abort_all"}: see sglang_standin_gen.py
    POST /flush_cache                   400 while a request runs (http_server.py `flush_cache`)
    POST /begin_weight_update, /end_weight_update         managers/scheduler_components/
    POST /update_weights_from_disk      {"model_path"}     weight_updater.py
    POST /update_weights_from_tensor    {"serialized_named_tensors": [b64 pickle per TP rank]}
    POST /init_weights_update_group     {"master_address", "master_port", "rank_offset",
                                         "world_size", "group_name", "backend"}
    POST /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name"}
    POST /destroy_weights_update_group
    POST /release_memory_occupation, /resume_memory_occupation  {"tags"}
    POST /pause_generation {"mode"}, /continue_generation   managers/tokenizer_manager.py,
                                        managers/scheduler.py (see sglang_standin_gen.py: modes,
                                        updates while requests run, version spans)
    GET  /standin_stats                 (not SGLang: request counts and sync observations)
    POST /standin_fault                 (not SGLang: {"refuse_update": K},
                                        {"restart_after_generates": K}, {"token_delay_s": D},
                                        {"deterministic": bool};
                                        see `set_fault`)

`--compat` picks the version behaviour (QUIRKS in sglang_standin_quirks.py): "0.5.23" (the default, as measured on the
real server) or "0.5.2" (the 0.5.0-0.5.4 line); `--quirks a,b` adds single quirks. `/server_info` reports the
compat version. `--token-delay-s D` makes each request emit one token per D seconds (a generation that
takes as long as a learner step, for asynchronous training). `--start-delay-s D` opens the port only
after D seconds, as a real server does once its model is loaded (connections are refused meanwhile):
0.5.23's srt/entrypoints/http_server.py `launch_server` runs `Engine._launch_subprocesses` (the
schedulers load the weights) before uvicorn binds the port.

Faults it reproduces (each kills the process, as a fatal error in SGLang's scheduler loop kills
the real server: the HTTP server's child watcher then ends it, and the pending call's connection
closes without an answer):
- a tensor update with fewer payloads than `--tp-size` (managers/tp_worker.py
  `deserialize_own_rank` indexes `serialized_named_tensors[tp_rank]`: IndexError);
- /release_memory_occupation while a request runs or retires (managers/scheduler_components/
  weight_updater.py asserts `is_fully_idle`);
- /resume_memory_occupation of a tag that is not released (same file: `offload_tags.remove`);
- a tensor payload whose CUDA handle names a GPU this process cannot see (utils/patch_torch.py
  raises "Invalid device_uuid" while the TP rank unpickles it: `sglang_standin_cuda.py`).
Fault injection (not SGLang): `--refuse-update K` refuses the K-th weight update (any mode) the
way 0.5.23 refuses one, 400 {"success": false, "message"}.

What it does not reproduce: SGLang's scheduler, radix cache, CUDA graphs, TP sharding (a TP rank
only opens its own payload; distributed sync needs --tp-size 1), its exact error payloads, and
the opening of CUDA-IPC handles themselves (the device lookup before it is reproduced). Idle keep-alive connections are closed after
`--keepalive-s` (uvicorn's 5 s in SGLang). It binds only to the loopback interface.

Run: python tests/rollout/sglang_standin.py --model-path DIR [--port 0] [--compat 0.5.2]
It prints "STANDIN_READY port=<port>" once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import os
import pickle
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root must be importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its helper modules beside it

from sglang_standin_cuda import RankProcesses, open_payload  # noqa: E402
from sglang_standin_gen import GenerationControl  # noqa: E402
from sglang_standin_http import answer_json, make_handler  # noqa: E402
from sglang_standin_quirks import (  # noqa: E402
    COMPAT,
    LOOPBACK,
    QUIRKS,
    RETIRE_S,
    SAMPLING_KEYS,
    AllowListUnpickler,
    Fatal,
    die,
)

from stare_tir.rollout.backends.base import SamplingParams  # noqa: E402

__all__ = ["COMPAT", "QUIRKS", "Fatal", "StandinServer", "launch_standin"]


class StandinServer:
    """The HTTP server and its HF model (see module docstring)."""

    def __init__(
        self,
        model_path: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_batch_size: int = 64,
        compat: str = "0.5.23",
        quirks: set[str] | None = None,
        deterministic: bool = False,
        tp_size: int = 1,
        refuse_update: int = 0,
        keepalive_s: float = 5.0,
        token_delay_s: float = 0.0,
        rank_processes: bool = False,
    ) -> None:
        if host not in LOOPBACK:
            raise ValueError(f"host={host!r}: the stand-in binds to the loopback interface only")
        if compat not in COMPAT:
            raise ValueError(f"compat={compat!r}: must be one of {sorted(COMPAT)}")
        unknown = set(quirks or ()) - QUIRKS
        if unknown:
            raise ValueError(f"unknown quirks {sorted(unknown)}; known: {sorted(QUIRKS)}")
        from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig

        self.quirks = COMPAT[compat] | set(quirks or ())
        self.version = compat
        self.deterministic = deterministic
        self.model_path = str(model_path)
        self.backend = HFBackend(self.model_path, cfg=HFBackendConfig(max_batch_size=max_batch_size))
        self.tokenizer = self.backend.tokenizer
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="standin-loop")
        self._loop_thread.start()
        self.counts: Counter = Counter()
        self.lock = threading.Lock()
        self.running = 0  # generate requests in flight (or still retiring)
        self.syncing = 0  # weight updates / sessions in progress
        self.generate_during_sync = 0
        self.session_open = False
        self.released: set[str] = set()
        self.groups: dict[str, Any] = {}
        self.weight_version = "default"  # server_args.weight_version's default
        self.tp_size = tp_size
        self.refuse_update = refuse_update  # 0: never
        self.updates = 0
        self.fatal: str | None = None
        self.restart_at = 0  # /generate count at which the server "restarts" (0: never)
        self.restarts = 0
        self.connections: set = set()  # open client sockets (cut by shutdown)
        self._stopped = False
        self.exit_on_fatal = False  # main() sets it: a subprocess stand-in exits like the server
        self.control = GenerationControl(self, token_delay_s)
        # each TP rank opens its tensor payload in its own process and keeps the weights there
        # (sglang_standin_cuda.py); the HF model is then not updated
        self.ranks = RankProcesses(tp_size, "safe_unpickle" in self.quirks) if rank_processes else None
        self.rank_reports: list[dict] = []
        self.httpd = ThreadingHTTPServer((host, port), make_handler(self, keepalive_s))
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"

    def die(self, message: str) -> None:
        """Go down as SGLang does after a fatal scheduler error: a subprocess exits; an
        in-process server (tests) stops serving and keeps the reason in `fatal`."""
        print(f"stand-in: fatal: {message}", file=sys.stderr, flush=True)
        self.fatal = message
        if self.exit_on_fatal:
            os._exit(1)
        threading.Thread(target=self.shutdown, daemon=True).start()

    def start(self) -> StandinServer:
        threading.Thread(target=self.httpd.serve_forever, daemon=True, name="standin-http").start()
        return self

    def shutdown(self) -> None:
        """Stop serving and cut every open connection (a dead server's keep-alive connections
        die with it; none may go on answering)."""
        if self._stopped:
            return
        self._stopped = True
        self.httpd.shutdown()
        self.httpd.server_close()
        for conn in list(self.connections):
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=10)
        self.backend.close()
        if self.ranks is not None:
            self.ranks.close()

    def _retire(self) -> None:
        delay = RETIRE_S if "flush_400" in self.quirks else 0.0

        def done() -> None:
            with self.lock:
                self.running -= 1

        threading.Timer(delay, done).start() if delay else done()

    # -- endpoint logic (called from HTTP handler threads)
    def generate(self, body: dict) -> tuple[int, Any]:
        if self.restart_at and self.counts["/generate"] >= self.restart_at:
            self.restart_at = 0
            self.restart()
        with self.lock:
            if self.syncing:
                self.generate_during_sync += 1
            self.running += 1
        try:
            with self.control.reading():  # waits while paused or while an update runs
                return self._generate(body)
        finally:
            self._retire()

    def _generate(self, body: dict) -> tuple[int, Any]:
        if self.released:
            return HTTPStatus.SERVICE_UNAVAILABLE, {"error": {"message": "memory released"}}
        ids = body.get("input_ids")
        if not ids:
            return HTTPStatus.BAD_REQUEST, {"error": {"message": "input_ids is required"}}
        sp = dict(body.get("sampling_params") or {})
        allowed = SAMPLING_KEYS - ({"sampling_seed"} if "seed_refused" in self.quirks else set())
        unknown = set(sp) - allowed
        if unknown:
            return HTTPStatus.BAD_REQUEST, {"error": {"message": f"unexpected sampling_params {sorted(unknown)}"}}
        stop = sp.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        seed = sp.get("sampling_seed")
        if "seed_ignored" in self.quirks and not self.deterministic:
            seed = None
        try:
            sampling = SamplingParams(
                temperature=float(sp.get("temperature", 1.0)),
                top_p=float(sp.get("top_p", 1.0)),
                top_k=int(sp.get("top_k", -1)),
                max_new_tokens=int(sp.get("max_new_tokens", 128)),
                seed=seed,
            )
        except ValueError as exc:
            return HTTPStatus.BAD_REQUEST, {"error": {"message": str(exc)}}
        batched = isinstance(ids[0], list)
        prompts = ids if batched else [ids]
        rids = body.get("rid") if batched else [body.get("rid")]
        rids = [r or uuid.uuid4().hex for r in (rids if isinstance(rids, list) else [None] * len(prompts))]
        futs = [
            asyncio.run_coroutine_threadsafe(self.control.answer(p, sampling, stop, rid), self.loop)
            for p, rid in zip(prompts, rids)
        ]
        outs = [
            answer_json(self, p, f.result(), sp, bool(body.get("return_logprob")), sampling)
            for p, f in zip(prompts, futs)
        ]
        return HTTPStatus.OK, (outs if batched else outs[0])

    def flush(self) -> tuple[int, Any]:
        with self.lock:  # paused (retract, abort): the held requests are not running
            busy = self.running > 0 and "flush_400" in self.quirks and self.control.paused not in ("retract", "abort")
        if busy or self.control.flush_refused():
            return HTTPStatus.BAD_REQUEST, "Flush cache failed.\n"
        return HTTPStatus.OK, "Cache flushed.\n"

    def _after_update(self, body: dict, ok_message: str) -> tuple[int, Any]:
        """Version bump, then the flush an update asks for (default true), which fails the call
        while requests run (weight_updater.py `flush_cache_after_weight_update`)."""
        version = body.get("weight_version")
        self.weight_version = str(version) if version is not None else str(self.backend.weight_version)
        if body.get("flush_cache", True) and self.flush()[0] != HTTPStatus.OK:
            return HTTPStatus.BAD_REQUEST, {
                "success": False,
                "message": "Weights were updated, but the cache was not flushed "
                "because requests are still running or queued.",
            }
        return HTTPStatus.OK, {"success": True, "message": ok_message}

    def _refused(self) -> tuple[int, Any] | None:
        """Fault injection: the `refuse_update`-th weight update is refused (before any load)."""
        self.updates += 1
        if self.updates == self.refuse_update:
            return HTTPStatus.BAD_REQUEST, {
                "success": False,
                "message": f"stand-in refused weight update {self.updates} (--refuse-update)",
            }
        return None

    def _needs_session(self, what: str) -> tuple[int, Any] | None:
        if "session_required" in self.quirks and not self.session_open:
            return HTTPStatus.BAD_REQUEST, {
                "success": False,
                "message": f"{what} must run between begin_weight_update() and end_weight_update()",
            }
        return None

    def session(self, begin: bool) -> tuple[int, Any]:
        if "session_required" not in self.quirks:
            return HTTPStatus.NOT_FOUND, {"detail": "Not Found"}
        if begin == self.session_open:
            msg = (
                "a weight-update session is already open; call end_weight_update() first"
                if begin
                else "no weight-update session is open; call begin_weight_update() first"
            )
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": msg}
        self.session_open = begin
        with self.lock:
            self.syncing += 1 if begin else -1
        return HTTPStatus.OK, {"success": True, "message": "Success"}

    def update_from_disk(self, body: dict) -> tuple[int, Any]:
        refused = self._refused()
        if refused:
            return refused
        try:
            self.backend.update_weights_from_disk(body["model_path"])
        except Exception as exc:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{exc!r}", "num_paused_requests": 0}
        return self._after_update(body, "Succeeded to update model weights.")

    def update_from_tensor(self, body: dict) -> tuple[int, Any]:
        refused = self._needs_session("update_weights_from_tensor") or self._refused()
        if refused:
            return refused
        if body.get("load_format") not in (None, "direct"):
            return HTTPStatus.BAD_REQUEST, {
                "success": False,
                "message": f"load_format={body.get('load_format')!r} not supported by the stand-in",
            }
        payloads = body["serialized_named_tensors"]
        if len(payloads) < self.tp_size:  # TP rank r opens payloads[r]: IndexError kills the scheduler
            die(f"IndexError: {len(payloads)} tensor payloads for tp_size={self.tp_size} (tp_worker.py)")
        if self.ranks is not None:
            return self._update_in_rank_processes(body, payloads)
        try:
            named = [self._unpickle(payloads[rank]) for rank in range(self.tp_size)][0]  # each rank its own
            self.backend.update_weights(named)
        except Fatal:  # raised outside any try in the scheduler: the server goes down
            raise
        except Exception as exc:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{exc!r}"}
        return self._after_update(body, "Success")

    def _update_in_rank_processes(self, body: dict, payloads: list[str]) -> tuple[int, Any]:
        reports = self.ranks.update([base64.b64decode(p) for p in payloads[: self.tp_size]])
        for report in reports:
            if "fatal" in report:
                die(f"{report['fatal']} (patch_torch.py, raised in the scheduler's weight updater)")
        errors = [r["error"] for r in reports if "error" in r]
        if errors:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": "; ".join(errors)}
        if len(self.rank_reports) != len(reports):
            self.rank_reports = [dict(r, digests={}) for r in reports]
        for kept, report in zip(self.rank_reports, reports):  # a push is several buckets: merged
            kept["digests"].update(report["digests"])
            kept.update({k: v for k, v in report.items() if k != "digests"})
        return self._after_update(body, "Success")

    def _unpickle(self, payload: str) -> Any:
        """One TP rank opens its payload under SGLang's rules (`sglang_standin_cuda.py`: a CUDA
        handle naming a GPU this process cannot see is fatal)."""
        blob = base64.b64decode(payload)
        load = (lambda b: AllowListUnpickler(io.BytesIO(b)).load()) if "safe_unpickle" in self.quirks else pickle.loads
        return open_payload(blob, load, die)

    def init_group(self, body: dict) -> tuple[int, Any]:
        from stare_tir.rollout.backends.sglang import init_weight_update_group

        if self.tp_size > 1:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": "stand-in: one TP rank joins groups"}
        try:
            name = body.get("group_name", "weight_update_group")
            self.groups[name] = init_weight_update_group(
                body.get("backend", "nccl"),
                f"tcp://{body['master_address']}:{body['master_port']}",
                int(body["world_size"]),
                int(body["rank_offset"]),
                name,
                120.0,
            )
        except Exception as exc:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{exc!r}"}
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to initialize custom process group."}

    def update_from_distributed(self, body: dict) -> tuple[int, Any]:
        import torch

        from stare_tir.rollout.backends.sglang import broadcast_from_rank0

        refused = self._needs_session("update_weights_from_distributed") or self._refused()
        if refused:  # answered at once, before any broadcast: the client must not block
            return refused
        group = self.groups.get(body.get("group_name", "weight_update_group"))
        if group is None:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": "group not initialized"}
        try:
            named = []
            # NCCL receives into CUDA memory (SGLang: the model runner's device), gloo into host memory
            device = "cuda" if "nccl" in group.name().lower() else "cpu"  # name(): the backend's
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
                broadcast_from_rank0(group, t).wait()
                named.append((name, t))
            if self.ranks is not None:  # the GPU check's receiver: digests of what arrived, no HF load
                from sglang_standin_cuda import digest

                if not self.rank_reports:
                    self.rank_reports = [{"rank": 0, "digests": {}, "opened_on": [device]}]
                self.rank_reports[0]["digests"].update({n: digest(t) for n, t in named})
            else:
                self.backend.update_weights(named)
        except Exception as exc:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": f"{exc!r}"}
        return self._after_update(body, "Succeeded to update parameter online.")

    def destroy_group(self, body: dict) -> tuple[int, Any]:
        import torch.distributed as dist

        group = self.groups.pop(body.get("group_name", "weight_update_group"), None)
        if group is None:
            return HTTPStatus.BAD_REQUEST, {"success": False, "message": "no such group"}
        dist.destroy_process_group(group)
        return HTTPStatus.OK, {"success": True, "message": "Succeeded to destroy custom process group."}

    def memory(self, body: dict, release: bool) -> tuple[int, Any]:
        tags = set(body.get("tags") or ["weights", "kv_cache", "cuda_graph"])
        if release:
            with self.lock:
                busy = self.running
            if busy:  # `assert self.is_fully_idle()` in the scheduler loop: fatal
                die(f"AssertionError: release_memory_occupation with {busy} request(s) running (weight_updater.py)")
            self.released |= tags
        else:
            missing = tags - self.released
            if missing:  # `self.offload_tags.remove(tag)`: KeyError in the scheduler loop, fatal
                die(f"KeyError: resume_memory_occupation of {sorted(missing)}, not released (weight_updater.py)")
            self.released -= tags
        return HTTPStatus.OK, None

    def set_fault(self, body: dict) -> tuple[int, Any]:
        """(not SGLang) Fault injection at run time: {"refuse_update": K} refuses the K-th weight
        update request from now on (0: none); {"restart_after_generates": K} makes the K-th
        /generate from now on find the server restarted (see `restart`)."""
        if "refuse_update" in body:
            self.refuse_update, self.updates = int(body["refuse_update"]), 0
        if "restart_after_generates" in body:
            self.restart_at = self.counts["/generate"] + int(body["restart_after_generates"])
        if "token_delay_s" in body:
            self.control.token_delay_s = float(body["token_delay_s"])
        if "deterministic" in body:  # as --enable-deterministic-inference
            self.deterministic = bool(body["deterministic"])
        return HTTPStatus.OK, {"success": True}

    def pause(self, body: dict) -> tuple[int, Any]:
        try:
            return HTTPStatus.OK, self.control.pause(body, abort_only="pause_abort_only" in self.quirks)
        except ValueError as exc:  # msgspec validation of the mode
            return HTTPStatus.BAD_REQUEST, {"error": {"message": str(exc)}}

    def restart(self) -> None:
        """What a restarted SGLang process holds: its start-up weights (weight version "default"),
        no update group, no open session, nothing released. Done in place, at a /generate, so
        the moment falls inside a rollout phase, never inside a push."""
        self.backend.update_weights_from_disk(self.model_path)
        self.weight_version = "default"
        self.groups.clear()
        self.session_open = False
        self.released.clear()
        self.restarts += 1

    def stats(self) -> dict:
        return {
            "counts": dict(self.counts),
            "weight_version": self.weight_version,
            "released": sorted(self.released),
            "quirks": sorted(self.quirks),
            "generate_during_sync": self.generate_during_sync,
            "restarts": self.restarts,
            "pauses": dict(self.control.pauses),
            "interrupted": self.control.interrupted,
            "tokens_during_update": self.control.tokens_during_update,
            "rank_reports": self.rank_reports,
        }


def launch_standin(
    model_path: str,
    port: int = 0,
    timeout_s: float = 120.0,
    extra_args: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen, str]:
    """Start a stand-in server in a subprocess (`env`: added to its environment, e.g. the
    CUDA_VISIBLE_DEVICES a real server would be launched with); returns (process, base URL) once
    it serves."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--model-path", str(model_path), "--port", str(port)] + list(
        extra_args or []
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description="SGLang HTTP API stand-in on a Hugging Face model (CPU tests; loopback only)."
    )
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--max-batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: default)")
    ap.add_argument("--compat", default="0.5.23", choices=sorted(COMPAT))
    ap.add_argument("--quirks", default="", help=f"extra quirks, comma-separated: {sorted(QUIRKS)}")
    ap.add_argument("--enable-deterministic-inference", action="store_true")
    ap.add_argument("--tp-size", type=int, default=1, help="TP ranks reported (each opens its own tensor payload)")
    ap.add_argument("--refuse-update", type=int, default=0, help="refuse the K-th weight update (fault injection)")
    ap.add_argument("--keepalive-s", type=float, default=5.0, help="idle keep-alive timeout (uvicorn: 5 s)")
    ap.add_argument("--token-delay-s", type=float, default=0.0, help="seconds per emitted token of each request")
    ap.add_argument(
        "--start-delay-s",
        type=float,
        default=0.0,
        help="seconds before the port opens (a real server opens it once its model is loaded: minutes for 7B)",
    )
    ap.add_argument(
        "--rank-processes",
        action="store_true",
        help="each TP rank opens its tensor payload in its own process and keeps the weights (GPU check)",
    )
    args = ap.parse_args(argv)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    quirks = {q for q in args.quirks.split(",") if q}
    time.sleep(args.start_delay_s)  # "loading": connections are refused meanwhile
    server = StandinServer(
        args.model_path,
        args.host,
        args.port,
        args.max_batch_size,
        args.compat,
        quirks,
        args.enable_deterministic_inference,
        args.tp_size,
        args.refuse_update,
        args.keepalive_s,
        args.token_delay_s,
        args.rank_processes,
    )
    server.exit_on_fatal = True
    # SIGTERM keeps its default action (exit at once): a test helper has nothing to flush.
    print(f"STANDIN_READY port={server.port}", flush=True)
    try:
        server.httpd.serve_forever()
    finally:
        server.httpd.server_close()


if __name__ == "__main__":
    main()
