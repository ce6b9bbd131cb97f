"""The rollout engine: problems in, multi-turn token-level trajectories out.

For every (problem, sample) the engine runs one small state machine, many of them concurrently:

    PROMPT  chat template applied once per problem -> prompt_ids
    GEN     backend.generate(prompt_ids + response_ids, budget) until a stop string, EOS or the
            turn budget; the sampled ids and logprobs are appended as they are (loss_mask=1)
    STEP    env.step(decoded text of this turn only)
              done                  -> finish ("answer", or the env's reason)
              turn cut by budget    -> finish "max_tokens" (before STEP: a cut turn is not run)
              EOS without done      -> finish "eos"
              max_turns reached     -> finish "max_turns"
              observation           -> tokenized once as plain text, appended (loss_mask=0),
                                       cut to the remaining budget (-> "max_tokens")
            back to GEN
    END     env.reward(decoded response) -> reward; env.close()

An env that declares `tools` (a chat tool format, `env.tool_format=hermes`) gets them in its prompt
(`apply_chat_template(..., tools=...)`), and its observations are the content of `tool` messages:
the tokens appended are exactly the suffix its chat template renders for that message after the
conversation so far (`chat_turns.ChatTurns`), the model's own ids kept as sampled.

Each turn's max_new_tokens is clamped to min(max_new_tokens_per_turn, tokens left of
max_total_tokens), so no trajectory ever exceeds its budget. Trajectories run as asyncio tasks
(at most `max_concurrency` at once): while some wait for their sandbox, the backend batches the
others' generation, so sandbox time overlaps generation time.

Token-in/token-out: the engine never decodes and re-encodes model tokens. Text is decoded only to
hand it to the env (turn text) and to grade (the full response).

Asynchronous training (`trainer.max_staleness` >= 1) runs the engine's event loop in a background
thread (`start_background`) and hands it whole batches (`submit`) while the learner trains: every
`generate` call works on the settings it started with, so a batch in flight is never changed by a
later `configured(...)` block (an evaluation, another round's seed).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Iterator

from loguru import logger

from envs.base import Env, EnvFactory
from registry import Registry
from stare_tir.rollout.backends.base import ROLLOUT_BACKENDS, Backend, Generation, SamplingParams
from stare_tir.rollout.chat_turns import ChatTurns
from stare_tir.rollout.trajectory import FINISH_REASONS, Trajectory


@dataclass
class RolloutConfig:
    """How trajectories are sampled (and which backend settings apply)."""

    # Samples per problem (the GRPO group size); `generate(problems, n=None)` uses it.
    n_per_prompt: int = 8
    # Model turns per trajectory (each code call costs one turn; the final answer is one more).
    max_turns: int = 8
    # Response tokens per trajectory (model + observation tokens, prompt excluded); each turn's
    # budget is clamped to what is left, so this bounds the learner's sequence length.
    max_total_tokens: int = 4096
    # Upper bound on one model turn (a runaway turn cannot eat the whole budget at once).
    max_new_tokens_per_turn: int = 1024
    # Sampling temperature (RL: 1.0, the distribution the learner differentiates; 0 = greedy).
    temperature: float = 1.0
    # Nucleus sampling (1.0 = off). Logprobs are reported under the truncated distribution.
    top_p: float = 1.0
    # Top-k sampling (-1 = off).
    top_k: int = -1
    # Base seed: each turn gets a seed derived from (seed, group, sample, turn) where the backend
    # honours per-request seeds. None: the backend's own RNG stream.
    seed: int | None = None
    # Trajectories in flight at once (bounds open sandbox sessions and memory; the HF backend
    # batches up to its own max_batch_size of them).
    max_concurrency: int = 256
    # Stop strings added to the env's own (e.g. the env's "</code>").
    stop_strings: list[str] = field(default_factory=list)
    # Show a tqdm progress bar while a batch rolls out.
    progress: bool = True
    # One settings section per registered rollout backend, read and written as rollout.<its name>
    # (stare_tir.config: `SECTIONS`): rollout.hf (the in-process Hugging Face backend),
    # rollout.sglang (the SGLang servers), a plugin's backend's own; each at its defaults unless
    # set, whichever backend trainer.backend picks. `rollout.sglang` reads its section.
    backends: dict[str, Any] = field(default_factory=dict)

    SECTIONS: ClassVar[tuple[str, Registry]] = ("backends", ROLLOUT_BACKENDS)

    def __post_init__(self) -> None:
        for name in ("n_per_prompt", "max_turns", "max_total_tokens", "max_new_tokens_per_turn", "max_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        self.sampling(1)  # validates temperature / top_p / top_k
        self.backends = ROLLOUT_BACKENDS.settings(self.backends)

    def __getattr__(self, name: str) -> Any:
        """A backend's settings section by its name (`rollout.sglang.urls`)."""
        sections = self.__dict__.get("backends")
        if sections is not None and name in sections:
            return sections[name]
        raise AttributeError(f"{type(self).__name__} has no {name!r} (nor a rollout backend's settings by that name)")

    def sampling(self, max_new_tokens: int, seed: int | None = None) -> SamplingParams:
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_new_tokens=max_new_tokens, seed=seed
        )


