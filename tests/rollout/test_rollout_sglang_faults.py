"""SGLang backend fault cases against the stand-in (tests/rollout/sglang_standin.py), plus the
layout rules as pure functions.

Each fault here is one a real deployment meets: a server with TP ranks the config did not
mention, a router given where workers belong, the K-th update refused, a server killed in the
middle of rollouts, a server restarted (serving its start-up weights), a resumed trainer against
a server that kept the dead trainer's update group, a release sent while a request retires. The
stand-in reproduces SGLang's reaction to each (its docstring cites the upstream file); the same
cases against the real server are in tests/sglang_real.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest
import torch

from stare_tir.rollout.backends._http import request_sync
from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.sglang import (
    ServerLayout,
    SGLangBackend,
    SGLangConfig,
    StaleWeightsError,
    check_layouts,
    free_port,
)
from stare_tir.rollout.backends.sglang.layout import master_address, read_layout

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)


# ------------------------------------------------------------------------ layout rules (no server)


def test_layouts_a_mode_cannot_serve_are_refused_naming_the_key():
    lay = lambda **kw: ServerLayout(url="http://h:1", **kw)  # noqa: E731
    assert check_layouts([lay(tp_size=2)], "tensor", 0, False)[0].tp_size == 2  # adopted
    with pytest.raises(ValueError, match=r"rollout.sglang.tp_size=1 but http://h:1 reports tp_size=2"):
        check_layouts([lay(tp_size=2)], "tensor", 1, False)
    for mode in ("tensor", "distributed"):
        with pytest.raises(ValueError, match=r"dp_size=2.*--dp-size 1.*weight_sync=disk"):
            check_layouts([lay(dp_size=2)], mode, 0, False)
        with pytest.raises(ValueError, match=r"pp_size=2.*weight_sync=disk"):
            check_layouts([lay(pp_size=2)], mode, 0, False)
    check_layouts([lay(dp_size=2, pp_size=2)], "disk", 0, False)  # every replica loads the file
    with pytest.raises(ValueError, match=r"nnodes=2.*CUDA IPC"):
        check_layouts([lay(nnodes=2)], "tensor", 0, False)
    check_layouts([lay(nnodes=2)], "distributed", 0, False)
    with pytest.raises(ValueError, match="--enable-memory-saver"):
        check_layouts([lay(memory_saver=False)], "tensor", 0, True)


def test_master_address_must_be_reachable_from_remote_servers():
    assert master_address("", ["http://127.0.0.1:30000"]) == "127.0.0.1"
    # 192.0.2.0/24 is TEST-NET-1: never an address of this machine
    with pytest.raises(ValueError, match=r"master_address=127.0.0.1 is a loopback address but http://192.0.2.7"):
        master_address("127.0.0.1", ["http://192.0.2.7:30000"])
    assert master_address("10.1.2.3", ["http://192.0.2.7:30000"]) == "10.1.2.3"


def test_a_router_as_control_url_is_refused():
    """sglang-router answers /list_workers (an SGLang server 404s it): weight updates sent to it
    would never reach the workers."""

    class Router(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            ok = self.path == "/list_workers"
            body = b'{"urls": ["http://127.0.0.1:1"]}' if ok else b"{}"
            self.send_response(HTTPStatus.OK if ok else HTTPStatus.NOT_FOUND)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Router)
    Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        with pytest.raises(ValueError, match=r"is a sglang-router.*rollout.sglang.weight_urls"):
            SGLangBackend([url]).layouts()
    finally:
        httpd.shutdown()


# ------------------------------------------------------------------------------ stand-in helpers


@contextlib.contextmanager
def _serve(standin, tiny_path, port: int = 0, **kw):
    """A stand-in in this process (starts in about a second; `shutdown` is its kill: every
    connection is cut). Fatal errors stop it and leave the reason in `.fatal`."""
    srv = standin.StandinServer(str(tiny_path), port=port, max_batch_size=16, **kw).start()
    try:
        yield srv
    finally:
        srv.shutdown()


def _state(path, noise: float = 0.0, seed: int = 0) -> dict[str, torch.Tensor]:
    from stare_tir.rollout.backends._weights import iter_checkpoint_tensors

    gen = torch.Generator().manual_seed(seed)
    return {n: t + noise * torch.randn(t.shape, generator=gen) for n, t in iter_checkpoint_tensors(str(path))}


def _prompt(tok) -> list[int]:
    s = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
    return tok(s, add_special_tokens=False)["input_ids"]


def _version(url: str) -> str:
    return request_sync("GET", url + "/get_model_info", timeout_s=10)["weight_version"]


# ------------------------------------------------------------------------------------ TP layout


def test_tp2_server_is_read_at_start_and_gets_one_payload_per_rank(standin, tiny_path):
    """A server with 2 TP ranks: the default config adopts tp_size=2 from /get_server_info and
    sends one payload per rank; a config saying tp_size=1 is refused before anything is sent.
    What the check prevents: one payload for two ranks kills the server (IndexError in the
    scheduler, tp_worker.py), here reproduced with a raw request."""
    from loguru import logger

    with _serve(standin, tiny_path, tp_size=2) as srv:
        be = SGLangBackend([srv.url], SGLangConfig(weight_sync="tensor", bucket_mb=0.1))
        lines: list[str] = []
        sink = logger.add(lambda m: lines.append(str(m)), level="INFO", format="{message}")
        try:
            assert [lay.tp_size for lay in be.layouts()] == [2]
        finally:
            logger.remove(sink)
        assert any(line.startswith(f"server {srv.url}: tp 2") for line in lines), lines  # adopted, and said
        be.update_weights(_state(tiny_path).items(), version="7")
        assert _version(srv.url) == "7"
        refused = SGLangBackend([srv.url], SGLangConfig(weight_sync="tensor", tp_size=1))
        with pytest.raises(ValueError, match=r"tp_size=1 but .* reports tp_size=2"):
            refused.update_weights(_state(tiny_path).items())
        assert _version(srv.url) == "7" and srv.fatal is None
        from stare_tir.rollout.backends.sglang import serialize_named_tensors

        request_sync("POST", srv.url + "/begin_weight_update", {})
        blob = serialize_named_tensors(list(_state(tiny_path).items())[:1])
        with pytest.raises(OSError):  # the connection closes without an answer: the server died
            request_sync("POST", srv.url + "/update_weights_from_tensor", {"serialized_named_tensors": [blob]})
        assert "IndexError" in srv.fatal


# ------------------------------------------------------------------------------- fault cases


@pytest.fixture(scope="module")
def process_server(standin, tiny_path):
    """A stand-in in its own process: one process cannot hold two ranks of one group (torch
    registers a group by its name), so distributed sync needs the server outside the test."""
    proc, url = standin.launch_standin(str(tiny_path), extra_args=["--threads", "1"])
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def _counts(url: str) -> dict:
    return request_sync("GET", url + "/standin_stats", timeout_s=10)["counts"]


@pytest.mark.parametrize("mode", ["tensor", "distributed"])
def test_a_refused_update_fails_fast_and_the_next_push_works(process_server, tiny_path, mode):
    """The K-th update request is refused: the push raises with the server's message at once
    (the broadcast is not waited for), the session is closed, and a new push succeeds."""
    url = process_server
    request_sync("POST", url + "/standin_fault", {"refuse_update": 2})
    before = _counts(url)
    cfg = SGLangConfig(weight_sync=mode, dist_backend="gloo", bucket_mb=0.05, timeout_s=60)
    be = SGLangBackend([url], cfg)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"stand-in refused weight update 2"):
        be.update_weights(_state(tiny_path).items(), version="1")
    assert time.monotonic() - t0 < 20
    be.update_weights(_state(tiny_path).items(), version="2")  # new group (distributed), new session
    assert _version(url) == "2"
    counts = {k: v - before.get(k, 0) for k, v in _counts(url).items()}
    assert counts["/begin_weight_update"] == counts["/end_weight_update"] == 2
    if mode == "distributed":
        assert counts["/init_weights_update_group"] == 2  # the broken group was replaced
    be.close()


def test_a_refused_broadcast_ends_on_the_sending_side_within_the_groups_timeout(process_server, tiny_path):
    """The server refuses a bucket and never joins its broadcast: the push raises at once, and the
    sender's thread, left inside the broadcast, ends within the group's timeout (timeout_s), with
    an aborted communicator where the backend can abort (NCCL), never blocking the trainer."""
    url = process_server
    request_sync("POST", url + "/standin_fault", {"refuse_update": 2})
    cfg = SGLangConfig(weight_sync="distributed", dist_backend="gloo", bucket_mb=0.05, timeout_s=8)
    be = SGLangBackend([url], cfg)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"stand-in refused weight update 2"):
        be.update_weights(_state(tiny_path).items(), version="1")
    assert time.monotonic() - t0 < 8
    sender = be._group.sender
    sender.thread.join(timeout=30)
    assert not sender.thread.is_alive() and time.monotonic() - t0 < 30  # bounded by the group's 8 s
    assert sender.error is not None  # the broadcast failed (timed out or aborted), it did not complete
    request_sync("POST", url + "/standin_fault", {"refuse_update": 0})
    be.update_weights(_state(tiny_path).items(), version="2")  # a new group works
    assert _version(url) == "2"
    be.close()


class NcclShaped:
    """The pushing side of an NCCL weight-update group as the push sees it, over a real gloo group.

    `broadcast` enqueues the transfer on a "stream" (one worker thread) and returns a work whose
    `wait()` returns at once: NCCL's only makes the caller's CUDA stream wait
    (ProcessGroupNCCL.cpp `WorkNCCL::wait` -> `synchronizeStream`), so the push's sender thread
    ends before anything was sent. `synchronize()` is what the trainer's next GPU operation does
    (it waits for that stream); `abort()` fails what is enqueued, as `ncclCommAbort` does."""

    def __init__(self, pg) -> None:
        import queue

        self.pg, self.aborts = pg, 0
        self.pending: list = []
        self.aborted = threading.Event()
        self.stream: queue.Queue = queue.Queue()
        Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            tensors, opts, done = self.stream.get()
            if not self.aborted.is_set():
                with contextlib.suppress(Exception):  # gloo's timeout, once the receiver left
                    self.pg.broadcast(tensors, opts).wait()
            done.set()

    def broadcast(self, tensors, opts):
        done = threading.Event()
        self.pending.append(done)
        self.stream.put((tensors, opts, done))

        class Work:
            wait = staticmethod(lambda *a: True)  # returns at once, transfer or not
            is_completed = staticmethod(done.is_set)

        return Work()

    def abort(self) -> None:
        self.aborts += 1
        self.aborted.set()
        for done in self.pending:
            done.set()

    def synchronize(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for done in self.pending:
            done.wait(max(0.0, deadline - time.monotonic()))


def test_an_nccl_shaped_refusal_aborts_the_communicator_and_ends_the_run_in_seconds(
    process_server, tiny_path, monkeypatch
):
    """Bucket 2 refused on a group whose `wait()` returns at once (NCCL's): the sender thread has
    already returned when the refusal comes, and the broadcast it enqueued would hold the trainer's
    next GPU operation until the group's timeout (then the watchdog's abort). The push aborts the
    communicator anyway: the run ends with the server's message within seconds."""
    import stare_tir.rollout.backends.sglang.push as push_mod

    made: list[NcclShaped] = []
    real_init = push_mod.init_weight_update_group

    def nccl_shaped(*args, **kw):
        made.append(NcclShaped(real_init(*args, **kw)))
        return made[-1]

    monkeypatch.setattr(push_mod, "init_weight_update_group", nccl_shaped)
    url = process_server
    request_sync("POST", url + "/standin_fault", {"refuse_update": 2})
    cfg = SGLangConfig(weight_sync="distributed", dist_backend="gloo", bucket_mb=0.05, timeout_s=30)
    be = SGLangBackend([url], cfg)
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"stand-in refused weight update 2"):
            be.update_weights(_state(tiny_path).items(), version="1")
        assert len(made) == 1 and not be._group.sender.thread.is_alive()  # nothing left to see alive
        assert made[0].aborts == 1, "the enqueued broadcast was left to the group's timeout"
        made[0].synchronize(timeout_s=cfg.timeout_s + 5)  # the trainer's next GPU operation
        assert time.monotonic() - t0 < 5
    finally:
        request_sync("POST", url + "/standin_fault", {"refuse_update": 0})
        be.close()


