"""SGLang HTTP backend against the stand-in server (tests/rollout/sglang_standin.py).

The stand-in runs in a subprocess on the tiny model and speaks SGLang's endpoints and JSON fields
with the version behaviours of `--compat` (0.5.23 by default, 0.5.2 for the 0.5.0-0.5.4 line);
these tests check the client's wire format, parsing and finish classification, routing/failover,
every weight-sync path (disk, tensor, distributed over a gloo group) with and without the
begin/end session, fail-fast refusals, and memory release/resume. The real server's tests live
beside these (test_sglang_real*).
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from stare_tir.rollout.backends._http import HTTPError, request_sync
from stare_tir.rollout.backends.base import FinishError, SamplingParams
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
    eos = parse_generate_output(
        {
            "output_ids": [5, 7],
            "meta_info": {"finish_reason": {"type": "stop", "matched": 7}, "output_token_logprobs": lp},
        }
    )
    assert (eos.token_ids, eos.logprobs, eos.finish_reason) == ([5, 7], [-0.1, -0.2], "eos")
    stop = parse_generate_output(
        {"meta_info": {"finish_reason": {"type": "stop", "matched": "</code>"}, "output_token_logprobs": lp}},
        ["</code>"],
    )
    assert (stop.finish_reason, stop.stop_text) == ("stop", "</code>")
    length = parse_generate_output(
        {"meta_info": {"finish_reason": {"type": "length", "length": 2}, "output_token_logprobs": lp}}
    )
    assert length.finish_reason == "length"
    with pytest.raises(RuntimeError, match="abort"):
        parse_generate_output(
            {"meta_info": {"finish_reason": {"type": "abort", "message": "x"}, "output_token_logprobs": lp}}
        )
    with pytest.raises(ValueError, match="disagree"):
        parse_generate_output(
            {"output_ids": [5, 8], "meta_info": {"finish_reason": {"type": "length"}, "output_token_logprobs": lp}}
        )
    with pytest.raises(ValueError, match="return_logprob"):
        parse_generate_output({"meta_info": {"finish_reason": {"type": "length"}}})


def test_output_ids_prompt_prefix_is_tolerated():
    """0.5.0-0.5.4 put up to 5 prompt ids before the sampled ones in output_ids."""
    lp = [[-0.1, 5, None], [-0.2, 7, None]]
    g = parse_generate_output(
        {
            "output_ids": [91, 92, 93, 5, 7],
            "meta_info": {"finish_reason": {"type": "length", "length": 2}, "output_token_logprobs": lp},
        }
    )
    assert g.token_ids == [5, 7] and g.logprobs == [-0.1, -0.2]


def test_length_first_finish_is_reclassified_from_the_last_token(tiny_tok):
    """Servers that check the budget first report `length` for a last token that is EOS or
    completes a stop string; the classification looks at the token, like the HF backend."""
    from stare_tir.rollout.backends.base import fast_decoder

    tok = tiny_tok
    decode = fast_decoder(tok)
    ids = tok("x = 1 </code>", add_special_tokens=False)["input_ids"]
    lp = [[-0.5, i, None] for i in ids]
    answer = {
        "text": tok.decode(ids),
        "meta_info": {"finish_reason": {"type": "length", "length": len(ids)}, "output_token_logprobs": lp},
    }
    g = parse_generate_output(answer, ["</code>"], [tok.eos_token_id], decode)
    assert (g.finish_reason, g.stop_text) == ("stop", "</code>")
    g = parse_generate_output(answer, ["</code>"])  # no tokenizer: the text is searched
    assert (g.finish_reason, g.stop_text) == ("stop", "</code>")
    eos_ids = ids[:2] + [tok.eos_token_id]
    g = parse_generate_output(
        {
            "meta_info": {
                "finish_reason": {"type": "length", "length": 3},
                "output_token_logprobs": [[-0.5, i, None] for i in eos_ids],
            }
        },
        [],
        [tok.eos_token_id],
        decode,
    )
    assert g.finish_reason == "eos"
    cut = parse_generate_output(
        {
            "text": tok.decode(ids[:2]),
            "meta_info": {"finish_reason": {"type": "length", "length": 2}, "output_token_logprobs": lp[:2]},
        },
        ["</code>"],
        [tok.eos_token_id],
        decode,
    )
    assert cut.finish_reason == "length"


def test_matched_must_be_eos_or_a_requested_stop():
    lp = [[-0.1, 5, None], [-0.2, 7, None]]
    with pytest.raises(FinishError, match="NaN happened"):
        parse_generate_output(
            {"meta_info": {"finish_reason": {"type": "stop", "matched": "NaN happened"}, "output_token_logprobs": lp}},
            ["</code>"],
        )
    with pytest.raises(FinishError):  # an int that is not the last token
        parse_generate_output(
            {"meta_info": {"finish_reason": {"type": "stop", "matched": 3}, "output_token_logprobs": lp}}
        )


def test_sampling_payload_keeps_stops_and_special_tokens():
    p = sampling_payload(SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_new_tokens=64), ["</code>"])
    assert p == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "max_new_tokens": 64,
        "stop": ["</code>"],
        "no_stop_trim": True,
        "skip_special_tokens": False,
    }
    assert "sampling_seed" not in sampling_payload(SamplingParams(seed=3), [], send_seed=False)
    assert sampling_payload(SamplingParams(seed=3), [])["sampling_seed"] == 3
    assert 0 <= sampling_payload(SamplingParams(seed=2**62 + 5), [])["sampling_seed"] < 2**31
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
        SGLangConfig(tp_size=-1)
    with pytest.raises(ValueError, match="bucket_mb"):
        SGLangConfig(bucket_mb=0)
    with pytest.raises(ValueError, match="colocate=true with weight_sync=distributed"):
        SGLangConfig(colocate=True, weight_sync="distributed")
    with pytest.raises(ValueError, match="at least one"):
        SGLangBackend([])


def test_standin_refuses_non_loopback_hosts(tiny_path, standin):
    with pytest.raises(ValueError, match="loopback"):
        standin.StandinServer(str(tiny_path), host="0.0.0.0")


# ---------------------------------------------------------------------------- against the stand-in


def _launch(standin, tiny_path, compat):
    proc, url = standin.launch_standin(str(tiny_path), extra_args=["--threads", "1", "--compat", compat])
    return proc, url


@pytest.fixture(scope="module")
def server(tiny_path, standin):
    proc, url = _launch(standin, tiny_path, "0.5.23")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def old_server(tiny_path, standin):
    """The 0.5.0-0.5.4 behaviours: output_ids prefix, length-first finish, no sessions, seeds
    refused."""
    proc, url = _launch(standin, tiny_path, "0.5.2")
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
    s = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
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
    out = request_sync(
        "POST",
        server + "/generate",
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"temperature": 1.0, "max_new_tokens": 40, "stop": ["e"]},
        },
    )
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
            assert g.stop_text == "e" and tok.decode(g.token_ids).endswith(tok.decode(g.token_ids[-1:]))


def test_engine_over_http(server, local, fake_env_cls):
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

    be = SGLangBackend([server])
    eng = RolloutEngine(
        be,
        local.tokenizer,
        fake_env_cls,
        RolloutConfig(n_per_prompt=4, max_total_tokens=64, max_new_tokens_per_turn=32, progress=False),
    )
    trajs, stats = eng.run([{"id": "a", "problem": "2+2?", "answer": "4"}])
    eng.close()
    assert len(trajs) == 4 and stats["engine/model_tokens"] > 0
    for t in trajs:
        t.check()
        assert t.finish_reason in ("eos", "max_tokens", "answer")
        # every model turn records the weights that sampled it (the server's version stamp)
        assert [(s, e) for s, e, _ in t.weight_versions] == t.model_spans()
        assert {v for _, _, v in t.weight_versions} == {
            request_sync("GET", server + "/get_model_info")["weight_version"]
        }


def _seed1(tmp_path_factory):
    from stare_tir.model import ensure_tiny_checkpoint

    return ensure_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "seed1", seed=1)


def _state(path):
    from stare_tir.rollout.backends._weights import iter_checkpoint_tensors

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
    cfg = SGLangConfig(
        weight_sync="disk" if mode == "disk_path" else mode,
        dist_backend="gloo",
        sync_dir=str(tmp_path_factory.mktemp("sync")),
        bucket_mb=1,
    )
    be = SGLangBackend([server], cfg)
    try:
        if mode == "disk_path":
            be.update_weights_from_disk(str(seed1))
        else:
            be.update_weights(_state(seed1).items())
        assert torch.allclose(_fingerprint(be, prompt), want_new, atol=1e-5)
        info = request_sync("GET", server + "/get_model_info")
        assert info["weight_version"] == be.weight_version == "1"  # the push's version, also per answer
        assert asyncio.run(be.generate(prompt, GREEDY, [])).weight_versions[-1][2] == "1"
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
    probes = request_sync("GET", server + "/standin_stats")["counts"].get("/health", 0)
    assert be.health() == [True]  # released, and still probed without a forward pass:
    assert request_sync("GET", server + "/standin_stats")["counts"].get("/health", 0) == probes  # /model_info
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


# ---------------------------------------------------------------------------- version quirks


def _stop_at_budget(tok, ids: list[int]) -> tuple[int, str]:
    """(k, piece): token k's text first appears when token k is sampled, so with stop=[piece]
    and a budget of k + 1 tokens the budget's last token completes the stop string."""
    for k in range(len(ids)):
        piece = tok.decode(ids[k : k + 1])
        if piece and piece not in tok.decode(ids[:k]) and "\ufffd" not in piece:
            return k, piece
    raise AssertionError("no usable token in the greedy output")


