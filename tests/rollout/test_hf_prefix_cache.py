"""HF backend's prefix cache on the tiny Qwen2, on CPU: a seeded multi-turn rollout samples the
same tokens and log-probs with and without it while prefilling fewer tokens; weight updates empty
it; its token budget holds. Also the worker thread's torch thread count."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from envs.base import StepResult
from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig
from stare_tir.rollout.backends.hf_prefix import PrefixCache
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine


class ToolEnv:
    """Every turn gets a tool output of a length that varies by turn and answer (so suffixes of
    one cached prefill differ in length: the rows have gaps), until the third turn."""

    def __init__(self, problem: dict) -> None:
        self.stop_strings: list[str] = []
        self.stats = {"tool_calls": 0}
        self.sandbox_error = False
        self.turn = 0

    def initial_messages(self):
        return [{"role": "user", "content": "Say something."}]

    async def step(self, turn_text: str) -> StepResult:
        self.turn += 1
        if self.turn >= 3:
            return StepResult(None, True, {"reason": "answer"})
        self.stats["tool_calls"] += 1
        pad = " ok" * (len(turn_text) % 7 + self.turn)
        return StepResult(f"\n<interpreter>\nturn {self.turn}{pad}\n</interpreter>\n", False, {})

    def reward(self, text: str):
        return 0.0, {"correct": False, "pred": None}

    async def close(self) -> None:
        pass


def _rollout(tiny_path, **hf):
    backend = HFBackend(str(tiny_path), cfg=HFBackendConfig(max_batch_size=16, join_every=1, **hf))
    cfg = RolloutConfig(
        n_per_prompt=12,
        max_turns=4,
        max_total_tokens=160,
        max_new_tokens_per_turn=40,
        temperature=0.7,
        stop_strings=["e"],
        seed=3,
        progress=False,
    )
    eng = RolloutEngine(backend, backend.tokenizer, ToolEnv, cfg)
    try:
        trajs, _ = eng.run([{"id": "x", "problem": "", "answer": ""}])
    finally:
        eng.close()
    return backend, trajs


@pytest.fixture(scope="module")
def with_and_without(tiny_path):
    torch.set_num_threads(1)
    cached, with_cache = _rollout(tiny_path)
    plain, without = _rollout(tiny_path, prefix_cache_tokens=0)
    yield cached, with_cache, plain, without
    cached.close()
    plain.close()


def test_same_tokens_and_logprobs_with_and_without_the_cache(with_and_without):
    cached, with_cache, plain, without = with_and_without
    assert sum(t.num_turns >= 2 for t in with_cache) >= 8  # most trajectories had later turns
    assert [t.response_ids for t in with_cache] == [t.response_ids for t in without]
    for a, b in zip(with_cache, without):
        a.check()
        assert torch.allclose(torch.tensor(a.rollout_logprobs), torch.tensor(b.rollout_logprobs), atol=1e-5, rtol=0)
    # and the cached run's log-probs are those of one unpadded forward over the whole sequence
    worst = 0.0
    for t in with_cache:
        with torch.no_grad():
            logits = cached.model(torch.tensor([t.prompt_ids + t.response_ids])).logits[0].float()
        lp = (logits[len(t.prompt_ids) - 1 : -1] / 0.7).log_softmax(-1)
        lp = lp.gather(1, torch.tensor(t.response_ids)[:, None])[:, 0]
        mask = torch.tensor(t.loss_mask, dtype=torch.bool)
        worst = max(worst, (lp[mask] - torch.tensor(t.rollout_logprobs)[mask]).abs().max().item())
    assert worst < 1e-4


def test_prefilled_tokens_drop_by_the_reused_ones(with_and_without):
    cached, _, plain, _ = with_and_without
    got, base = cached.prefill_stats(), plain.prefill_stats()
    assert base["reused_tokens"] == 0 and base["prefix_hits"] == 0
    assert got["prefix_hits"] >= 8 and got["reused_tokens"] > 0.4 * base["prefill_tokens"]
    # the same prompts (same tokens sampled): every prompt token was either computed or reused
    assert got["prefill_tokens"] + got["reused_tokens"] == base["prefill_tokens"]
    assert cached.stats["joins"] >= 1  # cached prefills joined running batches
    route = cached.take_route_stats()
    assert route["route/prompt_tokens"] == base["prefill_tokens"]
    assert route["route/cached_frac"] == pytest.approx(got["reused_tokens"] / base["prefill_tokens"])
    assert cached.take_route_stats() == {"route/prompt_tokens": 0.0, "route/cached_frac": 0.0}  # since the last call


def _turns(backend, prompt, seed=5, n=2):
    """Two turns of one trajectory: the second prompt is prompt + answer + a tool output."""
    sp = SamplingParams(temperature=1.0, max_new_tokens=12, seed=seed)
    first = asyncio.run(backend.generate(prompt, sp, []))
    second_prompt = prompt + first.token_ids + backend.tokenizer("\n<interpreter>\n7\n</interpreter>\n")["input_ids"]
    second = asyncio.run(backend.generate(second_prompt, SamplingParams(max_new_tokens=12, seed=seed + 1), []))
    return first, second


def _prompt(tok, text="What is 3 * 4?"):
    chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
    return tok(chat, add_special_tokens=False)["input_ids"]


def test_weight_updates_empty_the_cache(tiny_path):
    be = HFBackend(str(tiny_path), cfg=HFBackendConfig())
    try:
        prompt = _prompt(be.tokenizer)
        asyncio.run(be.generate(prompt, SamplingParams(max_new_tokens=12, seed=1), []))
        assert be.prefill_stats()["cache_entries"] == 1
        state = {k: v.clone() for k, v in be.model.state_dict().items()}
        be.update_weights(state.items())
        assert be.prefill_stats()["cache_entries"] == 0 and be._prefix.tokens == 0
        # the next turn after an update computes its whole prompt on the new weights
        _turns(be, prompt)
        reused = be.stats["reused_tokens"]
        assert reused > 0  # the second turn above did reuse its first turn
        assert be.prefill_stats()["cache_entries"] == 1
        # from disk too (it goes through update_weights)
        be.update_weights_from_disk(str(tiny_path))
        assert be.prefill_stats()["cache_entries"] == 0

        # an update on the batcher's own thread does not wait for the running request: that
        # request's KV mixes both weights, so it is not kept
        async def update_mid_request():
            fut = asyncio.ensure_future(be.generate(prompt, SamplingParams(max_new_tokens=30, seed=3), []))
            start = be.stats["decode_steps"]
            while be.stats["decode_steps"] < start + 3:
                await asyncio.sleep(0.001)
            be.update_weights(state.items())
            return await fut

        assert len(asyncio.run(update_mid_request()).token_ids) == 30
        assert be.prefill_stats()["cache_entries"] == 0
    finally:
        be.close()


def test_budget_is_respected_and_oldest_go_first(tiny_path):
    be = HFBackend(str(tiny_path), cfg=HFBackendConfig(prefix_cache_tokens=100))
    try:
        tok = be.tokenizer
        prompts = [_prompt(tok, f"What is {i} + {i}?") for i in range(4)]
        sp = SamplingParams(max_new_tokens=10, seed=2)
        gens = []
        for p in prompts:  # one at a time: each finished row is stored, the oldest evicted
            gens.append(asyncio.run(be.generate(p, sp, [])))
            assert 0 < be._prefix.tokens <= 100
        per = [len(p) + len(g.token_ids) - 1 for p, g in zip(prompts, gens)]
        assert 100 // max(per) < 4  # the budget cannot hold all four
        stats = be.prefill_stats()
        assert stats["evicted_tokens"] == sum(per) - stats["cache_tokens"] > 0
        # the newest is still there, the oldest is gone
        assert be._prefix.take(prompts[0] + gens[0].token_ids) is None
        assert be._prefix.take(prompts[-1] + gens[-1].token_ids).n == per[-1]
    finally:
        be.close()


def test_prefix_cache_matching_rules():
    kv = lambda n: [(torch.full((1, 1, n, 2), float(n)), torch.zeros(1, 1, n, 2))]  # noqa: E731
    cache = PrefixCache(budget_tokens=10)
    cache.put([1, 2, 3], kv(3))
    cache.put([1, 2, 3, 4, 5], kv(5))
    cache.put([9] * 11, kv(11))  # longer than the whole budget: not kept
    assert len(cache) == 2 and cache.tokens == 8
    hit = cache.take([1, 2, 3, 4, 5, 6])  # the longest entry that starts the prompt
    assert hit.n == 5 and hit.kv[0][0][0, 0, 0, 0].item() == 5.0
    assert len(cache) == 1  # taken: the request carries it on
    # a prompt equal to an entry reuses all but its last id (fed again for the next-token logits)
    hit = cache.take([1, 2, 3])
    assert hit.n == 2 and hit.kv[0][0].shape[2] == 2
    assert cache.take([1, 2, 3, 4]) is None and cache.tokens == 0
    cache.put([1, 2], kv(2))
    cache.put([3, 4, 5, 6], kv(4))
    cache.put([7, 8, 9, 10, 11], kv(5))  # 11 tokens: evicts [1, 2], the oldest
    assert cache.take([1, 2, 0]) is None and cache.take([3, 4, 5, 6, 0]).n == 4
    assert cache.evicted_tokens == 2
    with pytest.raises(ValueError, match="must be >= 0"):
        PrefixCache(-1)
    with pytest.raises(ValueError, match="prefix_cache_tokens"):
        HFBackendConfig(prefix_cache_tokens=-5)


def test_prompt_equal_to_a_cached_entry_is_exact(tiny_path):
    """The next prompt is exactly prompt + answer[:-1] (the entry's ids): its last id is fed again
    from the cached KV of the others; the sample equals a backend without the cache."""
    outs = []
    for budget in (4096, 0):
        be = HFBackend(str(tiny_path), cfg=HFBackendConfig(prefix_cache_tokens=budget))
        try:
            prompt = _prompt(be.tokenizer)
            first = asyncio.run(be.generate(prompt, SamplingParams(max_new_tokens=9, seed=4), []))
            again = prompt + first.token_ids[:-1]
            outs.append(asyncio.run(be.generate(again, SamplingParams(max_new_tokens=9, seed=6), [])))
            assert be.stats["reused_tokens"] == (len(again) - 1 if budget else 0)
        finally:
            be.close()
    assert outs[0].token_ids == outs[1].token_ids
    assert torch.allclose(torch.tensor(outs[0].logprobs), torch.tensor(outs[1].logprobs), atol=1e-5, rtol=0)


def test_threads_apply_to_the_worker_thread_only(tiny_path):
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        be = HFBackend(str(tiny_path), cfg=HFBackendConfig(threads=1))
        try:
            asyncio.run(be.generate(_prompt(be.tokenizer), SamplingParams(max_new_tokens=4), []))
            assert be._executor.submit(torch.get_num_threads).result() == 1  # after real model work
            assert torch.get_num_threads() == 2  # this thread (the learner's) keeps its own
            seen = []
            t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))
            t.start()
            t.join()
            assert seen == [2]  # and threads started later get the process default, not 1
        finally:
            be.close()
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ValueError, match="threads"):
        HFBackendConfig(threads=0)


def test_thread_and_dtype_resolution(monkeypatch):
    from stare_tir.rollout.backends import hf_cpu

    monkeypatch.setattr(hf_cpu, "cores_per_process", lambda: 2)
    assert hf_cpu.resolve_threads("auto", "cpu")[0] == 1
    monkeypatch.setattr(hf_cpu, "cores_per_process", lambda: 16)
    assert hf_cpu.resolve_threads("auto", "cpu")[0] == 16
    assert hf_cpu.resolve_threads(3, "cpu")[0] == 3
    assert hf_cpu.resolve_threads("auto", "cuda")[0] is None
    assert hf_cpu.resolve_dtype("auto", "cuda") == torch.bfloat16
    assert hf_cpu.resolve_dtype("auto", "cpu") == torch.float32  # bf16's log-probs are off-policy
    assert hf_cpu.resolve_dtype("float16", "cpu") == torch.float16
    monkeypatch.undo()
    monkeypatch.setattr(hf_cpu.os, "sched_getaffinity", lambda pid: set(range(8)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert hf_cpu.cores_per_process() == 2  # the machine's cores are shared by its ranks