def test_restarted_server_is_set_aside_then_resynced(standin, tiny_path, tiny_tok):
    """A server restarted mid-run serves its start-up weights (version "default"): its answers
    are discarded and re-run on the other server, it is reported stale, and after the next push
    it serves again. The same backend object lives through the restart, as in a run."""
    with _serve(standin, tiny_path) as a, _serve(standin, tiny_path) as b:
        # least-loaded: 4 of the 8 identical prompts per server (affinity would pile them on one)
        be = SGLangBackend([a.url, b.url], SGLangConfig(weight_sync="tensor", routing="least_loaded"))
        state = _state(tiny_path, noise=0.05)
        be.update_weights(state.items(), version="3")
        prompt = _prompt(tiny_tok)

        async def many():
            return await asyncio.gather(*(be.generate(prompt, GREEDY, []) for _ in range(8)))

        asyncio.run(many())  # keep-alive connections to both servers are open now
        a.shutdown()
        with _serve(standin, tiny_path, port=a.port) as a2:
            assert _version(a2.url) == "default"
            gens = asyncio.run(many())
            assert all(g.weight_version == "3" for g in gens)  # no answer from the old weights kept
            assert be.stale_answers >= 1 and be.stale_servers() == [a2.url]
            assert a2.counts["/generate"] >= 1 and b.counts["/generate"] >= 12  # 4 + the 8 re-run or sent there
            be.update_weights(state.items(), version="3")  # the trainer's re-push
            assert be.stale_servers() == [] and _version(a2.url) == "3"
            before = a2.counts["/generate"]
            asyncio.run(many())
            assert a2.counts["/generate"] > before  # used again


