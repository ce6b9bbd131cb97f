"""SGLang HTTP backend against the stand-in server (SGLang itself needs CUDA; see README).

The stand-in runs in a subprocess on the tiny model and speaks SGLang's endpoints and JSON fields;
these tests check the client's wire format, parsing, routing/failover, every weight-sync path
(disk, tensor, distributed over a gloo group) and memory release/resume.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from stare_tir.rollout.backends._http import HTTPError, request_sync
from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.sglang import (
    SGLangBackend,
    SGLangConfig,
    buckets,
    free_port,
    parse_generate_output,
    sampling_payload,
)

# ---------------------------------------------------------------------------- wire format (no server)


def test_parse_generate_output_finish_reasons():
    lp = [[-0.1, 5, None], [-0.2, 7, None]]
    eos = parse_generate_output({"output_ids": [5, 7], "meta_info": {
        "finish_reason": {"type": "stop", "matched": 7}, "output_token_logprobs": lp}})
    assert (eos.token_ids, eos.logprobs, eos.finish_reason) == ([5, 7], [-0.1, -0.2], "eos")
    stop = parse_generate_output({"meta_info": {
        "finish_reason": {"type": "stop", "matched": "</code>"}, "output_token_logprobs": lp}})
    assert (stop.finish_reason, stop.stop_text) == ("stop", "</code>")
    length = parse_generate_output({"meta_info": {
        "finish_reason": {"type": "length", "length": 2}, "output_token_logprobs": lp}})
    assert length.finish_reason == "length"
    with pytest.raises(RuntimeError, match="abort"):
        parse_generate_output({"meta_info": {"finish_reason": {"type": "abort", "message": "x"},
                                             "output_token_logprobs": lp}})
    with pytest.raises(ValueError, match="disagree"):
        parse_generate_output({"output_ids": [5, 8], "meta_info": {
            "finish_reason": {"type": "length"}, "output_token_logprobs": lp}})
    with pytest.raises(ValueError, match="return_logprob"):
        parse_generate_output({"meta_info": {"finish_reason": {"type": "length"}}})


def test_sampling_payload_keeps_stops_and_special_tokens():
    p = sampling_payload(SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=64),
                         ["</code>"])
    assert p == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64,
                 "stop": ["</code>"], "no_stop_trim": True, "skip_special_tokens": False}
    assert sampling_payload(SamplingParams(seed=3), [])["sampling_seed"] == 3
    assert "stop" not in sampling_payload(SamplingParams(), [])


def test_buckets_respect_size_and_mark_last():
    named = [(f"w{i}", torch.zeros(256)) for i in range(5)]  # 1 KiB each
    got = list(buckets(named, max_bytes=2048))
    assert [[n for n, _ in b] for b, _ in got] == [["w0", "w1"], ["w2", "w3"], ["w4"]]
    assert [last for _, last in got] == [False, False, True]
    assert [last for _, last in buckets(named[:1], 10)] == [True]
    assert list(buckets([], 10)) == []


def test_config_validation():
    with pytest.raises(ValueError, match="http://"):
        SGLangConfig(urls=["localhost:30000"])
    with pytest.raises(ValueError, match="tp_size"):
        SGLangConfig(tp_size=0)
    with pytest.raises(ValueError, match="at least one"):
        SGLangBackend([])


def test_standin_refuses_non_loopback_hosts(tiny_path):
    from stare_tir.rollout.backends.sglang_standin import StandinServer

    with pytest.raises(ValueError, match="loopback"):
        StandinServer(str(tiny_path), host="0.0.0.0")


# ---------------------------------------------------------------------------- against the stand-in


@pytest.fixture(scope="module")
def server(tiny_path):
    from stare_tir.rollout.backends.sglang_standin import launch_standin

    proc, url = launch_standin(str(tiny_path), extra_args=["--threads", "1"])
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def local(tiny_path):
    """The same checkpoint in this process, to check what the server computes."""
    from stare_tir.rollout.backends.hf import HFBackend

    be = HFBackend(str(tiny_path))
    yield be
    be.close()


def _prompt(tok, text="What is 3 * 4?"):
    s = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                add_generation_prompt=True)
    return tok(s, add_special_tokens=False)["input_ids"]


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)


def _greedy(backend, prompt):
    return asyncio.run(backend.generate(prompt, GREEDY, [])).token_ids


def _fingerprint(backend, prompt) -> torch.Tensor:
    """Greedy logprobs: a random tiny model's greedy ids can coincide across weights, these not."""
    g = asyncio.run(backend.generate(prompt, GREEDY, []))
    return torch.tensor(g.logprobs)


def test_raw_generate_json_fields(server, local):
    prompt = _prompt(local.tokenizer)
    out = request_sync("POST", server + "/generate", {
        "input_ids": prompt, "return_logprob": True,
        "sampling_params": {"temperature": 1.0, "max_new_tokens": 40, "stop": ["e"]}})
    meta = out["meta_info"]
    assert set(out) >= {"text", "output_ids", "meta_info"}
    assert [p[1] for p in meta["output_token_logprobs"]] == out["output_ids"]
    assert meta["completion_tokens"] == len(out["output_ids"])
    if meta["finish_reason"]["type"] == "stop":
        assert meta["finish_reason"]["matched"] == "e"
        assert "e" not in out["text"]  # trimmed when no_stop_trim is false, as in SGLang
    bad = {"input_ids": prompt, "sampling_params": {"frobnicate": 1}}
    with pytest.raises(HTTPError) as err:
        request_sync("POST", server + "/generate", bad)
    assert err.value.status == 400
    assert request_sync("GET", server + "/get_model_info")["is_generation"] is True


