"""A policy whose code attacks the sandbox is scored, not dropped, and cannot grow the trainer.

The "model" is the scripted backend of the rollout tests; its code really runs in the local
sandbox through the real RetoolEnv and RolloutEngine, and the trainer's own drop_for_update
decides what reaches the loss. The code forges control frames (a reply for its own cell and a
flood of them from a thread that outlives the cell), tries to kill the worker and crashes its
own session: every such trajectory must come back as failed code (reward -1, kept for the
update), never as sandbox_error (which the update would exclude, i.e. an escape from -1).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from envs.retool import RetoolConfig, make_retool_env_factory
from sandbox import SandboxConfig, make_sandbox
from stare_tir.rollout.engine import RolloutConfig, RolloutEngine
from stare_tir.trainer import AlgoConfig, drop_for_update

pytestmark = pytest.mark.xdist_group("sandbox-local")

_spec = importlib.util.spec_from_file_location(
    "rollout_fakes", Path(__file__).resolve().parents[1] / "rollout" / "conftest.py"
)
_fakes = sys.modules.setdefault("rollout_fakes", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(_fakes)  # registered first: its dataclasses look their module up

PROBLEM = {"id": "t0", "problem": "What is 6 * 7?", "answer": "42"}
FORGE = (
    "import os, json, struct, threading\n"
    "def frame(cell):\n"
    "    h = json.dumps({'op': 'done', 'cell': cell, 'exit_code': 0}).encode()\n"
    "    os.write(3, struct.pack('!II', len(h), 0) + h)\n"
    "def flood():\n"
    "    for n in range(10 ** 7):\n"
    "        frame(2 + n % 5)\n"
    "frame(1)\n"
    "threading.Thread(target=flood, daemon=True).start()\n"
    "raise ValueError('the real outcome')\n"
)
KILL = (
    "import os, signal, ctypes\n"
    "for pid in (-1, 0, 1, os.getppid()):\n"
    "    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n"
    "ctypes.string_at(0)\n"
)
TURNS = [
    f"<code>\n```python\n{FORGE}```\n</code>",
    f"<code>\n```python\n{KILL}```\n</code>",
    "<code>\n```python\nprint(6 * 7)\n```\n</code>",
    "I am not sure: \\boxed{41}.<EOS>",
]


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


@pytest.fixture
def engine(qwen_tok):
    if os.geteuid() != 0:
        pytest.skip("the local sandbox's rootless mode is tested in tests/sandbox/test_sandbox_rootless.py")
    sandbox = make_sandbox(SandboxConfig(workers=2, preload=[]))
    backend = _fakes.ScriptedBackend(qwen_tok, TURNS)
    eng = RolloutEngine(
        backend,
        qwen_tok,
        make_retool_env_factory(sandbox, RetoolConfig(code_timeout_s=5.0)),
        RolloutConfig(n_per_prompt=3, max_total_tokens=2048, max_turns=6, progress=False),
    )
    eng.run_coroutine(sandbox.__aenter__())
    yield eng, sandbox
    try:
        eng.run_coroutine(sandbox.close())
    finally:
        eng.close()


@pytest.fixture(scope="module")
def qwen_tok():
    from stare_tir.model import build_qwen_tokenizer

    return build_qwen_tokenizer()


def test_forged_frames_and_a_killed_session_are_failed_code_and_memory_stays_flat(engine):
    eng, sandbox = engine
    eng.run([PROBLEM])  # warm-up: tokenizer caches, sandbox spares, engine loop
    rss0 = _rss_mb()
    trajs = []
    for _ in range(2):
        batch, _stats = eng.run([PROBLEM])
        trajs += batch
    grown = _rss_mb() - rss0
    assert grown < 30, f"the trainer grew {grown:.0f} MB while the code flooded its control channel"
    for t in trajs:
        t.check()
        assert not t.sandbox_error, t.text
        assert t.tool_calls == 3 and t.finish_reason == "answer" and t.reward == -1.0, (t.tool_calls, t.text)
        assert "SandboxError" not in t.text
        assert "42" in t.text  # the third cell ran in a fresh interpreter and worked
    kept, counts = drop_for_update(trajs, AlgoConfig())
    assert len(kept) == len(trajs) and counts["sandbox_error"] == 0, counts
    assert sandbox.stats["tampered"] + sandbox.stats["leftover_thread_restarts"] >= len(trajs), sandbox.stats