@pytest.mark.parametrize("which", ["server", "old_server"])
def test_stop_on_the_budgets_last_token_is_a_stop(which, request, local):
    """0.5.2 reports `length` for it (length-first); the client still classifies a stop."""
    url = request.getfixturevalue(which)
    tok = local.tokenizer
    be = SGLangBackend([url], SGLangConfig(), tokenizer=tok)
    prompt = _prompt(tok)
    ids = _greedy(local, prompt)
    k, piece = _stop_at_budget(tok, ids)
    sp = SamplingParams(temperature=0.0, max_new_tokens=k + 1, seed=7)
    g = asyncio.run(be.generate(prompt, sp, [piece]))
    assert g.token_ids == ids[: k + 1]
    assert (g.finish_reason, g.stop_text) == ("stop", piece)
    raw = request_sync(
        "POST",
        url + "/generate",
        {
            "input_ids": prompt,
            "return_logprob": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": k + 1, "stop": [piece], "no_stop_trim": True},
        },
    )
    want = "length" if which == "old_server" else "stop"
    assert raw["meta_info"]["finish_reason"]["type"] == want
    if which == "old_server":  # the prompt-prefix quirk is really there, and tolerated above
        assert raw["output_ids"][:5] == prompt[-5:]


def test_old_server_rollouts_lose_nothing(old_server, local, fake_env_cls):
    from stare_tir.rollout.engine import RolloutConfig, RolloutEngine

    be = SGLangBackend([old_server], tokenizer=local.tokenizer)  # send_seed off by default
    eng = RolloutEngine(
        be,
        local.tokenizer,
        fake_env_cls,
        RolloutConfig(n_per_prompt=4, max_total_tokens=64, max_new_tokens_per_turn=32, progress=False, seed=3),
    )
    trajs, _ = eng.run([{"id": "a", "problem": "2+2?", "answer": "4"}])
    eng.close()
    assert len(trajs) == 4 and all(t.finish_reason != "error" for t in trajs), [t.info.get("error") for t in trajs]
    with pytest.raises(HTTPError, match="sampling_params"):  # why seeds are opt-in
        asyncio.run(
            SGLangBackend([old_server], SGLangConfig(send_seed=True)).generate(
                _prompt(local.tokenizer), SamplingParams(seed=1, max_new_tokens=4), []
            )
        )


