"""JSON over HTTP for the SGLang backend: aiohttp for the data path, blocking calls for control.

Why aiohttp: it keeps connections alive across hundreds of concurrent `/generate` calls, tells a
failed connect (nothing was sent: safe to try another server) apart from a failure after the
request went out (the server may be generating: never re-sent), and SGLang depends on it anyway.

Timeouts: a connect timeout always; on the data path a read timeout far above any real turn (the
SGLang backend's `generate_timeout_s`). A long turn under load is slow, not lost: a 600 s total
timeout with a resubmit dropped exactly the long answers and biased every batch toward short ones.
A dead server closes the connection; a paused or hung one is ended by the read timeout.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import urlsplit

import aiohttp


class HTTPError(RuntimeError):
    """A non-2xx answer; `status` and `body` (decoded text) say what the server said."""

    def __init__(self, url: str, status: int, body: str) -> None:
        super().__init__(f"{url}: HTTP {status}: {body[:500]}")
        self.status, self.body = status, body


class NotSentError(ConnectionError):
    """The connection failed before the request was sent: retrying elsewhere cannot duplicate
    work."""


def check_url(url: str) -> None:
    if urlsplit(url).scheme != "http":
        raise ValueError(
            f"{url}: only http:// URLs are supported (SGLang servers and "
            "sglang-router speak plain HTTP inside a cluster)"
        )


class AsyncJSONClient:
    """One aiohttp session (keep-alive pool) per event loop; the loop that first uses it owns it.

    connect_timeout_s bounds opening a connection; read_timeout_s (None: unbounded) bounds the
    wait for an answer; max_connections caps open sockets (more requests wait for one);
    keepalive_s is how long an idle connection is reused (keep it below the server's own).
    """

    def __init__(
        self,
        connect_timeout_s: float = 30.0,
        read_timeout_s: float | None = None,
        max_connections: int = 256,
        keepalive_s: float = 4.0,
    ) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self.max_connections = max_connections
        self.keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_for_loop(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or loop is not self._loop or self._session.closed:
            # A session is bound to its loop; an old loop's connections cannot be used (or
            # closed: that needs the old loop) here. An owner that keeps one loop, like the
            # rollout engine, closes the session on it (`close`).
            timeout = aiohttp.ClientTimeout(total=None, connect=self.connect_timeout_s, sock_read=self.read_timeout_s)
            self._session = aiohttp.ClientSession(
                timeout=timeout,
                trust_env=False,  # no http_proxy: servers are on the cluster net
                connector=aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=self.keepalive_s),
            )
            self._loop = loop
        return self._session

    async def request(self, method: str, url: str, payload: Any = None, headers: dict[str, str] | None = None) -> Any:
        """Send `payload` as JSON (with `headers`); return the decoded JSON answer (or text if not JSON).

        Raises NotSentError when no connection could be made, HTTPError for a non-2xx answer,
        ConnectionError when the connection broke after the request was sent.
        """
        check_url(url)
        session = self._session_for_loop()
        try:
            async with session.request(method, url, json=payload, headers=headers) as resp:
                data = await resp.read()
                return _decode(url, resp.status, data)
        except (aiohttp.ClientConnectorError, asyncio.TimeoutError) as exc:
            if isinstance(exc, aiohttp.ClientConnectorError) or _is_connect_timeout(exc):
                raise NotSentError(f"{url}: cannot connect: {exc!r}") from exc
            raise TimeoutError(f"{url}: no answer within {self.read_timeout_s}s") from exc
        except aiohttp.ClientError as exc:
            raise ConnectionError(f"{url}: connection lost after the request was sent: {exc!r}") from exc

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None


def _is_connect_timeout(exc: BaseException) -> bool:
    return isinstance(exc, aiohttp.ConnectionTimeoutError) if hasattr(aiohttp, "ConnectionTimeoutError") else False


def _decode(url: str, status: int, data: bytes) -> Any:
    text = data.decode("utf-8", errors="replace")
    if not 200 <= status < 300:
        raise HTTPError(url, status, text)
    try:
        return json.loads(text) if text else None
    except json.JSONDecodeError:
        return text


def request_sync(method: str, url: str, payload: Any = None, timeout_s: float | None = 600.0) -> Any:
    """Blocking JSON request for control calls (health, weight updates, memory release); these
    run in the trainer's thread between rollout phases, or in helper threads during a broadcast."""
    check_url(url)
    data = None if payload is None else json.dumps(payload).encode()
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    # No proxies: rollout servers live on the cluster network (an http_proxy would misroute).
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(req, timeout=timeout_s) as resp:
            return _decode(url, resp.status, resp.read())
    except urllib.error.HTTPError as exc:
        raise HTTPError(url, exc.code, exc.read().decode("utf-8", errors="replace")) from None
    except urllib.error.URLError as exc:  # the message must say which server it was
        raise ConnectionError(f"{method} {url}: {exc.reason}") from exc
    except (ConnectionError, TimeoutError) as exc:
        raise type(exc)(f"{method} {url}: {exc}") from exc