def encode_plain(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` as plain text: special-token strings inside it stay ordinary text.

    Used for observations: if code prints "<|im_end|>", the model must see those characters, never
    the control token (which would end its turn or forge a chat message).
    """
    return list(tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def _derive_seed(base: int | None, group: int, sample: int, turn: int) -> int | None:
    if base is None:
        return None
    x = base * 0x9E3779B1 + group * 0x85EBCA77 + sample * 0xC2B2AE3D + turn * 0x27D4EB2F
    return x % (1 << 62)


# An env's StepResult.info["reason"] when it ends a trajectory -> our finish reason.
_DONE_REASONS = {"answer": "answer", "max_tool_calls": "max_turns", "sandbox_error": "error"}


def _finish_when_done(gen: Generation, info: dict) -> str:
    explicit = info.get("finish_reason")
    if explicit in FINISH_REASONS:
        return explicit
    mapped = _DONE_REASONS.get(info.get("reason"))
    if mapped is not None:
        return mapped
    # The env ended the episode without an answer (e.g. a turn with no code): the model simply
    # stopped talking.
    return "eos" if gen.finish_reason == "eos" or info.get("reason") == "no_code" else "answer"


class RolloutEngine:
    """Turns problems into trajectories with `backend` and one env per trajectory.

    backend: implements `stare_tir.rollout.backends.base.Backend`.
    tokenizer: the policy's HF tokenizer (chat template, decoding, observation tokenization).
    env_factory: problem dict -> Env (one per trajectory; see `envs.base.Env`).
    sandbox: the (not yet started) sandbox the envs run code in, if any. The engine owns it from
        here on: it is started on the engine's event loop at once (its worker tasks are bound to
        that loop) and stopped by `close()`.
    """

    def __init__(
        self,
        backend: Backend,
        tokenizer: Any,
        env_factory: EnvFactory,
        cfg: RolloutConfig | None = None,
        *,
        sandbox: Any = None,
    ) -> None:
        self.backend = backend
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.cfg = cfg or RolloutConfig()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None  # runs the loop in the background (start_background)
        self._submitted: set[asyncio.Task] = set()  # work started by `submit`, not yet done
        self.last_stats: dict = {}
        self.sandbox = None
        if sandbox is not None:
            self.run_coroutine(sandbox.__aenter__())
            self.sandbox = sandbox  # set only once started: close() stops only what runs

    # ------------------------------------------------------------------ public API

    async def generate(self, problems: list[dict], n: int | None = None, seed: int | None = None) -> list[Trajectory]:
        """`n` trajectories per problem (default cfg.n_per_prompt), ordered problem-major.

        group_id is the index of the problem in `problems`; rewards are filled by env.reward.
        seed: this call's base seed (None: cfg.seed). Per-batch statistics are left in
        `self.last_stats`.
        """
        trajs, self.last_stats = await self.generate_with_stats(problems, n, seed)
        return trajs

    async def generate_with_stats(
        self, problems: list[dict], n: int | None = None, seed: int | None = None
    ) -> tuple[list[Trajectory], dict]:
        """`generate`, returning this call's statistics with its trajectories (calls that overlap
        on the loop each get their own)."""
        cfg = self.cfg if seed is None else dataclasses.replace(self.cfg, seed=seed)  # fixed for this call
        n = cfg.n_per_prompt if n is None else n
        if n < 1:
            raise ValueError(f"n={n!r}: must be >= 1")
        sem = asyncio.Semaphore(cfg.max_concurrency)
        prompts: dict[int, list[int]] = {}
        bar = _progress(len(problems) * n, cfg.progress)
        t0 = time.perf_counter()
        counters = Counter()

        async def one(group: int, sample: int) -> Trajectory:
            async with sem:
                traj = await self._rollout(problems[group], group, sample, prompts, cfg)
            counters["model_tokens"] += traj.num_model_tokens
            counters["turns"] += traj.num_turns
            if bar is not None:
                bar.update(1)
                wall = max(time.perf_counter() - t0, 1e-9)
                bar.set_postfix(
                    tok_s=f"{counters['model_tokens'] / wall:.0f}",
                    turns=f"{counters['turns'] / bar.n:.2f}",
                    refresh=False,
                )
            return traj

        tasks = [asyncio.ensure_future(one(g, s)) for g in range(len(problems)) for s in range(n)]
        try:
            trajs = await asyncio.gather(*tasks)
        except BaseException:
            # One trajectory raised outside its own error handling (e.g. the env factory): stop
            # the others instead of leaving them running on the loop, then report the error.
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            if bar is not None:
                bar.close()
        return list(trajs), rollout_stats(trajs, time.perf_counter() - t0)

    async def generate_groups(
        self,
        problems: list[dict],
        on_group: Callable[[list[Trajectory]], bool],
        n: int | None = None,
        seed: int | None = None,
    ) -> tuple[list[Trajectory], dict]:
        """Roll out `n` samples per problem, handing each group to `on_group` as soon as its last
        sample completes (completion order; a group's members in sample order); once `on_group`
        returns True the trajectories still running are cancelled.

        Why: a caller that needs only some of the groups (over-sampled dynamic sampling,
        `algo.round_end=enough`) need not wait for the slowest trajectory of the batch. A cancelled
        trajectory's env is closed (its sandbox session with it) before this returns; its backend
        call is cancelled, which the backend turns into freeing the request (the HF batcher drops
        the row at its next step; SGLang gets /abort_request).

        Returns (every completed trajectory, problem-major, including those of groups that never
        completed; this call's stats). The stats add `engine/aborted_trajectories` (cancelled,
        started or not) and `engine/aborted_tokens`: model tokens of the turns they had finished,
        plus those of the turns in flight as the backend reports them (`take_aborted_tokens`: SGLang
        and the HF backend do; a test stand-in may report 0).
        """
        cfg = self.cfg if seed is None else dataclasses.replace(self.cfg, seed=seed)  # fixed for this call
        n = cfg.n_per_prompt if n is None else n
        if n < 1:
            raise ValueError(f"n={n!r}: must be >= 1")
        sem = asyncio.Semaphore(cfg.max_concurrency)
        prompts: dict[int, list[int]] = {}
        live: dict[tuple[int, int], Trajectory] = {}  # started trajectories, partial until done
        t0 = time.perf_counter()

        async def one(group: int, sample: int) -> Trajectory:
            async with sem:
                return await self._rollout(problems[group], group, sample, prompts, cfg, live)

        keys = {asyncio.ensure_future(one(g, s)): (g, s) for g in range(len(problems)) for s in range(n)}
        finished: asyncio.Queue[asyncio.Future] = asyncio.Queue()  # in completion order (no O(N^2) waits)
        for task in keys:
            task.add_done_callback(finished.put_nowait)
        members: dict[int, dict[int, Trajectory]] = {}
        completed: dict[tuple[int, int], Trajectory] = {}
        enough = False
        try:
            for _ in range(len(keys)):
                task = await finished.get()
                group, sample = keys[task]
                completed[(group, sample)] = traj = task.result()  # raises what the rollout could not keep
                members.setdefault(group, {})[sample] = traj
                if len(members[group]) == n and on_group([members[group][s] for s in range(n)]):
                    enough = True
                    break
        finally:
            # Enough groups, or an error outside a trajectory's own handling: stop the rest and let
            # each close its env here, so no sandbox session outlives the call.
            pending = [task for task in keys if not task.done()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if enough:  # finished before the stop but not yet handed over: completed all the same
            for task, key in keys.items():
                if key not in completed and not task.cancelled() and task.exception() is None:
                    completed[key] = task.result()
        aborted = [key for key in keys.values() if key not in completed]
        trajs = [completed[key] for key in sorted(completed)]
        stats = rollout_stats(trajs, time.perf_counter() - t0)
        stats["engine/aborted_trajectories"] = float(len(aborted))
        finished_turns = sum(live[k].num_model_tokens for k in aborted if k in live)
        stats["engine/aborted_tokens"] = float(finished_turns + self.backend.take_aborted_tokens())
        return trajs, stats

    @contextlib.contextmanager
    def configured(self, cfg: RolloutConfig | None = None, **changes: Any) -> Iterator[RolloutConfig]:
        """Run with another RolloutConfig (`cfg`, and/or field `changes` over the current one) for
        the duration of the block, then restore the engine's own.

        Why swap instead of building a second engine: the engine owns the event loop that the
        backend and sandbox live on, so evaluation during training, a per-round seed, or an eval
        script's sampling settings all reuse this one instance with other settings.
        """
        saved = self.cfg
        self.cfg = dataclasses.replace(cfg or saved, **changes)
        try:
            yield self.cfg
        finally:
            self.cfg = saved

    def run(self, problems: list[dict], n: int | None = None) -> tuple[list[Trajectory], dict]:
        """Synchronous wrapper: (trajectories, per-batch stats)."""
        trajs, self.last_stats = self.run_coroutine(self.generate_with_stats(problems, n))
        return trajs, self.last_stats

    def run_coroutine(self, coro):
        """Run `coro` on the engine's event loop, which persists across calls.

        Async resources used by envs (a sandbox and its worker tasks) are bound to the loop that
        started them: pass the sandbox to the constructor (or start it here) so they stay
        valid for every `run()`. With the loop in the background, the caller waits for the result.
        """
        if self._thread is not None:
            return self.submit(coro).result()
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coro)

    def start_background(self) -> None:
        """Run the event loop in a daemon thread from now on: `submit` starts work that goes on
        while the caller does something else (the learner trains). Idempotent."""
        if self._thread is not None:
            return
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        loop = self._loop
        self._thread = threading.Thread(target=loop.run_forever, daemon=True, name="rollout-loop")
        self._thread.start()

    def submit(self, coro) -> concurrent.futures.Future:
        """Start `coro` on the background loop (`start_background`); its future resolves when it ends."""
        if self._thread is None:
            raise RuntimeError("submit() needs the loop in the background: call start_background() first")

        async def tracked():
            task = asyncio.current_task()
            self._submitted.add(task)
            try:
                return await coro
            finally:
                self._submitted.discard(task)

        return asyncio.run_coroutine_threadsafe(tracked(), self._loop)

    def _stop_background(self) -> None:
        """Stop the background loop, then cancel the work still in flight (a batch generated ahead)
        and let it wind down here, its envs closing while the sandbox still runs."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        loop = self._loop
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        pending = [t for t in self._submitted if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))

    def close(self) -> None:
        """Stop the sandbox handed to the constructor, then close the event loop (the backend is
        closed by its owner)."""
        if self._loop is not None and not self._loop.is_closed():
            loop = self._loop
            try:
                self._stop_background()
                try:  # its connections live on this loop: close them here
                    loop.run_until_complete(self.backend.aclose())
                except Exception as exc:  # never in the way of stopping the sandbox
                    logger.warning(f"closing the backend's connections: {exc!r}")
                if self.sandbox is not None:
                    sandbox, self.sandbox = self.sandbox, None
                    loop.run_until_complete(sandbox.__aexit__(None, None, None))
                pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                for task in pending:
                    task.cancel()
                if pending:
                    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    # ------------------------------------------------------------------ one trajectory

    def _prompt_ids(self, env: Env) -> list[int]:
        text = self.tokenizer.apply_chat_template(env.initial_messages(), tokenize=False, add_generation_prompt=True)
        # The template's control tokens (<|im_start|>, ...) must become their special ids here.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _chat_turns(self, env: Env) -> ChatTurns | None:
        """The conversation a chat tool format renders turn by turn, or None for a text format.
        (An env without a `tools` attribute predates tool formats: a text format.)"""
        tools = getattr(env, "tools", None)
        return ChatTurns(self.tokenizer, env.initial_messages(), tools) if tools else None

    async def _rollout(
        self,
        problem: dict,
        group: int,
        sample: int,
        prompts: dict[int, list[int]],
        cfg: RolloutConfig,
        live: dict[tuple[int, int], Trajectory] | None = None,
    ) -> Trajectory:
        env = self.env_factory(problem)
        chat = self._chat_turns(env)
        if group not in prompts:  # chat template once per problem, shared by its samples
            prompts[group] = chat.prompt_ids() if chat is not None else self._prompt_ids(env)
        traj = Trajectory(prompt_ids=list(prompts[group]), problem_id=str(problem.get("id", "")), group_id=group)
        if live is not None:  # the caller may cancel it: what it generated so far stays countable
            live[(group, sample)] = traj
        timing = {"gen_s": 0.0, "env_s": 0.0}
        try:
            try:
                await self._episode(env, traj, group, sample, timing, cfg, chat)
            except Exception as exc:  # env or backend failure: keep the record, flag it
                traj.finish_reason = "error"
                traj.info["error"] = f"{type(exc).__name__}: {exc}"
            traj.text = self.tokenizer.decode(traj.response_ids, skip_special_tokens=True)
            traj.sandbox_error = bool(env.sandbox_error)
            env_stats = dict(env.stats)
            traj.tool_calls = int(env_stats.get("tool_calls", 0))
            traj.void_turns = int(env_stats.get("void_turns", 0))
            traj.timeouts = int(env_stats.get("timeouts", 0))
            traj.info["env_stats"] = env_stats
            traj.info.update(timing)
            if traj.finish_reason != "error":
                try:
                    reward, info = env.reward(traj.text)
                    traj.reward = float(reward)
                    traj.info.update(info)
                except Exception as exc:
                    traj.finish_reason = "error"
                    traj.info["error"] = f"reward: {type(exc).__name__}: {exc}"
        finally:
            try:
                await env.close()
            except Exception as exc:  # closing must never lose the trajectory
                traj.info["close_error"] = f"{type(exc).__name__}: {exc}"
        return traj

    async def _episode(
        self,
        env: Env,
        traj: Trajectory,
        group: int,
        sample: int,
        timing: dict,
        cfg: RolloutConfig,
        chat: ChatTurns | None = None,
    ) -> None:
        stops = list(dict.fromkeys([*env.stop_strings, *cfg.stop_strings]))
        while True:
            left = cfg.max_total_tokens - len(traj.response_ids)
            if left <= 0:
                traj.finish_reason = "max_tokens"
                return
            budget = min(cfg.max_new_tokens_per_turn, left)
            sampling = cfg.sampling(budget, _derive_seed(cfg.seed, group, sample, traj.num_turns))
            t = time.perf_counter()
            gen = await self.backend.generate(traj.prompt_ids + traj.response_ids, sampling, stops)
            timing["gen_s"] += time.perf_counter() - t
            traj.append(gen.token_ids, gen.logprobs, "model", gen.weight_versions)
            traj.num_turns += 1
            if gen.finish_reason == "length":
                # Cut by its budget: a half-written turn is not executed.
                traj.finish_reason = "max_tokens"
                return
            # A chat format keeps special tokens in the turn text: a template's <tool_call> may be
            # one, and the conversation must hold exactly what the sampled ids decode to.
            turn_text = self.tokenizer.decode(gen.token_ids, skip_special_tokens=chat is None)
            if chat is not None:
                chat.model_turn(turn_text)
            t = time.perf_counter()
            step = await env.step(turn_text)
            timing["env_s"] += time.perf_counter() - t
            if step.done:
                traj.finish_reason = _finish_when_done(gen, step.info or {})
                if (step.info or {}).get("error"):  # the env's cause (a sandbox failure), kept
                    traj.info["error"] = str(step.info["error"])
                return
            if gen.finish_reason == "eos":
                traj.finish_reason = "eos"
                return
            if traj.num_turns >= cfg.max_turns:
                traj.finish_reason = "max_turns"
                return
            if step.observation:
                if chat is not None:  # the template's rendering of the tool message, exactly
                    obs = chat.tool_turn(step.observation)
                else:
                    obs = encode_plain(self.tokenizer, step.observation)
                left = cfg.max_total_tokens - len(traj.response_ids)
                traj.append(obs[:left], None, "obs")
                if len(obs) >= left:
                    traj.finish_reason = "max_tokens"
                    return


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from stare_tir.tracking import progress  # tqdm on a terminal, plain lines in a log file

    return progress(total, "rollout", "traj", leave=False)


def rollout_stats(trajs: list[Trajectory], wall_s: float | None = None) -> dict[str, float]:
    """Per-batch statistics, the one definition the engine, the trainer and evaluation share.

    Every value is a mean over trajectories (or a rate), so the trainer can average it over ranks
    weighted by trajectory counts; every finish reason gets a key, even at 0, so all ranks reduce
    the same key set. With `wall_s` (the engine's own batches) throughput and time split are
    added under `engine/`: totals of this call, not means.
    """
    n = max(len(trajs), 1)
    tool_calls = sum(t.tool_calls for t in trajs)
    finish = dict.fromkeys((*FINISH_REASONS, "none"), 0)
    for t in trajs:
        finish[t.finish_reason or "none"] += 1
    stats = {
        "reward/mean": sum(t.reward for t in trajs) / n,
        "acc/train": sum(bool(t.info.get("correct")) for t in trajs) / n,
        "rollout/response_len": sum(t.num_model_tokens for t in trajs) / n,
        "rollout/total_len": sum(len(t.response_ids) for t in trajs) / n,
        "rollout/turns": sum(t.num_turns for t in trajs) / n,
        "rollout/tool_calls": tool_calls / n,
        "rollout/tool_use_frac": sum(t.tool_calls > 0 for t in trajs) / n,
        "rollout/timeout_rate": sum(t.timeouts for t in trajs) / max(tool_calls, 1),
        "rollout/code_error_rate": sum(t.info.get("env_stats", {}).get("code_errors", 0) for t in trajs)
        / max(tool_calls, 1),
        "rollout/sandbox_error_rate": sum(t.sandbox_error for t in trajs) / n,
        "rollout/error_rate": sum(t.finish_reason == "error" for t in trajs) / n,
        "rollout/void_turns": sum(t.void_turns for t in trajs) / n,
        # Malformed tool calls (bad JSON, unknown tool, missing arguments) answered with an error.
        "rollout/tool_format_errors": sum(t.info.get("env_stats", {}).get("format_errors", 0) for t in trajs) / n,
        "grade/seconds": sum(float(t.info.get("grade_s", 0.0)) for t in trajs) / n,
        "grade/timeout_rate": sum(bool(t.info.get("grade_timeout")) for t in trajs) / n,
        "grade/error_rate": sum(bool(t.info.get("grade_error")) for t in trajs) / n,
    }
    stats.update({f"finish/{k}": v / n for k, v in finish.items()})
    if wall_s is not None:
        model_tokens = sum(t.num_model_tokens for t in trajs)
        stats.update(
            {
                "engine/trajectories": float(len(trajs)),
                "engine/model_tokens": float(model_tokens),
                "engine/obs_tokens": float(sum(len(t.response_ids) for t in trajs) - model_tokens),
                "engine/tool_calls": float(tool_calls),
                "engine/wall_s": wall_s,
                # Summed over trajectories (they overlap in time, so these can exceed wall_s).
                "engine/gen_s": sum(t.info.get("gen_s", 0.0) for t in trajs),
                "engine/env_s": sum(t.info.get("env_s", 0.0) for t in trajs),
                "engine/tokens_per_s": model_tokens / max(wall_s, 1e-9),
            }
        )
    return stats