def test_all_servers_stale_fails_the_request_not_the_process(standin, tiny_path, tiny_tok):
    with _serve(standin, tiny_path) as srv:
        be = SGLangBackend([srv.url])
        be.expect_version("9")  # another rank pushed 9; this server still serves "default"
        with pytest.raises(StaleWeightsError, match=r"weight version 'default', expected '9'"):
            asyncio.run(be.generate(_prompt(tiny_tok), GREEDY, []))
        assert be.stale_servers() == [srv.url]


def test_server_killed_mid_rollout(standin, tiny_path, tiny_tok):
    """Requests in flight on a killed server (SIGKILL) fail (never re-run: they may have been
    generating); new requests go to the live server; the next push names the dead server at once."""
    proc, url_a = standin.launch_standin(str(tiny_path), extra_args=["--threads", "1"])
    try:
        with _serve(standin, tiny_path) as b:
            be = SGLangBackend([url_a, b.url], SGLangConfig(weight_sync="tensor", timeout_s=60))
            prompt = _prompt(tiny_tok)
            long = SamplingParams(temperature=1.0, max_new_tokens=1500)

            async def rollout():
                tasks = [asyncio.ensure_future(be.generate(prompt, long, [])) for _ in range(4)]
                await asyncio.sleep(0.5)
                proc.kill()
                done = await asyncio.gather(*tasks, return_exceptions=True)
                after = await asyncio.gather(*(be.generate(prompt, GREEDY, []) for _ in range(4)))
                return done, after

            done, after = asyncio.run(rollout())
            assert any(isinstance(r, ConnectionError) for r in done), done  # lost, and reported
            assert len(after) == 4  # routed around the dead server
            t0 = time.monotonic()
            with pytest.raises(ConnectionError, match=url_a):
                be.update_weights(_state(tiny_path).items())
            assert time.monotonic() - t0 < 30
    finally:
        proc.kill()
        proc.wait(timeout=30)


