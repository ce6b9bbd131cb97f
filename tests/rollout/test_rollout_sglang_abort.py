"""A cancelled SGLang generate() call aborts its request on the server, by the rid it sent.

A small aiohttp server holds every /generate until /abort_request names its rid (as SGLang 0.5.23
does: entrypoints/http_server.py `abort_request` ends the request, whose /generate then answers
with finish_reason "abort"). The real server is checked in tests/sglang_real/.
"""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig


class HoldingServer:
    """/generate waits for /abort_request of its rid (or `hold_s`); `abort_status` 404 plays a
    server without the call."""

    def __init__(self, abort_status: int = 200, hold_s: float = 30.0) -> None:
        self.generated: list[str] = []
        self.aborted: list[str] = []
        self.abort_status = abort_status
        self.hold_s = hold_s
        self.events: dict[str, asyncio.Event] = {}
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def generate(self, request: web.Request) -> web.Response:
        body = await request.json()
        rid = body["rid"]
        self.generated.append(rid)
        ev = self.events.setdefault(rid, asyncio.Event())
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ev.wait(), self.hold_s)
        finish = {"type": "abort", "message": "Abort"} if ev.is_set() else {"type": "length", "length": 1}
        meta = {"finish_reason": finish, "output_token_logprobs": [[-0.1, 5, None]]}
        return web.json_response({"text": "x", "output_ids": [5], "meta_info": meta})

    async def abort(self, request: web.Request) -> web.Response:
        rid = (await request.json())["rid"]
        self.aborted.append(rid)
        if self.abort_status != 200:
            return web.json_response({"detail": "Not Found"}, status=self.abort_status)
        self.events.setdefault(rid, asyncio.Event()).set()
        return web.Response(status=200)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        app.router.add_post("/abort_request", self.abort)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        for ev in self.events.values():
            ev.set()
        await self.runner.cleanup()


async def _cancel_one(server: HoldingServer) -> SGLangBackend:
    await server.start()
    backend = SGLangBackend([server.url], SGLangConfig(connect_timeout_s=5.0))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=100)
    try:
        task = asyncio.ensure_future(backend.generate([1, 2, 3], sampling, []))
        while not server.generated:
            await asyncio.sleep(0.01)
        task.cancel()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        assert task.cancelled() and loop.time() - t0 < 2.0  # the abort is sent, not waited out
        second = asyncio.ensure_future(backend.generate([1, 2, 3], sampling, []))
        while len(server.generated) < 2:
            await asyncio.sleep(0.01)
        second.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await second
    finally:
        await backend.aclose()
        await server.stop()
    return backend


def test_a_cancelled_generate_aborts_its_request_by_rid():
    server = HoldingServer()
    backend = asyncio.run(_cancel_one(server))
    assert server.aborted == server.generated  # each request aborted by the rid it was sent with
    assert len(set(server.generated)) == 2  # a fresh rid per request
    assert backend.aborted_requests == 2
    assert backend.take_aborted_tokens() == 2 and backend.take_aborted_tokens() == 0  # one token each, taken once


def test_a_server_without_abort_request_is_only_logged():
    server = HoldingServer(abort_status=404)
    backend = asyncio.run(_cancel_one(server))  # the caller still sees its cancellation, nothing else
    assert server.aborted == server.generated and backend.aborted_requests == 0
    assert backend.take_aborted_tokens() == 0  # its answers were not waited for
