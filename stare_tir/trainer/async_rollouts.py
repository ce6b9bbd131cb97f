"""Asynchronous rollouts with bounded staleness (`trainer.max_staleness` = eta >= 1): the batches of
the next eta steps generate while this step trains.

Layout: one process per rank, as in the synchronous loop. The rollout engine's event loop runs in
a background thread and generates (the producer); the main thread trains (the learner) and is the
only thread that runs collectives, so the ranks' collectives (DeepSpeed's and ours) keep the order
of the synchronous loop and the producer never takes part in one. Why threads and not a producer
process per rank (verl's fully-async and AReaL run rollout workers apart): generation itself runs
in the SGLang servers (or, with the HF backend, in torch kernels that release the GIL); what stays
in the trainer is sending requests, running sandboxes and grading, all asyncio on the engine's loop,
which also owns the sandbox. A process would need its own copy of all of it and a queue across
processes, for no gain.

Schedule. Round b is the first sampling round of step b: its k x `prompts_per_step` prompts
(`algo.oversample` k), sharded over ranks, seeded from (seed, step, round 0, rank), exactly what
`collect_batch` would take. Round b may start once step b-1-eta has finished, so at the start of
step s the learner schedules rounds s .. s+eta and waits for round s. Scheduled rounds generate
one at a time, in step order (as verl's one-step-off pipeline): the round the learner needs next
never shares the servers with a later one (started together, rounds 1 and 2 made the first step
wait for both). While step s trains, rounds s+1 .. s+eta generate with the weights of step s-1
(or later). The push after step s comes while they run: the backend updates in flight (SGLang
servers retract their requests, take the weights and resume them: `rollout/backends/sglang/push.py`;
the HF backend lets its running requests finish on the old weights first), so their later turns
come from the new weights, and every token span records the version that sampled it. Pipelined this way, with eta=1 a step costs max(generation,
learning) instead of their sum. With eta=0 the schedule is the synchronous loop's, and the
pipeline reproduces it bit for bit (tested); `train_rl` runs eta=0 without it.

Staleness. Lags are counted in versions at training time (`trainer/staleness.py`). The schedule
bounds them by eta; a trajectory beyond eta, or one sampled by weights this trainer never pushed
(a restarted server's "default"), is dropped and counted (`dropped/stale`). A group comes from one
round, so no group mixes versions beyond eta. Dynamic sampling keeps working: a batch is filled
from the step's round, and refill rounds (`algo.dynamic_sampling_rounds`) run at once with the
current weights, as in the synchronous loop; informative groups beyond the batch are discarded and
counted there too. Over-sampling works unchanged.

Checkpoints. Before a checkpoint, the rounds scheduled ahead are waited for and saved with it
(`async_rounds_rank<r>.pt`), each with the sampler positions of its prompts; a resume loads them, so
the step after a resume trains on exactly the trajectories the uninterrupted run did. A resume on
another number of ranks regenerates them instead, with exactly their saved prompts (never by
rewinding the sampler a fixed count: refill rounds took prompts after them), now with the resumed
weights; a checkpoint without the files (a synchronous run's) had nothing ahead, and nothing is
rewound. A round whose generation failed is saved as "regenerate": the checkpoint of the step that
just trained is written whole, and the error is raised by the step that takes the round.

Failures. A round's error is raised by every rank at the step that takes it (an agreement, as for
weight pushes: `weight_sync.agree`), so no rank waits in a collective for one that stopped.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from loguru import logger

from stare_tir.data import PromptSampler
from stare_tir.rollout.trajectory import Trajectory
from stare_tir.trainer.run import Run, rollout_seed
from stare_tir.trainer.staleness import ROUND_VERSION, lag_metrics, trajectory_lag
from stare_tir.trainer.weight_sync import agree


@dataclass
class Round:
    """The first sampling round of one step, generating or done."""

    step: int
    version: int  # learner.steps_applied when it was scheduled (what its first turns sample with)
    prompts: int  # prompts it took from the sampler (all ranks)
    future: concurrent.futures.Future = field(repr=False)  # -> (trajectories, engine stats)
    start: int = 0  # sampler position of its first prompt: its prompts are positions start .. start+prompts


class BusyClock:
    """When the producer had a round generating: busy intervals, from the loop thread, read by the learner."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active = 0
        self._since = 0.0
        self._spans: list[tuple[float, float]] = []

    def start(self) -> None:
        with self._lock:
            if self._active == 0:
                self._since = time.perf_counter()
            self._active += 1

    def stop(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active == 0:
                self._spans.append((self._since, time.perf_counter()))

    def busy_between(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1] during which some round was generating (older spans are dropped)."""
        with self._lock:
            spans = list(self._spans) + ([(self._since, t1)] if self._active else [])
            self._spans = [s for s in self._spans if s[1] > t0]
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans)


class AsyncRollouts:
    """The producer side of asynchronous training for one rank (see the module docstring).

    Collective methods (all ranks call them in the same order): `step_metrics`. The others are local.
    """

    FILE = "async_rounds_rank{rank}.pt"

    def __init__(self, run: Run, max_staleness: int) -> None:
        if max_staleness < 0:
            raise ValueError(f"max_staleness={max_staleness!r}: must be >= 0")
        self.run, self.eta = run, max_staleness
        algo = run.cfg.algo
        self.round_prompts = (algo.oversample if algo.dynamic_sampling else 1) * run.cfg.trainer.prompts_per_step
        self.rounds: dict[int, Round] = {}
        self.clock = BusyClock()
        self._tail: concurrent.futures.Future | None = None  # the round scheduled last
        self._last_take = time.perf_counter()
        self._waited = 0.0  # the learner's wait for this step's round
        self._depth = (0.0, 0.0)  # (rounds done and waiting, rounds generating) when it was taken
        self._round_s = 0.0  # how long this step's round generated
        self.served = [run.learner.steps_applied]  # versions in the order they were served (lags count them)
        # step -> sampler position of a round to generate again with exactly those prompts (a
        # resume that could not use what was saved, or a round whose generation failed)
        self._replay: dict[int, int] = {}
        if max_staleness > 0:  # SGLang: pushes pause the servers (retract); HF orders them itself
            run.backend.allow_in_flight_updates(max_staleness + 1)
            if not algo.off_policy.enabled and run.learner.rank == 0:
                logger.warning(
                    f"trainer.max_staleness={max_staleness} with algo.off_policy.mode=none: trajectories up to "
                    f"{max_staleness} version(s) old are trained on without a behaviour-policy correction. "
                    "Set algo.off_policy.mode=tis (or mis) to correct for it"
                )
        run.engine.start_background()

    # ------------------------------------------------------------------ the producer

    def schedule(self, step: int) -> None:
        """Start the rounds of steps `step` .. step+eta that are not yet running (none past the run)."""
        last = min(step + self.eta, self.run.cfg.trainer.steps)
        for b in range(step, last + 1):
            if b not in self.rounds:
                self.rounds[b] = self._start(b)

    def _start(self, step: int) -> Round:
        run = self.run
        start = self._replay.pop(step, None)
        if start is None:  # a new round takes the sampler's next prompts
            start = run.sampler.position
            taken = run.sampler.take(self.round_prompts)
        else:  # the same prompts again; the sampler is already past them
            again = PromptSampler(run.sampler.problems, run.sampler.seed)
            again.position = start
            taken = again.take(self.round_prompts)
        problems = run.learner.shard(taken)
        seed = rollout_seed(run.cfg.trainer.seed, step, 0, run.learner.rank)
        version = run.learner.steps_applied
        future = self._tail = run.engine.submit(self._generate(problems, seed, version, self._tail))
        return Round(step=step, version=version, prompts=self.round_prompts, future=future, start=start)

    async def _generate(
        self, problems: list[dict], seed: int, version: int, after: concurrent.futures.Future | None
    ) -> tuple[list[Trajectory], dict]:
        if after is not None:  # one round at a time; a failed one is reported by its own taker
            previous = asyncio.wrap_future(after)
            await asyncio.wait([previous])
            if not previous.cancelled():
                previous.exception()
        self.clock.start()
        try:
            trajs, stats = await self.run.engine.generate_with_stats(problems, self.run.cfg.rollout.n_per_prompt, seed)
        finally:
            self.clock.stop()
        for t in trajs:
            t.info[ROUND_VERSION] = version
        return trajs, stats

    # ------------------------------------------------------------------ the learner

    def first_round(self, step: int) -> list[Trajectory]:
        """This step's first round (scheduling what may start now), waited for; what `collect_batch`
        uses instead of rolling out its first round."""
        if self.run.learner.steps_applied != self.served[-1]:  # the last step pushed new weights
            self.served.append(self.run.learner.steps_applied)
        self.schedule(step)
        ahead = [r for b, r in self.rounds.items() if b > step]
        done = sum(r.future.done() for r in ahead)
        self._depth = (float(done + self.rounds[step].future.done()), float(len(ahead) - done))
        t0 = time.perf_counter()
        error: BaseException | None = None
        try:
            trajs, stats = self.rounds.pop(step).future.result()
        except Exception as exc:  # every rank learns of it here, not in its next collective
            error, trajs, stats = exc, [], {}
        agree(self.run, error, f"the rollout round of step {step}")
        self._waited = time.perf_counter() - t0
        self._round_s = float(stats.get("engine/wall_s", 0.0))
        return trajs

    def is_stale(self, t: Trajectory) -> bool:
        """Beyond eta versions behind the weights being updated, or from weights never pushed."""
        lag = trajectory_lag(t, self.served)
        return lag is None or lag > self.eta

    def step_metrics(self, batch: list[Trajectory]) -> dict[str, float]:
        """Collective: lag of the update's trajectories, each side's idle seconds since the last step
        took its batch (learner: waiting for its round, max over ranks; rollouts: no round generating,
        mean over ranks), and the queue when this step took its batch (mean over ranks)."""
        learner = self.run.learner
        now = time.perf_counter()
        rollout_idle = (now - self._last_take) - self.clock.busy_between(self._last_take, now)
        self._last_take = now
        metrics = lag_metrics(learner, batch, self.served)
        means = learner.all_reduce_sum(torch.tensor([rollout_idle, *self._depth, 1.0], dtype=torch.float64))
        top = learner.all_reduce_max(torch.tensor([self._waited, self._round_s], dtype=torch.float64))
        metrics["async/learner_idle_s"] = float(top[0])
        metrics["async/round_s"] = float(top[1])
        metrics["async/rollout_idle_s"] = float(means[0] / means[3])
        metrics["async/queue_depth"] = float(means[1] / means[3])
        metrics["async/in_flight"] = float(means[2] / means[3])
        return metrics

    # ------------------------------------------------------------------ checkpoints

    def _file(self, directory: Path) -> Path:
        return Path(directory) / self.FILE.format(rank=self.run.learner.rank)

    def save(self, directory: Path) -> None:
        """Wait for the rounds scheduled ahead and write them into the checkpoint `directory` (this
        rank's file), before the checkpoint itself is written. Every round is saved with the
        sampler positions of its prompts; one whose generation failed is saved as "regenerate"
        (its error is raised by the step that takes it, after this checkpoint is complete)."""
        Path(directory).mkdir(parents=True, exist_ok=True)
        rounds = []
        for r in sorted(self.rounds.values(), key=lambda r: r.step):
            saved = {"step": r.step, "version": r.version, "prompts": r.prompts, "start": r.start}
            try:
                saved["result"] = r.future.result()
            except Exception as exc:
                logger.warning(f"the round of step {r.step} failed ({exc!r}); saved to be generated again")
                saved["regenerate"] = True
            rounds.append(saved)
        state = {
            "world_size": self.run.learner.world_size,
            "eta": self.eta,
            "rounds": rounds,
            "served": self.served,
        }
        tmp = self._file(directory).with_suffix(".tmp")
        torch.save(state, tmp)
        tmp.replace(self._file(directory))

    def load(self, directory: Path) -> None:
        """After `resume_from(directory)`: the rounds the interrupted run had scheduled ahead. Their
        trajectories when they were saved for this number of ranks; otherwise (another number of
        ranks, a failed round, a round beyond a smaller eta) they are generated again with exactly
        their prompts (the saved sampler positions), now with the resumed weights. A checkpoint
        without the files (a synchronous run's) had nothing ahead: nothing is regenerated and the
        sampler goes on from where it stopped."""
        learner, step = self.run.learner, self.run.step
        path = self._file(directory)
        state = torch.load(path, weights_only=False) if path.exists() else None
        usable = state is not None and state["world_size"] == learner.world_size
        usable = int(learner.all_reduce_sum(torch.tensor([float(not usable)])).item()) == 0
        if state is None:  # this rank did not exist: every rank saved the same positions
            found = sorted(Path(directory).glob(self.FILE.format(rank="*")))
            state = torch.load(found[0], weights_only=False) if found else None
        if state is None:
            logger.info(f"no rounds were generated ahead of step {step}; the sampler goes on from its position")
            return
        saved_eta = int(state.get("eta", self.eta))
        if saved_eta > self.eta:
            logger.warning(
                f"resumed with trainer.max_staleness={self.eta}, smaller than the {saved_eta} the checkpoint "
                f"was saved with: the rounds beyond step {step + self.eta} are generated again (their "
                "saved trajectories would be too stale to train on)"
            )
        if usable:
            self.served = list(state["served"])
        rounds = sorted(state["rounds"], key=lambda r: r["step"])
        if any("start" not in r for r in rounds):  # saved before positions were: the last prompts taken
            for i, r in enumerate(rounds):
                r["start"] = self.run.sampler.position - (len(rounds) - i) * self.round_prompts
        kept, replayed = [], []
        for saved in rounds:
            b = saved["step"]
            if usable and not saved.get("regenerate") and b <= step + self.eta:
                future: concurrent.futures.Future = concurrent.futures.Future()
                future.set_result(saved["result"])
                self.rounds[b] = Round(b, saved["version"], saved["prompts"], future, saved["start"])
                kept.append(b)
            else:
                self._replay[b] = saved["start"]
                replayed.append(b)
        if kept:
            logger.info(f"resumed {len(kept)} round(s) generated before the checkpoint: {kept}")
        if replayed:
            logger.warning(
                f"the round(s) of steps {replayed} are generated again with their saved prompts and the "
                f"resumed weights ({learner.world_size} rank(s) now, {state['world_size']} when saved)"
            )