def test_flush_is_retried_while_a_request_runs(server, local):
    be = SGLangBackend([server])
    prompt = _prompt(local.tokenizer)
    before = request_sync("GET", server + "/standin_stats")["counts"].get("/flush_cache", 0)
    asyncio.run(be.generate(prompt, SamplingParams(temperature=0.0, max_new_tokens=4), []))
    with pytest.raises(HTTPError) as err:  # right after a generate the server still retires it
        request_sync("POST", server + "/flush_cache")
    assert err.value.status == 400
    be.flush_cache()
    after = request_sync("GET", server + "/standin_stats")["counts"]["/flush_cache"]
    assert after >= before + 2


def test_disk_sync_needs_a_dir_and_keeps_one_checkpoint(server, tiny_path, tmp_path):
    named = list(_state(tiny_path).items())
    with pytest.raises(ValueError, match="rollout.sglang.sync_dir"):
        SGLangBackend([server], SGLangConfig(weight_sync="disk")).update_weights(named)
    sync = tmp_path / "sync"
    be = SGLangBackend([server], SGLangConfig(weight_sync="disk", sync_dir=str(sync)))
    be.update_weights(named)
    be.update_weights(named)
    assert sorted(p.name for p in sync.iterdir()) == ["model.safetensors"]  # no temp, no second
    (sync / "other.safetensors").write_bytes(b"")
    with pytest.raises(ValueError, match="other checkpoint"):
        be.update_weights(named)


