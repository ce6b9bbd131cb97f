"""algo.round_end: a round that ends once enough groups are in, cancelling the rest.

A scripted backend answers quickly for most problems and very slowly for those marked "slow"; the
env is the real Retool env over a sandbox that counts its sessions, so a cancelled trajectory is
seen closing its session. `all` must stay what it was: the first usable groups in prompt order,
after every trajectory, through `engine.run`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from contextlib import asynccontextmanager
from types import SimpleNamespace

import pytest
import torch

from envs.retool import RetoolConfig, make_retool_env_factory
from sandbox.base import ExecResult, ExecStatus
from stare_tir.rollout.backends.base import BackendBase, Generation
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine
from stare_tir.train_config import TrainConfig
from stare_tir.trainer import collect_batch

CODE = "Let me check.\n<code>\n```python\nprint(1)\n```\n</code>"
SLOW_S = 60.0  # a slow problem's answer turn: far longer than any test may take


@pytest.fixture(scope="module")
def tok():
    from stare_tir.model import build_qwen_tokenizer

    return build_qwen_tokenizer()


class SlowBackend(BackendBase):
    """Turn 1 writes a code cell; turn 2 answers, right (\\boxed{1}) for the first sample of a
    prompt to ask and wrong for the next, so every group of two is informative. A problem whose
    text says "slow" takes `slow_s` for its answer turn; one that says "same" is always answered
    right (a group of equal rewards). Counts cancelled calls."""

    def __init__(self, tok, fast_s: float = 0.01, slow_s: float = SLOW_S) -> None:
        self.tok, self.fast_s, self.slow_s = tok, fast_s, slow_s
        self.asked: Counter = Counter()
        self.cancelled = 0

    def _gen(self, text: str, finish: str, stop: str | None = None) -> Generation:
        ids = self.tok(text, add_special_tokens=False)["input_ids"]
        if finish == "eos":
            ids = [*ids, self.tok.eos_token_id]
        return Generation(ids, [-0.5] * len(ids), finish, stop)

    async def generate(self, prompt_ids, sampling, stop) -> Generation:
        text = self.tok.decode(prompt_ids)
        if "Let me check." not in text:  # no code turn yet (the system prompt names the tags)
            return self._gen(CODE, "stop", "</code>")
        self.asked[tuple(prompt_ids)] += 1
        right = self.asked[tuple(prompt_ids)] == 1 or "same" in text
        answer = "\\boxed{1}" if right else "\\boxed{2}"
        try:
            await asyncio.sleep(self.slow_s if "slow" in text else self.fast_s)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return self._gen(f"So {answer}.", "eos")

    def update_weights(self, named_tensors, version=None) -> None:
        pass


class CountingSandbox:
    """A sandbox whose sessions print "1" and are counted as they open and close."""

    def __init__(self) -> None:
        self.info: dict = {}
        self.stats: dict = {}
        self.opened = self.closed = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    @asynccontextmanager
    async def session(self, stateless: bool = False):
        self.opened += 1
        try:
            yield SimpleNamespace(run=self._run)
        finally:
            self.closed += 1

    async def _run(self, code: str, timeout: float | None = None) -> ExecResult:
        return ExecResult(ExecStatus.OK, 0, None, "1\n", "", False, False, 0.0)


class OneRankLearner:
    rank, world_size = 0, 1

    def all_reduce_sum(self, x):
        return x.clone()

    def shard(self, items):
        return list(items)


class ListSampler:
    """Hands out its problems in order (collect_batch only calls take)."""

    def __init__(self, problems):
        self.problems, self.pos = list(problems), 0

    def take(self, k):
        out = self.problems[self.pos : self.pos + k]
        self.pos += k
        return out


def problems(marks: str) -> list[dict]:
    """One problem per character: "s" slow, "f" fast, "e" fast with equal rewards; every answer is 1."""
    words = {"s": "slow", "f": "fast", "e": "same"}
    return [{"id": str(i), "problem": f"{words[m]} problem {i}", "answer": "1"} for i, m in enumerate(marks)]


def make_run(tok, marks: str, round_end: str, backend=None, rounds: int = 3):
    cfg = TrainConfig()
    cfg.trainer.prompts_per_step = 2
    cfg.rollout.n_per_prompt = 2
    cfg.rollout.progress = False
    cfg.algo.dynamic_sampling = True
    cfg.algo.oversample = 2
    cfg.algo.dynamic_sampling_rounds = rounds
    cfg.algo.round_end = round_end
    sandbox = CountingSandbox()
    backend = backend or SlowBackend(tok)
    engine = RolloutEngine(
        backend, tok, make_retool_env_factory(sandbox, RetoolConfig()), RolloutConfig(n_per_prompt=2, progress=False)
    )
    run = SimpleNamespace(cfg=cfg, learner=OneRankLearner(), engine=engine, sampler=ListSampler(problems(marks)))
    return run, backend, sandbox


def test_enough_returns_before_the_slow_trajectories_and_cancels_them(tok):
    run, backend, sandbox = make_run(tok, "sfsf", "enough")
    t0 = time.perf_counter()
    try:
        batch, rolled, m = collect_batch(run, step=1)
    finally:
        run.engine.close()
    assert time.perf_counter() - t0 < SLOW_S / 4  # never waited for a slow answer
    # the two fast groups make the batch; the slow ones were cut in their answer turn
    assert sorted({t.problem_id for t in batch}) == ["1", "3"] and len(batch) == 4
    assert backend.cancelled == 4
    assert sorted(t.problem_id for t in rolled) == ["1", "1", "3", "3"]  # cancelled: not rolled
    assert m["batch/groups"] == 2 and m["batch/sampling_rounds"] == 1
    assert m["batch/aborted_trajectories"] == 4
    code_tokens = len(tok(CODE, add_special_tokens=False)["input_ids"])
    assert m["batch/aborted_tokens"] == 4 * code_tokens  # each had written its code turn
    # every session opened (all 8 ran their code) was closed, the cancelled ones' included
    assert sandbox.opened == 8 and sandbox.closed == 8
    assert m["rollout/kept_mean_length"] == m["rollout/all_mean_length"] > code_tokens


def test_enough_refills_in_a_later_round_when_a_round_falls_short(tok):
    # Round 1: no usable group (equal rewards), so it runs to its end; round 2 asks for the two
    # missing groups (x2 over-sampled) and stops once its fast ones are in.
    run, backend, sandbox = make_run(tok, "eeee" + "sfsf", "enough")
    try:
        batch, rolled, m = collect_batch(run, step=1)
    finally:
        run.engine.close()
    assert m["batch/sampling_rounds"] == 2 and m["batch/prompts"] == 8
    assert m["dropped/equal_reward_groups"] == 4 and m["batch/groups"] == 2
    assert sorted({t.problem_id for t in batch}) == ["5", "7"]
    assert m["batch/aborted_trajectories"] == 4 and backend.cancelled == 4
    assert len(rolled) == 12 and len({t.group_id for t in rolled}) == 6  # ids unique across rounds
    assert sandbox.opened == sandbox.closed == 16


def test_all_waits_for_every_trajectory_and_keeps_prompt_order(tok):
    backend = SlowBackend(tok, slow_s=0.3)
    run, _, sandbox = make_run(tok, "sfsf", "all", backend=backend)
    called = []
    real = run.engine.generate_groups
    run.engine.generate_groups = lambda *a, **kw: called.append(1) or real(*a, **kw)
    try:
        batch, rolled, m = collect_batch(run, step=1)
    finally:
        run.engine.close()
    assert not called and backend.cancelled == 0  # `all` goes through engine.run, as before
    assert len(rolled) == 8 and m["batch/aborted_trajectories"] == 0 == m["batch/aborted_tokens"]
    assert [t.problem_id for t in batch] == ["0", "0", "1", "1"]  # the first groups in prompt order
    assert m["batch/leftover_groups"] == 2
    assert m["rollout/kept_mean_length"] == m["rollout/all_mean_length"] > 0
    assert sandbox.opened == sandbox.closed == 8


class ThreadRanks:
    """`world` ranks as threads: all_reduce_sum sums every rank's tensor (each rank must call it
    as often as the others, or the barrier breaks: a mismatched collective count shows up here)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.barrier = threading.Barrier(world, timeout=30)
        self.parts: list = [None] * world

    def learner(self, rank: int) -> SimpleNamespace:
        def all_reduce_sum(x):
            self.parts[rank] = x.clone()
            self.barrier.wait()
            total = sum(self.parts)
            self.barrier.wait()  # everyone has read before anyone writes again
            return total

        return SimpleNamespace(
            rank=rank,
            world_size=self.world,
            all_reduce_sum=all_reduce_sum,
            shard=lambda xs: list(xs[rank :: self.world]),
        )


