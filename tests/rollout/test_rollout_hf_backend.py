"""HF backend on the tiny Qwen2: exact conditioning under continuous batching, sampling
distributions, stops, seeds, and in-process / from-disk weight updates. Runs on CPU."""

from __future__ import annotations

import asyncio

import pytest
import torch

from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig


def _prompts(tok, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = tok.apply_chat_template(
            [{"role": "user", "content": f"What is {i} * {i + 3}?" + " Think." * (i % 5)}],
            tokenize=False,
            add_generation_prompt=True,
        )
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


def _recompute(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Logits [len(tokens), V] predicting each generated token, from one unpadded forward."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    return logits[len(prompt) - 1 : -1]


@pytest.fixture
def backend(tiny_path):
    be = HFBackend(str(tiny_path), cfg=HFBackendConfig(max_batch_size=32, join_every=2))
    yield be
    be.close()


def test_logprobs_match_recompute_under_continuous_batching(backend):
    """Requests join a running batch with other prompt lengths; every sampled token's logprob
    equals the one recomputed on prompt + tokens[:k] alone: the cache saw exactly that context."""
    tok = backend.tokenizer
    prompts = _prompts(tok, 12)
    sp = SamplingParams(temperature=0.7, max_new_tokens=40)

    async def run():
        first = [asyncio.ensure_future(backend.generate(p, sp, [])) for p in prompts[:6]]
        while backend.stats["decode_steps"] < 3:  # the first six are decoding when the next
            await asyncio.sleep(0.001)  # six arrive (40 tokens each: far from done)
        second = [asyncio.ensure_future(backend.generate(p, sp, [])) for p in prompts[6:]]
        return await asyncio.gather(*first, *second)

    gens = asyncio.run(run())
    assert backend.stats["joins"] >= 1  # some requests really joined a running batch
    worst = 0.0
    for p, g in zip(prompts, gens):
        assert len(g.token_ids) == len(g.logprobs) >= 1
        logits = _recompute(backend.model, p, g.token_ids)
        want = (logits / 0.7).log_softmax(-1).gather(1, torch.tensor(g.token_ids)[:, None])[:, 0]
        worst = max(worst, (want - torch.tensor(g.logprobs)).abs().max().item())
    assert worst < 1e-4


def test_top_k_and_top_p_logprobs_are_under_the_truncated_distribution(backend):
    tok = backend.tokenizer
    prompts = _prompts(tok, 4)
    for sp, kind in [
        (SamplingParams(temperature=1.0, top_k=5, max_new_tokens=20), "k"),
        (SamplingParams(temperature=1.0, top_p=0.5, max_new_tokens=20), "p"),
    ]:
        gens = asyncio.run(backend.generate_batch(prompts, sp, []))
        for p, g in zip(prompts, gens):
            logits = _recompute(backend.model, p, g.token_ids)
            for row, t, lp in zip(logits, g.token_ids, g.logprobs):
                order = row.argsort(descending=True)
                if kind == "k":
                    keep = order[:5]
                else:
                    probs = row.softmax(-1)[order]
                    keep = order[: int(((probs.cumsum(0) - probs) <= 0.5).sum())]
                assert t in keep.tolist()
                want = row[keep].log_softmax(-1)[keep.tolist().index(t)].item()
                assert abs(want - lp) < 1e-4


def test_greedy_is_independent_of_batch_company(backend):
    tok = backend.tokenizer
    prompts = _prompts(tok, 6)
    sp = SamplingParams(temperature=0.0, max_new_tokens=24)
    alone = asyncio.run(backend.generate(prompts[0], sp, []))
    together = asyncio.run(backend.generate_batch(prompts, sp, []))
    assert together[0].token_ids == alone.token_ids
    # the values too (a random tiny model's greedy ids repeat; its logprobs expose padding bugs)
    assert torch.allclose(torch.tensor(together[0].logprobs), torch.tensor(alone.logprobs), atol=1e-4)
    # greedy logprob = log-softmax of the untempered logits at the argmax
    logits = _recompute(backend.model, prompts[0], alone.token_ids)
    assert alone.token_ids == logits.argmax(-1).tolist()
    assert torch.allclose(logits.log_softmax(-1).max(-1).values, torch.tensor(alone.logprobs), atol=1e-4)


def test_per_request_seed_reproduces(backend):
    p = _prompts(backend.tokenizer, 1)[0]
    a = asyncio.run(backend.generate(p, SamplingParams(max_new_tokens=30, seed=7), []))
    b = asyncio.run(backend.generate_batch([p, p], SamplingParams(max_new_tokens=30, seed=7), []))
    c = asyncio.run(backend.generate(p, SamplingParams(max_new_tokens=30, seed=8), []))
    assert a.token_ids == b[0].token_ids == b[1].token_ids
    assert a.token_ids != c.token_ids


def test_stop_eos_and_length(backend, tiny_path):
    tok = backend.tokenizer
    prompts = _prompts(tok, 8)
    gens = asyncio.run(backend.generate_batch(prompts, SamplingParams(max_new_tokens=60), ["e"]))
    stopped = [g for g in gens if g.finish_reason == "stop"]
    assert stopped  # "e" is common: most rows stop on it
    for g in stopped:
        assert g.stop_text == "e"
        assert "e" in tok.decode(g.token_ids) and "e" not in tok.decode(g.token_ids[:-1])
    for g in gens:
        if g.finish_reason == "length":
            assert len(g.token_ids) == 60
    short = asyncio.run(backend.generate(prompts[0], SamplingParams(max_new_tokens=3), []))
    assert len(short.token_ids) <= 3
    assert asyncio.run(backend.generate(prompts[0], SamplingParams(max_new_tokens=0), [])).token_ids == []
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(backend.generate([], SamplingParams(), []))
    # every id an EOS: generation ends after one token with finish "eos"
    vocab = backend.model.config.vocab_size
    be = HFBackend(str(tiny_path), cfg=HFBackendConfig(eos_token_ids=list(range(vocab))))
    try:
        g = asyncio.run(be.generate(prompts[0], SamplingParams(max_new_tokens=10), []))
        assert g.finish_reason == "eos" and len(g.token_ids) == 1
    finally:
        be.close()


def test_cancelled_request_does_not_disturb_others(backend):
    prompts = _prompts(backend.tokenizer, 3)
    sp = SamplingParams(temperature=0.0, max_new_tokens=30)
    ref = asyncio.run(backend.generate(prompts[1], sp, []))

    async def run():
        doomed = asyncio.ensure_future(backend.generate(prompts[0], sp, []))
        kept = asyncio.ensure_future(backend.generate(prompts[1], sp, []))
        start = backend.stats["decode_steps"]
        while backend.stats["decode_steps"] < start + 2:  # both are mid-generation
            await asyncio.sleep(0.001)
        doomed.cancel()
        out = await kept
        assert doomed.cancelled()
        return out

    assert asyncio.run(run()).token_ids == ref.token_ids
    assert backend._batch is None  # the cancelled row left the batch too


def test_update_weights_in_process(backend, tiny_path):
    p = _prompts(backend.tokenizer, 1)[0]
    sp = SamplingParams(temperature=0.0, max_new_tokens=20)
    before = asyncio.run(backend.generate(p, sp, [])).token_ids
    state = backend.model.state_dict()
    original = {k: v.clone() for k, v in state.items()}
    gen = torch.Generator().manual_seed(0)
    by_storage: dict[int, torch.Tensor] = {}  # tied weights (embedding = lm_head) get one tensor
    for v in state.values():
        by_storage.setdefault(v.data_ptr(), v + 0.5 * torch.randn(v.shape, generator=gen))
    noisy = [("module." + k, by_storage[v.data_ptr()]) for k, v in state.items()]
    backend.update_weights(noisy, version="12")
    assert backend.weight_version == "12"
    gen_after = asyncio.run(backend.generate(p, sp, []))
    after = gen_after.token_ids
    assert after != before
    assert gen_after.weight_versions == [(0, len(after), "12")]  # each answer names its weights
    # the backend now computes exactly with the new tensors
    for name, t in noisy:
        assert torch.equal(backend.model.state_dict()[name[len("module.") :]], t)
    backend.update_weights(original.items())
    assert asyncio.run(backend.generate(p, sp, [])).token_ids == before
    with pytest.raises(KeyError, match="not in the model"):
        backend.update_weights([("no.such.weight", torch.zeros(1))])
    name, t = next(iter(original.items()))
    with pytest.raises(ValueError, match="shape"):
        backend.update_weights([(name, torch.zeros(t.numel() + 1))])


def test_update_weights_from_disk(backend, tmp_path):
    from transformers import AutoModelForCausalLM

    from stare_tir.model import ensure_tiny_checkpoint

    other = ensure_tiny_checkpoint(tmp_path / "seed1", seed=1)
    backend.update_weights_from_disk(str(other))
    want = AutoModelForCausalLM.from_pretrained(str(other)).state_dict()
    got = backend.model.state_dict()
    assert want.keys() <= got.keys()
    assert all(torch.equal(got[k], v) for k, v in want.items())
    with pytest.raises(FileNotFoundError):
        backend.update_weights_from_disk(str(tmp_path))


def test_backend_moves_between_event_loops(backend):
    """An engine's persistent loop, then asyncio.run, then the first loop again: the batcher
    follows, and a superseded batcher never touches the shared state again."""
    p = _prompts(backend.tokenizer, 1)[0]
    sp = SamplingParams(max_new_tokens=16, seed=11)
    first = asyncio.new_event_loop()
    try:
        a = first.run_until_complete(backend.generate(p, sp, []))
        old_runner = backend._runner
        b = asyncio.run(backend.generate(p, sp, []))
        c = first.run_until_complete(asyncio.wait_for(backend.generate(p, sp, []), 60))
        assert a.token_ids == b.token_ids == c.token_ids
        assert old_runner.done() or backend._runner is not old_runner
        first.run_until_complete(asyncio.sleep(0.01))
        assert old_runner.done()  # it noticed it was superseded and returned
    finally:
        backend.close()
        first.close()


@pytest.mark.parametrize("seeded", [False, True])
def test_sampler_draws_from_the_stated_distribution(seeded):
    """Empirical frequencies match softmax(logits / T) after top-k / top-p truncation."""
    from stare_tir.rollout.backends.hf import sample_tokens

    n = 20000
    base = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])
    logits = base.repeat(n, 1)
    gen = torch.Generator().manual_seed(0)
    seeds = list(range(n)) if seeded else None
    for temp, k, p in [(1.0, -1, 1.0), (0.5, -1, 1.0), (1.0, 3, 1.0), (1.3, -1, 0.8)]:
        ids, lps = sample_tokens(
            logits, [temp] * n, [k] * n, [p] * n, seeds=seeds, counters=[0] * n if seeded else None, rng=gen
        )
        want = (base / temp).softmax(-1)
        if k > 0:
            want[want.argsort(descending=True)[k:]] = 0
        if p < 1:
            order = want.argsort(descending=True)
            cum = want[order].cumsum(0) - want[order]
            want[order[cum > p * want.sum()]] = 0
        want = want / want.sum()
        freq = torch.bincount(torch.tensor(ids), minlength=6).double() / n
        assert (freq - want.double()).abs().max() < 0.015, (temp, k, p, freq, want)
        assert torch.allclose(torch.tensor(lps), want.log()[torch.tensor(ids)].float(), atol=1e-5)