def test_disk_sync_refuses_a_directory_too_small_for_one_checkpoint(tmp_path, monkeypatch):
    """A container's 64 MB /dev/shm as sync_dir: refused with the sizes, before a byte is written
    or a server is asked to load anything."""
    import collections

    from stare_tir.rollout.backends.sglang import push

    named = [("w", torch.zeros(1024, 1024))]  # 4 MiB
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(push.shutil, "disk_usage", lambda p: usage(2**21, 0, 2**21))
    be = SGLangBackend(["http://127.0.0.1:9"], SGLangConfig(weight_sync="disk", sync_dir=str(tmp_path)))
    be._layouts = []  # no server to read: the refusal comes before any call
    with pytest.raises(ValueError, match=r"has 2 MiB free but one weight sync writes 4 MiB"):
        be.update_weights(named, version="1")
    assert list(tmp_path.iterdir()) == []


def test_refused_distributed_update_fails_fast(server, tiny_path):
    """Outside a session 0.5.23 refuses at once; the client must stop broadcasting, not block,
    and never use that group again."""
    import time

    from stare_tir.rollout.backends.sglang.push import UpdateGroup

    cfg = SGLangConfig(weight_sync="distributed", dist_backend="gloo", timeout_s=60)
    be = SGLangBackend([server], cfg)
    group = UpdateGroup(be.layouts(), cfg)
    group.init()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="begin_weight_update"):
        group.push(_state(tiny_path).items(), "1")  # no session opened
    assert time.monotonic() - t0 < 20
    assert group.broken
    group.destroy()


def test_tensor_payloads_pass_the_allow_list(server, tiny_path):
    """The stand-in's 0.5.23 mode unpickles with an allow-list: a payload with any other global
    is refused, the backend's by-value tensor pickles pass (test_weight_sync)."""
    import base64
    import pickle

    be = SGLangBackend([server], SGLangConfig(weight_sync="tensor"))
    evil = base64.b64encode(pickle.dumps([("x", print)])).decode()
    with be._sessions.around(be.control_urls):
        with pytest.raises(HTTPError, match="Blocked unsafe global"):
            request_sync(
                "POST",
                server + "/update_weights_from_tensor",
                {"serialized_named_tensors": [evil], "flush_cache": False},
            )