def test_two_ranks_refill_the_rank_that_fell_short(tok):
    # prompts_per_step=2 over 2 ranks: one group each. Round 1 (4 prompts): rank 0 gets problems 0
    # and 2 (equal rewards), rank 1 gets 1 (fast) and 3 (slow, cancelled). Round 2 asks for the one
    # missing group (2 prompts): rank 0 rolls problem 4, rank 1 already holds its share and rolls none.
    ranks = ThreadRanks(2)
    runs = []
    for rank in range(2):
        run, backend, sandbox = make_run(tok, "efes" + "ff", "enough")
        run.learner = ranks.learner(rank)
        runs.append((run, backend, sandbox))
    results: dict[int, tuple] = {}

    def rank_main(rank: int) -> None:
        run = runs[rank][0]
        try:
            results[rank] = collect_batch(run, step=1)
        finally:
            run.engine.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(2)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert time.perf_counter() - t0 < SLOW_S / 4 and set(results) == {0, 1}
    (b0, r0, m0), (b1, r1, m1) = results[0], results[1]
    assert sorted({t.problem_id for t in b0}) == ["4"] and sorted({t.problem_id for t in b1}) == ["1"]
    assert sorted(t.problem_id for t in r0) == ["0", "0", "2", "2", "4", "4"]
    assert sorted(t.problem_id for t in r1) == ["1", "1"]  # problem 3 cancelled, nothing in round 2
    assert m0["batch/sampling_rounds"] == m1["batch/sampling_rounds"] == 2
    assert m0["batch/prompts"] == m1["batch/prompts"] == 6
    assert m0["batch/aborted_trajectories"] == m1["batch/aborted_trajectories"] == 2  # summed over ranks
    assert runs[1][1].cancelled == 2 and runs[0][1].cancelled == 0
    assert {t.group_id for t in b0}.isdisjoint({t.group_id for t in b1})  # ids unique across ranks
    for _, _, sandbox in runs:
        assert sandbox.opened == sandbox.closed


