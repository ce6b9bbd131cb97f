"""SGLang backends: token ids in and out, over HTTP (one or more servers) or in process.

    config.py          SGLangConfig (`rollout.sglang.*`), what each setting is for
    wire.py            /generate: sampling params out, a `Generation` in (ids, logprobs, finish, versions)
    abort.py           /abort_request for a cancelled call, and the length of what it had sampled
    backend.py         SGLangBackend: routing, retries, stale-weight detection, memory, the push entry
    layout.py          what each server is (/server_info): TP/DP/PP sizes, router, locality
    push.py            disk / tensor / distributed pushes, the begin/end session, the update group
    relay.py           colocated tensor sync fed by every trainer rank (each TP rank's payload from its GPU)
    devices.py         which GPUs a local server sees, and which GPU each of its TP ranks runs on
    engine_backend.py  SGLangEngineBackend: an in-process sglang.Engine (GPU)

Data path (`/generate`, SGLang's native API, not the OpenAI one, so no chat template or
re-tokenization happens server-side):

    request  {"rid": "<ours, fresh per attempt>", "input_ids": [...], "return_logprob": true,
              "sampling_params": {"temperature", "top_p", "top_k", "max_new_tokens",
                                  "stop": [...], "no_stop_trim": true,
                                  "skip_special_tokens": false, ["sampling_seed"]}}
    response {"text", "output_ids": [...],
              "meta_info": {"finish_reason": {"type": "stop"|"length"|"abort", "matched": ...},
                            "output_token_logprobs": [[logprob, token_id, text|null], ...],
                            "weight_version": "...", "weight_versions": [{version, start, end}]}}

A cancelled call (the caller stopped waiting: algo.round_end=enough) POSTs `/abort_request
{"rid"}` to its server, which ends the request and frees its cache (`abort.py`).

Sampled ids and logprobs come from `meta_info.output_token_logprobs` (one entry per sampled
token, the EOS / stop-completing token included). `output_ids` is only cross-checked: SGLang
0.5.0-0.5.4 prefixed it with up to 5 prompt ids (the detokenizer returned its incremental
`decode_ids`, python/sglang/srt/managers/detokenizer_manager.py; upstream issues 10896, 17240).
The finish is classified by `base.classify_finish` from the last token, not only from the
server's reason: older servers checked the token budget before EOS and stop strings
(schedule_batch.py `check_finished`), and a `matched` string that is not one of the request's
stops (e.g. "NaN happened" for an invalid token) fails the call instead of counting as a stop.
SGLang reports logprobs after temperature scaling (unless SGLANG_RETURN_ORIGINAL_LOGPROB=1) but
before top-p/top-k renormalisation; with RL's defaults (top_p=1, top_k=-1) that is the sampling
distribution.

Seeds: `sampling_seed` is used only by servers started with --enable-deterministic-inference
(python/sglang/srt/sampling/sampling_batch_info.py) and is refused by servers that predate it,
so it is sent only with `send_seed`, reduced below 2**31.

Weight versions. Every push carries a `weight_version` (the trainer's version of the weights;
0.5.23 stores it and stamps every answer with it: managers/tokenizer_control_mixin.py, utils/
weight_versions.py), and every `Generation` carries the versions that sampled its tokens. An
answer stamped with another version than the last push comes from other weights (a server that
restarted serves its start-up weights, "default"): it is discarded, counted, and re-run on
another server; that server is left out until the trainer pushes again (`stale_servers`).

Weight sync (`SGLangConfig.weight_sync`). The trainer calls it on ONE process (rank 0) while the
other ranks wait (colocated tensor sync: while they feed it, below), after every rank has
finished its rollouts: no generation runs during a sync.
Each server's layout is read from `/server_info` before the first push (tp_size adopted or
checked, layouts a mode cannot serve refused: `layout.py`).
- "disk": the learner's tensors are written to `sync_dir/model.safetensors` (temp name, then an
  atomic rename; one checkpoint at most) and every server POSTs `/update_weights_from_disk`.
  `sync_dir` must be readable by every server (a shared file system across nodes).
- "tensor" (colocated: same node): `/update_weights_from_tensor` with `serialized_named_tensors`
  = one payload per TP rank (CUDA tensors as IPC handles naming the GPU by UUID, serialized per
  rank; CPU tensors by value). Refused for servers on another node. Colocated with several
  trainer ranks, every rank takes part (`relay.py`, as SGLang's srt/weight_sync/utils.py
  `update_weights` does): each serializes the bucket on its own GPU, rank 0 gathers the payloads
  and gives TP rank r of each server the one from the trainer rank on that TP rank's GPU
  (base_gpu_id + r * gpu_id_step of the server's CUDA_VISIBLE_DEVICES, matched by UUID). When a
  TP rank's GPU hosts no trainer rank, or cannot be read, rank 0 serializes every payload, as
  with one rank, and logs why once.
- "distributed" (separate GPUs): `/init_weights_update_group` (this process is rank 0 of a group
  of 1 + the servers' TP ranks, under a unique name), then per bucket
  `/update_weights_from_distributed` while rank 0 broadcasts each tensor; a refused request stops
  the broadcast at once (no hang). A broken group, or a server that restarted, gets a new group.
tensor and distributed run inside `/begin_weight_update` ... `/end_weight_update` on servers that
have it (0.5.23 refuses them otherwise: managers/scheduler_components/weight_updater.py); a 404
marks an older server that needs no session. Updates are sent with flush_cache=false and the
cache is flushed afterwards with `/flush_cache`, retried while it answers 400 (0.5.23 refuses a
flush while a request is still being retired, and then fails the whole update).
Colocated (`colocate`): `release_memory_occupation` frees weights, KV cache and CUDA graphs once
the servers are idle (flushed); a push resumes the weights first and the rest after it.

Routing: each request goes to the server with the fewest requests in flight. Behind a
sglang-router give the router as the only URL and list the workers in `weight_urls`: control
calls (weights, flush, memory) must reach every worker, never the router (a router given as a
control URL is detected and refused). A connect failure (nothing sent) is retried on another
server; a failure after the request was sent is raised, never re-run.
"""

from __future__ import annotations

from stare_tir.rollout.backends._weights import (  # re-exported: tests, stand-in
    Posts,
    broadcast_from_rank0,
    buckets,
    dtype_name,
    free_port,
    init_weight_update_group,
    serialize_named_tensors,
)
from stare_tir.rollout.backends.sglang.backend import SGLangBackend, StaleWeightsError
from stare_tir.rollout.backends.sglang.config import MEMORY_TAGS, SGLangConfig, prepare_trainer_env
from stare_tir.rollout.backends.sglang.engine_backend import SGLangEngineBackend
from stare_tir.rollout.backends.sglang.layout import ServerLayout, check_layouts
from stare_tir.rollout.backends.sglang.push import SYNC_FILE
from stare_tir.rollout.backends.sglang.wire import SEED_MOD, parse_generate_output, sampling_payload

__all__ = [
    "MEMORY_TAGS",
    "SEED_MOD",
    "SYNC_FILE",
    "Posts",
    "SGLangBackend",
    "SGLangConfig",
    "SGLangEngineBackend",
    "ServerLayout",
    "StaleWeightsError",
    "broadcast_from_rank0",
    "buckets",
    "check_layouts",
    "dtype_name",
    "free_port",
    "init_weight_update_group",
    "parse_generate_output",
    "prepare_trainer_env",
    "sampling_payload",
    "serialize_named_tensors",
]