def test_http_generation_equals_the_model(server, local):
    """Greedy ids equal the local model's; sampled logprobs equal a local recompute."""
    be = SGLangBackend([server])
    tok = local.tokenizer
    prompts = [_prompt(tok, f"What is {i} + {i}?") for i in range(6)]
    for p in prompts[:2]:
        assert _greedy(be, p) == _greedy(local, p)
    sp = SamplingParams(temperature=0.7, max_new_tokens=30)

    async def all_of_them():
        return await asyncio.gather(*(be.generate(p, sp, ["e"]) for p in prompts))

    gens = asyncio.run(all_of_them())
    for p, g in zip(prompts, gens):
        with torch.no_grad():
            logits = local.model(torch.tensor([p + g.token_ids])).logits[0, len(p) - 1 : -1]
        want = (logits / 0.7).log_softmax(-1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
        assert torch.allclose(want, torch.tensor(g.logprobs), atol=1e-4)
        if g.finish_reason == "stop":
            assert g.stop_text == "e" and tok.decode(g.token_ids).endswith(
                tok.decode(g.token_ids[-1:]))


def test_engine_over_http(server, local, fake_env_cls):
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

    be = SGLangBackend([server])
    eng = RolloutEngine(be, local.tokenizer, fake_env_cls, RolloutConfig(
        n_per_prompt=4, max_total_tokens=64, max_new_tokens_per_turn=32, progress=False))
    trajs, stats = eng.run([{"id": "a", "problem": "2+2?", "answer": "4"}])
    eng.close()
    assert len(trajs) == 4 and stats["model_tokens"] > 0
    for t in trajs:
        t.check()
        assert t.finish_reason in ("eos", "max_tokens", "answer")


def _seed1(tmp_path_factory):
    from stare_tir.tiny import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "seed1", seed=1)


def _state(path):
    from stare_tir.rollout.backends.hf import iter_checkpoint_tensors

    return dict(iter_checkpoint_tensors(str(path)))


@pytest.mark.parametrize("mode", ["disk_path", "disk", "tensor", "distributed"])
def test_weight_sync(server, local, tiny_path, tmp_path_factory, mode):
    """Each sync path makes the server compute with the new weights, and back again."""
    from stare_tir.rollout.backends.hf import HFBackend

    seed1 = _seed1(tmp_path_factory)
    ref = HFBackend(str(seed1))
    prompt = _prompt(local.tokenizer)
    want_new, want_old = _fingerprint(ref, prompt), _fingerprint(local, prompt)
    ref.close()
    assert (want_new - want_old).abs().max() > 1e-2
    cfg = SGLangConfig(weight_sync="disk" if mode == "disk_path" else mode, dist_backend="gloo",
                       sync_dir=str(tmp_path_factory.mktemp("sync")), bucket_mb=1)
    be = SGLangBackend([server], cfg)
    try:
        if mode == "disk_path":
            be.update_weights_from_disk(str(seed1))
        else:
            be.update_weights(_state(seed1).items())
        assert torch.allclose(_fingerprint(be, prompt), want_new, atol=1e-5)
        info = request_sync("GET", server + "/get_model_info")
        assert info["weight_version"] != "default" and be.weight_version == 1
    finally:
        if mode in ("tensor", "distributed"):
            be.update_weights(_state(tiny_path).items())  # back through the same path
        else:
            be.update_weights_from_disk(str(tiny_path))
        assert torch.allclose(_fingerprint(be, prompt), want_old, atol=1e-5)
        be.close()
    if mode == "distributed":
        counts = request_sync("GET", server + "/standin_stats")["counts"]
        assert counts["/init_weights_update_group"] == 1
        assert counts["/update_weights_from_distributed"] >= 2
        assert counts["/destroy_weights_update_group"] == 1


def test_failed_weight_update_raises(server):
    be = SGLangBackend([server])
    with pytest.raises(RuntimeError, match="weight update failed"):
        be.update_weights_from_disk("/nonexistent/checkpoint")


def test_memory_release_resume_flush_and_health(server, local):
    be = SGLangBackend([server])
    prompt = _prompt(local.tokenizer)
    assert be.health() == [True]
    be.release_memory_occupation(["weights", "kv_cache"])
    with pytest.raises(HTTPError) as err:
        _greedy(be, prompt)
    assert err.value.status == 503
    be.resume_memory_occupation()
    be.flush_cache()
    assert _greedy(be, prompt) == _greedy(local, prompt)
    be.wait_until_healthy(timeout_s=10)


def test_routes_around_a_dead_server(server, local):
    dead = f"http://127.0.0.1:{free_port()}"
    be = SGLangBackend([dead, server], SGLangConfig(retries=2))
    prompt = _prompt(local.tokenizer)

    async def many():
        return await asyncio.gather(*(be.generate(prompt, GREEDY, []) for _ in range(4)))

    outs = asyncio.run(many())
    assert all(o.token_ids == outs[0].token_ids for o in outs)
    assert be.health() == [False, True]


def test_control_calls_go_to_weight_urls(server, local):
    """Behind a router, generation goes to `urls` and weight/control calls to `weight_urls`."""
    dead = f"http://127.0.0.1:{free_port()}"
    be = SGLangBackend([server], SGLangConfig(weight_urls=[dead]))
    with pytest.raises(OSError):
        be.flush_cache()  # the (dead) worker URL was called, not the generation URL
    assert _greedy(be, _prompt(local.tokenizer)) == _greedy(local, _prompt(local.tokenizer))