def test_engine_generate_groups_hands_groups_in_completion_order(tok):
    backend = SlowBackend(tok, slow_s=0.2)
    sandbox = CountingSandbox()
    engine = RolloutEngine(
        backend, tok, make_retool_env_factory(sandbox, RetoolConfig()), RolloutConfig(n_per_prompt=2, progress=False)
    )
    seen = []
    try:
        trajs, stats = engine.run_coroutine(
            engine.generate_groups(problems("sf"), lambda g: seen.append([t.group_id for t in g]) or False)
        )
    finally:
        engine.close()
    assert seen == [[1, 1], [0, 0]]  # the fast problem's group first
    assert [t.group_id for t in trajs] == [0, 0, 1, 1]  # returned problem-major
    assert stats["engine/aborted_trajectories"] == 0 and stats["engine/trajectories"] == 4


def test_an_error_outside_a_trajectory_cancels_the_rest_and_closes_their_sessions(tok):
    sandbox = CountingSandbox()
    engine = RolloutEngine(
        SlowBackend(tok), tok, make_retool_env_factory(sandbox, RetoolConfig()), RolloutConfig(progress=False)
    )

    def on_group(group):
        raise RuntimeError("judge failed")

    try:
        t0 = time.perf_counter()
        with pytest.raises(RuntimeError, match="judge failed"):
            engine.run_coroutine(engine.generate_groups(problems("sf"), on_group, n=2))
        assert time.perf_counter() - t0 < SLOW_S / 4
    finally:
        engine.close()
    assert sandbox.opened == sandbox.closed


def test_round_end_is_validated():
    from stare_tir.train_config import AlgoConfig

    with pytest.raises(ValueError, match="round_end='sometimes'"):
        AlgoConfig(round_end="sometimes")
    cfg = TrainConfig()
    cfg.algo.round_end = "enough"
    cfg.trainer.max_staleness = 1
    with pytest.raises(ValueError, match=r"algo\.round_end=enough with trainer\.max_staleness=1"):
        cfg.__post_init__()
    cfg.trainer.max_staleness = 0
    cfg.__post_init__()  # synchronous: allowed


