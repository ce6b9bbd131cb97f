"""A small HTTP/1.1 JSON client on the standard library: asyncio for the data path, blocking for
control calls.

Why not a third-party client: the rollout path only needs `POST json -> json` to a few servers on a
trusted network, with keep-alive and hundreds of requests in flight; asyncio streams do that in a
page, and the CPU venv stays free of extra dependencies. Plain http:// only (SGLang servers and
sglang-router speak it inside a cluster).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections import defaultdict
from typing import Any, Optional
from urllib.parse import urlsplit


class HTTPError(RuntimeError):
    """A non-2xx answer; `status` and `body` (decoded text) say what the server said."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {body[:500]}")
        self.status, self.body = status, body


def _split(url: str) -> tuple[str, int, str]:
    parts = urlsplit(url)
    if parts.scheme != "http":
        raise ValueError(f"{url}: only http:// URLs are supported")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return parts.hostname or "127.0.0.1", parts.port or 80, path


class AsyncJSONClient:
    """Keep-alive connection pool per (host, port), bound to the event loop that first uses it."""

    def __init__(self, timeout_s: float = 600.0, max_idle_per_host: int = 64) -> None:
        self.timeout_s = timeout_s
        self.max_idle = max_idle_per_host
        self._idle: dict[tuple[str, int], list] = defaultdict(list)
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def _reset_if_new_loop(self) -> None:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections of another loop cannot be used here
            self._idle.clear()
            self._loop = loop

    async def request(self, method: str, url: str, payload: Any = None) -> Any:
        """Send `payload` as JSON; return the decoded JSON answer (or text if not JSON)."""
        self._reset_if_new_loop()
        host, port, path = _split(url)
        body = b"" if payload is None else json.dumps(payload).encode()
        head = (f"{method} {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
                f"Connection: keep-alive\r\n\r\n").encode()
        for attempt in (0, 1):
            reused = bool(self._idle[(host, port)])
            if reused:
                reader, writer = self._idle[(host, port)].pop()
            else:
                reader, writer = await asyncio.wait_for(
                    asyncio.open_connection(host, port), timeout=self.timeout_s)
            try:
                writer.write(head + body)
                await writer.drain()
                status, headers, data = await asyncio.wait_for(
                    self._read_response(reader), timeout=self.timeout_s)
            except (ConnectionError, asyncio.IncompleteReadError) as exc:
                writer.close()
                if reused and attempt == 0:  # the server closed an idle connection: retry fresh
                    continue
                raise ConnectionError(f"{url}: {exc!r}") from exc
            except BaseException:
                writer.close()
                raise
            if headers.get("connection", "").lower() == "close" or \
                    len(self._idle[(host, port)]) >= self.max_idle:
                writer.close()
            else:
                self._idle[(host, port)].append((reader, writer))
            return _decode(url, status, data)
        raise AssertionError("unreachable")

    @staticmethod
    async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict, bytes]:
        status_line = await reader.readuntil(b"\r\n")
        status = int(status_line.split()[1])
        headers: dict[str, str] = {}
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            key, _, value = line.decode("latin-1").partition(":")
            headers[key.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    break
                chunks.append(await reader.readexactly(size))
                await reader.readexactly(2)
            return status, headers, b"".join(chunks)
        length = int(headers.get("content-length", "0"))
        return status, headers, await reader.readexactly(length)

    async def close(self) -> None:
        for conns in self._idle.values():
            for _, writer in conns:
                writer.close()
        self._idle.clear()


def _decode(url: str, status: int, data: bytes) -> Any:
    text = data.decode("utf-8", errors="replace")
    if not 200 <= status < 300:
        raise HTTPError(url, status, text)
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return text


def request_sync(method: str, url: str, payload: Any = None, timeout_s: float = 600.0) -> Any:
    """Blocking JSON request for control calls (health, weight updates, memory release)."""
    _split(url)  # validates the scheme
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    # No proxies: rollout servers live on the cluster network (an http_proxy would misroute).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return _decode(url, resp.status, resp.read())
    except urllib.error.HTTPError as exc:
        raise HTTPError(url, exc.code, exc.read().decode("utf-8", errors="replace")) from None