def test_resume_against_a_server_that_kept_the_old_group(process_server, tiny_path):
    """A trainer killed with its group open leaves the group in the server (0.5.1 cannot even
    destroy it): a new trainer's group has its own name, and its push works."""
    url = process_server
    cfg = SGLangConfig(weight_sync="distributed", dist_backend="gloo", timeout_s=60)
    dead = SGLangBackend([url], cfg)
    dead.update_weights(_state(tiny_path).items(), version="1")
    old_name = dead._group.name  # never destroyed: the trainer "died"
    with pytest.raises(RuntimeError, match="init_weights_update_group"):  # what a fixed name met
        _init_group_named(url, old_name)
    fresh = SGLangBackend([url], cfg)
    fresh.update_weights(_state(tiny_path, noise=0.05).items(), version="2")
    assert _version(url) == "2" and fresh._group.name != old_name
    fresh.close()


def _init_group_named(url: str, name: str) -> None:
    """/init_weights_update_group with a given name (refused when the server holds it: torch's
    c10d registry)."""
    from stare_tir.rollout.backends.sglang import Posts

    posts = Posts(
        [url],
        "/init_weights_update_group",
        [
            {
                "master_address": "127.0.0.1",
                "master_port": free_port(),
                "rank_offset": 1,
                "world_size": 2,
                "group_name": name,
                "backend": "gloo",
            }
        ],
        30,
    )
    posts.join()