def test_round_end_as_a_config_key():
    from stare_tir.config import resolve_config

    assert resolve_config(TrainConfig, {}, ["algo.round_end=enough"]).algo.round_end == "enough"
    assert resolve_config(TrainConfig, {}).algo.round_end == "all"  # the default keeps today's rounds
    with pytest.raises(ValueError, match="round_end"):
        resolve_config(TrainConfig, {}, ["algo.round_end=never"])
    with pytest.raises(ValueError, match=r"algo\.round_end=enough with trainer\.max_staleness=2"):
        resolve_config(TrainConfig, {}, ["algo.round_end=enough", "trainer.max_staleness=2"])


def test_hf_backend_frees_a_cancelled_row_at_its_next_step():
    """The HF batcher drops a row whose caller's future is cancelled: the row leaves the batch
    within a step or two, and no more tokens are computed for it. The tokens it had sampled are
    reported once as aborted (waste the cancelled caller never sees)."""
    from stare_tir.model import ensure_tiny_checkpoint
    from stare_tir.rollout.backends.base import SamplingParams
    from stare_tir.rollout.backends.hf import HFBackend, HFBackendConfig

    torch.set_num_threads(1)
    backend = HFBackend(str(ensure_tiny_checkpoint()), cfg=HFBackendConfig(max_batch_size=4))

    async def scenario():
        long = SamplingParams(temperature=1.0, max_new_tokens=2000, seed=1)
        task = asyncio.ensure_future(backend.generate([1, 2, 3], long, []))
        while backend.stats["decode_steps"] < 5:
            await asyncio.sleep(0.01)
        task.cancel()
        at_cancel = backend.stats["decode_steps"]
        await asyncio.gather(task, return_exceptions=True)  # the cancellation reaches generate()
        aborted = backend.take_aborted_tokens(), backend.take_aborted_tokens()
        t0 = time.perf_counter()
        while backend._batch is not None and time.perf_counter() - t0 < 10:
            await asyncio.sleep(0.01)
        freed_after = backend.stats["decode_steps"] - at_cancel
        await asyncio.sleep(0.2)  # nothing runs for it any more
        steps = backend.stats["decode_steps"] - at_cancel
        return task.cancelled(), backend._batch is None, freed_after, steps, at_cancel, aborted

    try:
        cancelled, empty, freed_after, total, at_cancel, aborted = asyncio.run(scenario())
    finally:
        backend.close()
    assert cancelled and empty
    assert freed_after <= 2 and total == freed_after
    # one token per decode step of its single row, counted when the caller went away, taken once
    assert at_cancel <= aborted[0] <= at_cancel + 1 and aborted[1] == 0


@pytest.mark.slow
def test_a_training_step_with_round_end_enough(tmp_path):
    """The whole step on the tiny config (HF backend, local sandbox, DeepSpeed on gloo): enough
    fills the batch, trains on it, and logs the round's metrics."""
    from stare_tir.config import resolve_config
    from stare_tir.model import resolve_model_path
    from stare_tir.trainer import build_run, close_run, rl_step

    overrides = [
        "model.path=tiny",
        "sft.enabled=false",
        "algo.name=grpo",
        "algo.dynamic_sampling=true",
        "algo.oversample=2",
        "algo.round_end=enough",
        "data.arithmetic_train_size=200",
        "data.arithmetic_eval_size=2",
        "trainer.prompts_per_step=2",
        "rollout.n_per_prompt=4",
        "rollout.max_total_tokens=64",
        "rollout.max_new_tokens_per_turn=32",
        "trainer.eval_every=0",
        "learner.zero_stage=0",
        f"trainer.run_dir={tmp_path}",
    ]
    cfg = resolve_config(TrainConfig, {}, overrides)
    run = build_run(cfg, resolve_model_path(cfg.model), tmp_path)
    try:
        row = rl_step(run, 1)
    finally:
        close_run(run)
    for key in ("batch/aborted_trajectories", "batch/aborted_tokens", "rollout/kept_mean_length"):
        assert key in row
    assert row["batch/prompts"] >= 4 and row["batch/groups"] <= 2  # refill rounds when groups are equal
    assert row["rollout/all_mean_length"] > 0
