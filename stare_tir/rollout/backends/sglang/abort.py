"""Stopping a request whose caller went away (`algo.round_end=enough` cancels the trajectories it no
longer needs): SGLang's `/abort_request {"rid"}`, by the rid our /generate carried.

The server stops the request and frees its KV cache at once (0.5.23
python/sglang/srt/entrypoints/http_server.py `abort_request` -> managers/tokenizer_manager.py
`abort_request`; a rid it no longer holds is ignored), and the request's /generate answers with
what it had sampled, finish_reason "abort": its length is the waste we count. Closing the
connection alone is noticed only by the server's periodic disconnect check
(tokenizer_manager.py `_wait_one_response`, every few seconds).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from loguru import logger


@dataclass
class Aborts:
    """What the aborts of one backend achieved."""

    requests: int = 0  # /abort_request calls a server took
    tokens: int = 0  # tokens of the answers of cancelled calls, not yet taken (`take_tokens`)

    def count_answer(self, sent: asyncio.Future) -> None:
        """Add the tokens of a cancelled call's answer (cut short when aborted) to the waste."""
        if sent.cancelled() or sent.exception() is not None:
            return
        out = sent.result()
        if isinstance(out, dict):  # one entry per sampled token (output_ids may carry a prompt prefix)
            self.tokens += len((out.get("meta_info") or {}).get("output_token_logprobs") or [])

    def take_tokens(self) -> int:
        n, self.tokens = self.tokens, 0
        return n


async def abort_request(
    client: Any, targets: list[str], rid: str, sent: asyncio.Future, wait_s: float, aborts: Aborts
) -> None:
    """Tell each of `targets` (the request's server; behind a router, every worker: the rid names the
    request on whichever holds it) to abort `rid`, then read the answer of `sent` (its /generate)
    for its length. Best effort: a server that cannot be told (gone, or without the call: 404) is
    logged and its answer not waited for (nor, past `wait_s`, one that was told); an answer not
    read is dropped with its connection."""
    told = False
    for target in targets:
        try:
            await asyncio.wait_for(client.request("POST", target + "/abort_request", {"rid": rid}), wait_s)
            aborts.requests += 1
            told = True
        except Exception as exc:  # noqa: BLE001 - the caller is gone; nothing else to do
            logger.debug(f"{target}/abort_request {rid}: {exc!r}")
    done, _ = await asyncio.wait([sent], timeout=wait_s if told else 0)
    if done:
        aborts.count_answer(sent)
    else:
        sent.cancel()
        await asyncio.gather(sent, return_exceptions=True)
