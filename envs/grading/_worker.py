"""The grading worker process: `python -m envs.grading._worker`, started by `envs.grading`.

It reads one JSON request per line and answers {"equal": bool, "stage": str}:
- builtin/boxed requests {"pred", "gold" (normalized), "pred_raw", "gold_raw", "finer_decimals",
  "timeout"}: our sympy comparison (`envs.grading._symbolic`); when that cannot read a side, math-verify
  guarded by our exact re-check (`envs.grading._mv_stage`);
- math_verify requests {"mode": "math_verify", "response", "gold_raw", "timeout"}: math-verify
  alone, its extraction and its verdict; the reply adds "pred", the answer it extracted;
- {"mode": "math_verify_pair", "pred", "gold_raw"}: math-verify's comparison of two extracted
  answers (maj@N groups answers with it under the math_verify grader).
Each request runs under a soft SIGALRM bound (0.9 x its timeout); the parent kills the process
at the hard bound when C code ignores the signal, and starts a new one. The address space is
capped (4 GiB) so a pathological answer cannot take the machine's memory with it.
"""

from __future__ import annotations

import json
import signal
import sys

from envs.grading._symbolic import symbolic_equivalent


def _judge(req: dict, mv) -> dict:
    """{"equal", "stage"[, "pred"]} of one request; see `envs.grading` for the stages."""
    mode = req.get("mode")
    if mode in ("math_verify", "math_verify_pair"):
        if mv is None:
            raise RuntimeError("math-verify is not installed")
        if mode == "math_verify_pair":
            return {"equal": mv.math_verify_pair(str(req["pred"]), str(req["gold_raw"])), "stage": "math_verify"}
        equal, pred = mv.math_verify_response(str(req["response"]), str(req["gold_raw"]))
        return {"equal": equal, "stage": "math_verify", "pred": pred}
    finer = bool(req.get("finer_decimals", True))
    verdict = symbolic_equivalent(str(req["pred"]), str(req["gold"]), finer_decimals=finer)
    if verdict:
        return {"equal": True, "stage": "symbolic"}
    if verdict is None and mv is not None and req.get("pred_raw") is not None:
        equal = mv.guarded_equal(str(req["pred_raw"]), str(req["gold_raw"]), finer_decimals=finer)
        return {"equal": equal, "stage": "math_verify"}
    return {"equal": False, "stage": "symbolic"}


class _Timeout(BaseException):
    pass


def _on_alarm(signum, frame):
    raise _Timeout()


def main() -> None:
    """Serve JSON lines (a request of the grader's `envs.line_worker.LineWorker`) -> {"equal", "stage"}."""
    try:
        import resource  # a pathological answer must not take the machine's memory with it

        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    except Exception:
        pass
    signal.signal(signal.SIGALRM, _on_alarm)
    out, sys.stdout = sys.stdout, sys.stderr  # stray prints (warnings) must not corrupt the protocol
    try:
        from envs.grading import _mv_stage as mv  # (math-verify loads here, in the worker only)

        mv.warm()
    except ImportError:
        mv = None  # the builtin grader still works (our stages only); math_verify mode reports it
    symbolic_equivalent("\\sqrt{2}x", "2^{1/2}x")  # warm the caches before saying ready
    out.write("ready\n")
    out.flush()
    for line in sys.stdin:
        reply: dict = {"equal": False, "stage": "error"}
        try:
            req = json.loads(line)
            # Soft bound inside (the parent kills us at the hard bound if C code ignores it).
            signal.setitimer(signal.ITIMER_REAL, max(0.05, 0.9 * float(req.get("timeout", 3.0))))
            reply = _judge(req, mv)
        except _Timeout:
            reply = {"equal": False, "stage": "timeout"}
        except (Exception, RecursionError, MemoryError):
            pass
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        out.write(json.dumps({**reply, "equal": bool(reply["equal"])}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