def test_release_waits_for_the_server_to_be_idle(standin, tiny_path, tiny_tok):
    """Right after a generate the server still retires the request: a release then kills it (an
    assertion in the scheduler loop). The backend flushes first (refused until idle), so its
    release lands on an idle server; a push resumes the weights, then everything else."""
    with _serve(standin, tiny_path) as srv:
        url = srv.url
        be = SGLangBackend([url], SGLangConfig(weight_sync="tensor", colocate=True))
        prompt = _prompt(tiny_tok)
        asyncio.run(be.generate(prompt, GREEDY, []))
        be.release_memory_occupation()
        assert sorted(srv.released) == ["cuda_graph", "kv_cache", "weights"]
        assert be.released == {url: ["cuda_graph", "kv_cache", "weights"]}
        be.update_weights(_state(tiny_path).items(), version="1")
        assert srv.released == set() and be.released == {}
        be.resume_memory_occupation()  # nothing released: nothing sent (a resume would kill it)
        assert srv.fatal is None
        assert asyncio.run(be.generate(prompt, GREEDY, [])).weight_version == "1"
        with pytest.raises(OSError):  # the same release without the flush: the server dies
            request_sync("POST", url + "/release_memory_occupation", {"tags": ["kv_cache"]})
        assert "is_fully_idle" in srv.fatal or "running" in srv.fatal


def test_read_layout_of_a_server_without_server_info():
    """Servers that 404 /get_server_info count as one TP rank (what every server before the
    endpoint ran)."""

    class Old(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            self.send_response(HTTPStatus.NOT_FOUND)
            self.send_header("Content-Length", "0")
            self.end_headers()

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Old)
    Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        lay = read_layout(f"http://127.0.0.1:{httpd.server_address[1]}", 10)
        assert (lay.tp_size, lay.dp_size, lay.pp_size) == (1, 1, 1)
    finally:
        httpd.shutdown()


def test_keepalive_shorter_than_the_servers_never_writes_onto_a_closing_connection():
    """A server closes an idle keep-alive connection after its timeout (uvicorn in SGLang: 5 s);
    a request written onto it just then fails after it was sent (never retried: a lost
    trajectory). This server closes any connection whose next request comes after 1 s idle; a
    client keeping connections for less than that opens a new one instead."""
    import socket as socketlib

    from stare_tir.rollout.backends._http import AsyncJSONClient

    listener = socketlib.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve(conn) -> None:
        last = None
        with conn:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                if last is not None and time.monotonic() - last > 1.0:
                    return  # the server's idle timer fired as the request came in: closed, no answer
                body = b'{"ok": true}'
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n" + body)
                last = time.monotonic()

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            Thread(target=serve, args=(conn,), daemon=True).start()

    Thread(target=accept, daemon=True).start()
    url = f"http://127.0.0.1:{port}/generate"

    async def two_requests(keepalive_s: float):
        client = AsyncJSONClient(keepalive_s=keepalive_s)
        try:
            await client.request("POST", url, {})
            await asyncio.sleep(1.3)
            return await client.request("POST", url, {})
        finally:
            await client.close()

    try:
        with pytest.raises(ConnectionError, match="after the request was sent"):
            asyncio.run(two_requests(keepalive_s=15.0))  # aiohttp's default: reuses the closing one
        assert asyncio.run(two_requests(keepalive_s=0.5)) == {"ok": True}
        assert SGLangConfig().keepalive_s < 5.0  # below SGLang's SGLANG_TIMEOUT_KEEP_ALIVE default
    finally:
        listener.close()


