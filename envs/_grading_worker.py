"""The grading worker process: `python -m envs._grading_worker`, started by `envs.grading`.

It reads one JSON request per line and answers {"equal": bool, "stage": str}:
- builtin/boxed requests {"pred", "gold" (normalized), "pred_raw", "gold_raw", "timeout"}: our
  sympy comparison (`envs._symbolic`); when that cannot read a side, math-verify guarded by our
  exact re-check (`envs._mv_stage`);
- math_verify requests {"mode": "math_verify", "response", "gold_raw", "timeout"}: math-verify
  alone.
Each request runs under a soft SIGALRM bound (0.9 x its timeout); the parent kills the process
at the hard bound when C code ignores the signal, and starts a new one. The address space is
capped (4 GiB) so a pathological answer cannot take the machine's memory with it.
"""

from __future__ import annotations

import json
import signal
import sys

from envs._symbolic import symbolic_equivalent


def _judge(req: dict, mv) -> tuple[bool, str]:
    """(verdict, deciding stage) of one request; see `envs.grading` for the stages."""
    if req.get("mode") == "math_verify":
        if mv is None:
            raise RuntimeError("math-verify is not installed")
        return mv.math_verify_equal(str(req["response"]), str(req["gold_raw"])), "math_verify"
    verdict = symbolic_equivalent(str(req["pred"]), str(req["gold"]))
    if verdict:
        return True, "symbolic"
    if verdict is None and mv is not None and req.get("pred_raw") is not None:
        return mv.guarded_equal(str(req["pred_raw"]), str(req["gold_raw"])), "math_verify"
    return False, "symbolic"


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def main() -> None:
    """Serve JSON lines (a request of `envs.grading._SymbolicWorker.call`) -> {"equal", "stage"}."""
    try:
        import resource  # a pathological answer must not take the machine's memory with it

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    except Exception:
        pass
    signal.signal(signal.SIGALRM, _on_alarm)
    out, sys.stdout = sys.stdout, sys.stderr  # stray prints (warnings) must not corrupt the protocol
    try:
        from envs import _mv_stage as mv  # (math-verify loads here, in the worker only)

        mv.warm()
    except ImportError:
        mv = None  # the builtin grader still works (our stages only); math_verify mode reports it
    symbolic_equivalent("\\sqrt{2}x", "2^{1/2}x")  # warm the caches before saying ready
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        stage = "error"
        try:
            req = json.loads(line)
            # Soft bound inside (the parent kills us at the hard bound if C code ignores it).
            signal.setitimer(signal.ITIMER_REAL, max(0.05, 0.9 * float(req.get("timeout", 3.0))))
            equal, stage = _judge(req, mv)
        except _Timeout:
            equal, stage = False, "timeout"
        except (Exception, RecursionError, MemoryError):
            equal = False
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(json.dumps({"equal": bool(equal), "stage": stage}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
