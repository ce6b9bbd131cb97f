"""The Retool code-interpreter environment.

The model reasons in text and may write code as

    <code>
    ```python
    print(6 * 7)
    ```
    </code>

Generation stops at `</code>`; `RetoolEnv.step` runs the turn's last code block in the
trajectory's own sandbox session and returns the observation that the engine appends verbatim:

    "\\n<interpreter>\\n42\\n</interpreter>\\n"

The trajectory ends when a turn holds a final answer (`\\boxed{}`, optionally inside
`<answer>...</answer>`) after its last code block, when a turn holds no code, when the tool budget
is spent, or when the sandbox infrastructure fails (`sandbox_error`: the trainer excludes such
trajectories instead of scoring them as wrong).

What code prints can never forge structure: our tags (`<interpreter>`, `</interpreter>`,
`<code>`, `</code>`, `<answer>`, `</answer>`) and chat-template control strings (`<|im_end|>`,
`<|im_start|>`, `<|endoftext|>`, any `<|...|>`) are broken by a space before they reach the model,
so neither the tokenizer (special tokens) nor our parsers (tags) can see them. Grading ignores
interpreter output entirely, so a printed `\\boxed{}` never counts as the model's answer.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from typing import Literal

from loguru import logger

from envs.base import EnvFactory, StepResult
from envs.grading import GRADERS, get_grader
from envs.reward import RewardFunction, load_reward_fn
from envs.tool_formats import TOOL_FORMATS, make_tool_format
from sandbox.base import ExecResult, ExecStatus, Sandbox, Session

RETOOL_SYSTEM_PROMPT = (
    "Solve the following problem step by step. You may write Python code to help your reasoning: "
    "it runs in a sandbox and what it prints is returned to you inside "
    "<interpreter>...</interpreter>. Write each piece of code as a complete script, including its "
    "imports, in this format:\n<code>\n```python\n# code\n```\n</code>\n"
    "End your response with the final answer in this format:\n<answer>\n\\boxed{final answer}\n</answer>"
)
SHORT_SYSTEM_PROMPT = (
    "Run Python with <code>\n```python\n...\n```\n</code>; output comes in <interpreter>. Answer in \\boxed{}."
)
PROMPTS = {"retool": RETOOL_SYSTEM_PROMPT, "short": SHORT_SYSTEM_PROMPT}

# Strings that code output must never carry to the model verbatim (see module docstring).
_FORBIDDEN = ("<interpreter>", "</interpreter>", "<code>", "</code>", "<answer>", "</answer>")
_SPECIAL_RE = re.compile(r"<(\|[^<>|\s]{1,40}\|)>")  # <|im_end|>, <|im_start|>, <|endoftext|>, ...
_INTERPRETER_RE = re.compile(r"<interpreter>.*?(?:</interpreter>|$)", re.DOTALL)
_CODE_BLOCK_RE = re.compile(r"<code>(.*?)(?:</code>|$)", re.DOTALL)
_FENCE_RE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n?(.*?)(?:```|$)", re.DOTALL)


@dataclass
class RetoolConfig:
    """Settings of the Retool environment (one env per trajectory)."""

    # Prompt preset: "retool" (full instructions, for real models) or "short" (a one-line system
    # prompt, for the tiny CPU model whose context is a few hundred tokens).
    prompt: Literal["retool", "short"] = "retool"
    # How a tool call is written and answered (`envs.tool_formats.TOOL_FORMATS`, docs/tool-formats.md):
    # "retool" = the `<code>`/`<interpreter>` text tags; "hermes" = native tool calling, `<tool_call>`
    # JSON and `tool` messages rendered by the model's chat template (which must be able to call tools).
    tool_format: str = field(default="retool", metadata={"choices": TOOL_FORMATS.names})
    # Replaces the preset's system prompt when set.
    system_prompt: str | None = None
    # The user message; "{problem}" is replaced by the problem text (no other braces are touched).
    user_template: str = "{problem}"
    # Code executions allowed per trajectory; a turn asking for one more ends the trajectory.
    max_tool_calls: int = 8
    # Wall-time limit of one code run, seconds (Retool evaluation uses 5 s; the sandbox's own
    # limit still applies and can only shorten it).
    code_timeout_s: float = 5.0
    # True: variables persist across the code blocks of a trajectory (notebook-like).
    stateful: bool = True
    # Longest interpreter text returned (chars); longer output keeps its head and tail.
    obs_max_chars: int = 512
    # Share of obs_max_chars given to the head of a truncated output (the rest is the tail).
    obs_head_ratio: float = 0.5
    # Shown when the code printed nothing (an empty observation teaches nothing).
    empty_output: str = "(no output)"
    # Reward for a correct final answer.
    reward_correct: float = 1.0
    # Reward for a wrong final answer.
    reward_wrong: float = -1.0
    # Reward when no final answer can be extracted (DAPO convention: same as wrong).
    reward_no_answer: float = -1.0
    # Subtracted when the response breaks the format (no \boxed answer after the last code block,
    # an unclosed <code>, or no <answer> block when require_answer_tag). 0 disables it.
    format_penalty: float = 0.0
    # Whether the format check demands the final \boxed{} inside <answer>...</answer>.
    require_answer_tag: bool = False
    # Hard time bound of one symbolic grading call, seconds.
    grade_timeout_s: float = 3.0
    # Which grader scores the final answer (rewards and evaluation alike; summary.json records it):
    # "builtin" = our extraction + exact numbers + sympy + math-verify guarded by an exact re-check
    # (recall at least math-verify's, no float tolerance); "math_verify" = Hugging Face math-verify
    # alone, for numbers comparable with papers that grade with it; "boxed" = builtin, but only a
    # \boxed{} answer counts. The names are those of `envs.grading.GRADERS`. See envs/grading/grader.py.
    grader: str = field(default="builtin", metadata={"choices": GRADERS.names})
    # The decimal rule of the builtin and boxed graders (envs/grading/grader.py): true accepts a decimal
    # that states more digits than a rounded decimal gold and rounds to it ("27.3912" for "27.39",
    # as a grader of a "round to two decimals" problem would); false demands the gold's value.
    grade_finer_decimals: bool = True
    # A reward function of your own instead of the grader, as "package.module:function": called
    # with (response_text, sample) and returning the reward, or a dict with "reward" (and
    # "correct", "pred", ...); used for training rewards and evaluation's correctness alike
    # (envs/reward.py, docs/extending.md). "": the grader (env.grader).
    reward: str = ""
    # Hard time bound of one reward-function call, seconds: a call that raises or runs longer
    # gets reward_wrong and is counted in grade/error_rate or grade/timeout_rate.
    reward_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.max_tool_calls < 0:
            raise ValueError(f"max_tool_calls={self.max_tool_calls!r}: must be >= 0")
        if self.code_timeout_s <= 0:
            raise ValueError(f"code_timeout_s={self.code_timeout_s!r}: must be > 0")
        if self.obs_max_chars < 64:
            raise ValueError(f"obs_max_chars={self.obs_max_chars!r}: must be >= 64")
        if not 0.0 <= self.obs_head_ratio <= 1.0:
            raise ValueError(f"obs_head_ratio={self.obs_head_ratio!r}: must be in [0, 1]")
        if self.format_penalty < 0:
            raise ValueError(f"format_penalty={self.format_penalty!r}: must be >= 0")
        if self.grade_timeout_s <= 0:
            raise ValueError(f"grade_timeout_s={self.grade_timeout_s!r}: must be > 0")
        GRADERS.check(self.grader, "grader")
        TOOL_FORMATS.check(self.tool_format, "tool_format")
        if self.reward_timeout_s <= 0:
            raise ValueError(f"reward_timeout_s={self.reward_timeout_s!r}: must be > 0")
        if self.reward:
            load_reward_fn(self.reward)  # a misspelled function fails here, in one line
        if self.prompt not in PROMPTS:
            raise ValueError(f"prompt={self.prompt!r}: must be one of {sorted(PROMPTS)}")
        if "{problem}" not in self.user_template:
            raise ValueError(f"user_template={self.user_template!r}: must contain {{problem}}")


# ----------------------------------------------------------------------------- text helpers


def extract_code(turn_text: str) -> tuple[str | None, int]:
    """(code, position of its <code> tag) of the last code block of a turn, or (None, -1).

    Tolerates a block cut by the stop string (no `</code>`) and a missing closing fence; a block
    without a fence is taken as code as is.
    """
    blocks = list(_CODE_BLOCK_RE.finditer(turn_text))
    if not blocks:
        return None, -1
    last = blocks[-1]
    body = last.group(1)
    fence = _FENCE_RE.search(body)
    code = fence.group(1) if fence else body
    return code.strip("\n"), last.start()


def strip_interpreter(text: str) -> str:
    """The model-written part of a response: interpreter blocks removed."""
    return _INTERPRETER_RE.sub("", text)


def neutralize(text: str) -> str:
    """Break our tags and chat control strings so printed text cannot forge structure."""
    for tag in _FORBIDDEN:
        text = text.replace(tag, tag[0] + " " + tag[1:])
    return _SPECIAL_RE.sub(lambda m: "< " + m.group(1) + ">", text)


def truncate_middle(text: str, max_chars: int, head_ratio: float = 0.5) -> str:
    """Keep the head and tail of `text` within max_chars, marking what was cut."""
    if len(text) <= max_chars:
        return text
    marker = f"\n...[{len(text)} chars, middle omitted]...\n"
    keep = max(0, max_chars - len(marker))
    head = int(keep * head_ratio)
    tail = keep - head
    return text[:head] + marker + (text[len(text) - tail :] if tail else "")


def _last_error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


# ----------------------------------------------------------------------------- env


class RetoolEnv:
    """One trajectory of a problem with a Python interpreter (implements envs.base.Env)."""

    def __init__(
        self,
        problem: dict,
        sandbox: Sandbox,
        cfg: RetoolConfig | None = None,
        reward_fn: RewardFunction | None = None,
    ) -> None:
        self.problem = problem
        self.sandbox = sandbox
        self.cfg = cfg or RetoolConfig()
        self.format = make_tool_format(self.cfg.tool_format)
        self.stop_strings = list(self.format.stop_strings)
        # Chat formats: the tools' schemas for the chat template (the engine renders tool turns).
        self.tools = list(self.format.tools)
        self.reward_fn = reward_fn  # env.reward's function, shared by the factory's envs (None: the grader)
        self.stats = {"tool_calls": 0, "code_errors": 0, "timeouts": 0, "sandbox_errors": 0, "void_turns": 0}
        if self.format.chat_turns:  # only a JSON call can be malformed
            self.stats["format_errors"] = 0
        self.sandbox_error = False
        self.turns = 0
        self._stack: contextlib.AsyncExitStack | None = None
        self._session: Session | None = None
        self._closed = False

    # -- prompt
    def initial_messages(self) -> list[dict]:
        system = (
            self.cfg.system_prompt
            if self.cfg.system_prompt is not None
            else self.format.system_prompts[self.cfg.prompt]
        )
        user = self.cfg.user_template.replace("{problem}", str(self.problem["problem"]))
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    # -- one model turn
    async def step(self, turn_text: str) -> StepResult:
        self.turns += 1
        call = self.format.find_call(turn_text)
        answer_pos = _final_answer_pos(turn_text)
        info: dict = {"turn": self.turns}
        if call is None or (answer_pos is not None and answer_pos > call.pos):
            if call is None and answer_pos is None:
                self.stats["void_turns"] += 1
                info["void_turn"] = True
            info["reason"] = "answer" if answer_pos is not None else "no_code"
            return StepResult(None, True, info)
        if self.stats["tool_calls"] >= self.cfg.max_tool_calls:
            info["reason"] = "max_tool_calls"
            return StepResult(None, True, info)
        if call.error:  # malformed: the model reads why, the run goes on (max_turns bounds retries)
            self.stats["format_errors"] = self.stats.get("format_errors", 0) + 1
            info["format_error"] = call.error
            return StepResult(self.format.observation(call.error), False, info)
        self.stats["tool_calls"] += 1
        result = await self._run(call.code)
        obs = self._observation(result, info)
        if self.sandbox_error:
            info["reason"] = "sandbox_error"
        return StepResult(obs, self.sandbox_error, info)

    async def _run(self, code: str) -> ExecResult:
        try:
            if self._session is None:
                self._stack = contextlib.AsyncExitStack()
                self._session = await self._stack.enter_async_context(
                    self.sandbox.session(stateless=not self.cfg.stateful)
                )
            return await self._session.run(code, timeout=self.cfg.code_timeout_s)
        except Exception as e:  # infrastructure: the protocol promises results, not exceptions
            logger.warning("sandbox failure on problem {}: {!r}", self.problem.get("id"), e)
            return ExecResult.infra_failure(f"{type(e).__name__}: {e}")

    def _observation(self, result: ExecResult, info: dict) -> str:
        status = ExecStatus(result.status).value
        stdout = result.stdout or ""
        info["status"] = status
        if status == "ok":
            body = stdout if stdout.strip() else self.cfg.empty_output
        elif status == "timeout":
            self.stats["timeouts"] += 1
            info["timeout"] = True
            ran = float(result.duration_s or self.cfg.code_timeout_s)
            body = (
                stdout.rstrip("\n") + "\n" if stdout.strip() else ""
            ) + f"TimeoutError: the code was stopped at the time limit ({ran:.1f} s)"
        elif status == "sandbox_error":
            self.stats["sandbox_errors"] += 1
            self.sandbox_error = True
            info["sandbox_error"] = True
            info["error"] = result.error
            body = "SandboxError: the interpreter is unavailable; the code was not run"
        else:
            self.stats["code_errors"] += 1
            info["code_error"] = True
            if status == "error":
                tail = _last_error_line(result.stderr or "") or "Error"
            elif status == "oom":
                tail = "MemoryError: the code ran out of memory"
            elif status == "output_limit":
                tail = "OutputLimitError: the code printed too much and was stopped"
            else:
                tail = f"Killed (signal {result.signal})" if result.signal else "Killed"
            body = stdout + ("\n" if stdout and not stdout.endswith("\n") else "") + tail
        body = truncate_middle(body.strip("\n"), self.cfg.obs_max_chars, self.cfg.obs_head_ratio)
        return self.format.observation(body)

    # -- grading
    def reward(self, response_text: str) -> tuple[float, dict]:
        cfg = self.cfg
        model_text = self.format.model_text(response_text)
        if self.reward_fn is not None:
            return self._own_reward(model_text)
        gold = str(self.problem["answer"])
        grader = get_grader(cfg.grader, finer_decimals=cfg.grade_finer_decimals)
        graded = grader.check(model_text, gold, timeout_s=cfg.grade_timeout_s)
        pred, correct = graded.pred, graded.correct
        format_ok = self._format_ok(model_text)
        if correct:
            r = cfg.reward_correct
        else:
            r = cfg.reward_wrong if pred is not None else cfg.reward_no_answer
        if not format_ok:
            r -= cfg.format_penalty
        # grade_s / grade_timeout: per-step metrics (the trainer's rollout_stats averages them).
        return r, {
            "correct": bool(correct),
            "pred": pred,
            "format_ok": format_ok,
            "has_answer": pred is not None,
            "grade_s": graded.seconds,
            "grade_timeout": graded.timed_out,
            "grade_stage": graded.stage,
            "gold": gold,
        }

    def _own_reward(self, model_text: str) -> tuple[float, dict]:
        """env.reward's function instead of the grader; its failure is a graded-wrong trajectory
        counted in grade/error_rate or grade/timeout_rate (envs/reward.py)."""
        assert self.reward_fn is not None
        got = self.reward_fn(model_text, self.problem)
        format_ok = self._format_ok(model_text)
        r = got.reward if got.reward is not None else self.cfg.reward_wrong
        if not format_ok:
            r -= self.cfg.format_penalty
        info = {
            "correct": bool(got.correct) and not got.error,
            "pred": got.pred,
            "format_ok": format_ok,
            "has_answer": got.pred is not None,
            "grade_s": got.seconds,
            "grade_timeout": got.timed_out,
            "grade_error": bool(got.error) and not got.timed_out,
            "grade_stage": "reward_fn",
            "gold": str(self.problem.get("answer", "")),
        }
        if got.error:
            info["reward_error"] = got.error
        if got.extra:
            info["reward_extra"] = got.extra
        return r, info

    def _format_ok(self, model_text: str) -> bool:
        open_tag, close_tag = self.format.call_tags
        if model_text.count(open_tag) != model_text.count(close_tag):
            return False
        pos = _final_answer_pos(model_text, need_tag=self.cfg.require_answer_tag)
        last_code = model_text.rfind(close_tag)
        return pos is not None and pos > last_code

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._stack is not None:
            try:
                await self._stack.aclose()
            except Exception as e:  # closing must never fail a training step
                logger.warning("closing sandbox session failed: {!r}", e)
        self._stack = self._session = None


def _final_answer_pos(text: str, need_tag: bool = False) -> int | None:
    """Start of the last \\boxed{} / <answer> block in (model-written) text, or None."""
    tag = text.rfind("<answer>")
    if need_tag:
        return tag if tag >= 0 and re.search(r"\\(?:boxed|fbox)", text[tag:]) else None
    boxed = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    pos = max(tag, boxed)
    return pos if pos >= 0 else None


def make_retool_env_factory(sandbox: Sandbox, cfg: RetoolConfig | None = None) -> EnvFactory:
    """One RetoolEnv per trajectory, all sharing `sandbox` (each opens its own session) and, with
    env.reward, one reward function's worker."""
    cfg = cfg or RetoolConfig()
    reward_fn = RewardFunction(cfg.reward, cfg.reward_timeout_s) if cfg.reward else None

    def factory(problem: dict) -> RetoolEnv:
        return RetoolEnv(problem, sandbox, cfg, reward_fn)

    return factory