# ------------------------------------------------------------------- devices a server can see


@pytest.mark.parametrize(
    ("visible", "sees"),
    [("GPU-aaaa-1111", False), ("GPU-bbbb-2222", True), ("1", True), ("0,GPU-aaaa-1111", False), ("", True)],
)
def test_which_gpus_a_visible_devices_list_lets_a_server_open(visible, sees):
    from stare_tir.rollout.backends.sglang.devices import sees_device

    physical = lambda: {"0": "GPU-aaaa-1111", "1": "GPU-bbbb-2222"}  # noqa: E731 - what nvidia-smi lists
    assert sees_device(visible, "bbbb-2222", physical) is sees  # torch's UUID has no "GPU-" prefix
    assert sees_device("1", "bbbb-2222", lambda: None) is None  # no mapping: cannot tell


def test_tensor_sync_is_refused_when_a_server_cannot_see_the_trainers_gpu(standin, tiny_path, monkeypatch):
    """The server process runs with its own CUDA_VISIBLE_DEVICES (the per-server launch); a GPU
    outside it would kill the server at the first IPC handle (patch_torch.py raises on the
    unknown UUID inside the scheduler). Through the real backend: refused with one line at the
    push's first CUDA tensor, before any /update_weights_from_tensor reaches the server (CUDA
    stands in by a flag on CPU; the server's environment is read from /proc)."""
    import stare_tir.rollout.backends.sglang.backend as backend_mod

    proc, url = standin.launch_standin(
        str(tiny_path), extra_args=["--threads", "1"], env={"CUDA_VISIBLE_DEVICES": "GPU-aaaa-1111"}
    )
    try:

        class FakeCuda:
            is_cuda = True

        monkeypatch.setattr(backend_mod, "device_uuid", lambda t: "GPU-cccc-3333")
        be = SGLangBackend([url], SGLangConfig(weight_sync="tensor"))
        before = _counts(url).get("/update_weights_from_tensor", 0)
        with pytest.raises(ValueError) as err:
            be.update_weights(iter([("w", FakeCuda())]), version="1")
        msg = str(err.value)
        assert "\n" not in msg and url in msg and "CUDA_VISIBLE_DEVICES=GPU-aaaa-1111" in msg
        assert "cannot see the trainer's GPU GPU-cccc-3333" in msg and "weight_sync=distributed" in msg
        assert _counts(url).get("/update_weights_from_tensor", 0) == before
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_a_handle_naming_a_gpu_the_server_cannot_see_kills_it(standin, tiny_path):
    """What the device check prevents, reproduced: the stand-in opens payloads under SGLang's rules
    (a UUID device is looked up among the GPUs it sees, patch_torch.py), and an unknown UUID is
    fatal. A hand-made handle stands in for a CUDA tensor (none exists on CPU)."""
    import base64
    import pickle

    from torch.multiprocessing import reductions

    class Handle:  # what torch's reduce_tensor writes for a CUDA tensor, the device as a UUID
        def __reduce__(self):
            return reductions.rebuild_cuda_tensor, (None,) * 6 + ("GPU-0000dead",) + (None,) * 6

    with _serve(standin, tiny_path) as srv:
        request_sync("POST", srv.url + "/begin_weight_update", {})
        blob = base64.b64encode(pickle.dumps([("w", Handle())])).decode()
        with pytest.raises(OSError):  # the connection closes without an answer: the server died
            request_sync("POST", srv.url + "/update_weights_from_tensor", {"serialized_named_tensors": [blob]})
        assert "Invalid device_uuid=GPU-0000dead" in srv.fatal
