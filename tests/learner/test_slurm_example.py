"""docs/slurm/stare_tir.sbatch, dry-run: the real script under bash with `srun`, `scontrol` and
`curl` replaced by stand-ins that record what they were asked. The learner's srun step runs the
real trainer entry point with `--print-config`, in the environment srun gives its first task, so
the overrides the script builds are parsed and validated by the real config loader, and the
launch variables are resolved as on the cluster. The servers' step stays alive like servers do
(or, for the failure paths, dies after writing a log, or never becomes healthy)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "docs" / "slurm" / "stare_tir.sbatch"

# srun: record options and command; for the trainer, run it as srun's task 0 with --print-config
# (or, with TRAINER_STANDIN set, a trainer-like task that stops on SIGINT). SIGINT as Slurm's srun
# takes it (src/srun/libsrun/srun_job.c): an inherited SIG_IGN is reset (`_srun_signal_mgr`); one
# SIGINT prints the tasks' status and forwards nothing unless --disable-status/-X is given, which
# forwards it at once; a second within a second is forwarded and the step is then killed
# (`_handle_intr`).
SRUN = """#!{python}
import json, os, signal, subprocess, sys, time
args, opts = sys.argv[1:], {{}}
while args and args[0].startswith("-"):
    key, _, value = args.pop(0).lstrip("-").partition("=")
    opts[key] = value
with open(os.environ["SRUN_LOG"], "a") as f:
    f.write(json.dumps({{"opts": opts, "cmd": args}}) + "\\n")
if any("sglang.launch_server" in a for a in args):  # the servers' step
    if os.environ.get("SERVER_FAILS"):
        with open(os.path.join(os.environ["SHARED"], "sglang_0.log"), "w") as f:
            f.write("loading model\\ntorch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\\n")
        sys.exit(1)
    time.sleep(120)  # serving, until the job's clean-up stops it
if any(a.endswith("scripts/train_tir.py") for a in args):
    tasks = int(opts["nodes"]) * int(opts["ntasks-per-node"])
    env = {{**os.environ, "SLURM_STEP_NUM_TASKS": str(tasks), "SLURM_NTASKS": str(tasks), "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURM_STEP_NODELIST": opts["nodelist"]}}
    if os.environ.get("TRAINER_STANDIN"):
        task = subprocess.Popen([sys.executable, os.environ["TRAINER_STANDIN"]], env=env)
        last = [0.0]

        def on_int(sig, frame):
            now = time.monotonic()
            if "disable-status" in opts or "X" in opts:
                task.send_signal(signal.SIGINT)
            elif now - last[0] < 1.0:
                task.send_signal(signal.SIGINT)
                time.sleep(0.1)
                task.kill()
            else:
                print("srun: interrupt (one more within 1 sec to abort)", file=sys.stderr, flush=True)
                print("srun: StepId=1234.1 tasks 0-15: running", file=sys.stderr, flush=True)
            last[0] = now

        signal.signal(signal.SIGINT, on_int)
        sys.exit(task.wait())
    sys.exit(subprocess.call([args[0], args[1], "--print-config", *args[2:]], env=env))
"""

# A trainer rank as the USR1 path sees it: on SIGINT it finishes its step, saves and exits 0 (or,
# with TRAINER_HANGS, never ends: a step stuck in a collective). Every event goes to TRAINER_LOG.
TRAINER = """import os, signal, sys, time
def note(what):
    with open(os.environ["TRAINER_LOG"], "a") as f:
        f.write(f"{time.time():.3f} {what}\\n")
stop = []
signal.signal(signal.SIGINT, lambda *a: (note("SIGINT"), stop.append(1)))
note("started")
while not stop or os.environ.get("TRAINER_HANGS"):
    time.sleep(0.05)
time.sleep(0.5)  # the current step ends and its checkpoint is written
note("saved")
"""


def _sbatch_options() -> dict[str, str]:
    out = {}
    for line in SBATCH.read_text().splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.split(None, 1)[1].lstrip("-").partition("=")
            out[key] = value
    return out


def test_sbatch_header_parses():
    opts = _sbatch_options()
    assert int(opts["nodes"]) >= 2 and int(opts["gpus-per-node"]) == 8 and "time" in opts
    assert subprocess.run(["bash", "-n", str(SBATCH)]).returncode == 0


def _environment(tmp_path: Path, curl_ok: bool = True, **extra: str) -> tuple[dict, Path, Path]:
    """Stand-ins on PATH and the job's environment; returns it, the srun log and SHARED. `scontrol`
    and `scancel` record every call but `show hostnames` (with its time) in tmp_path/calls.log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = 'echo "$(date +%s.%N) $(basename "$0") $*" >>"$CALLS_LOG"\n'
    stubs = {
        "srun": SRUN.format(python=sys.executable),
        "scontrol": '#!/bin/bash\nif [ "$1 $2" = "show hostnames" ]; then tr , "\\n" <<<"$3"; exit; fi\n' + record,
        "scancel": "#!/bin/bash\n" + record,
        "curl": f"#!/bin/bash\nexit {0 if curl_ok else 7}\n",
    }
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    shared, log = tmp_path / "shared", tmp_path / "srun.jsonl"
    drop = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("SLURM_")}
    env.update(
        PATH=f"{bin_dir}:{env['PATH']}",
        SRUN_LOG=str(log),
        PYTHON=sys.executable,
        SHARED=str(shared),
        MODEL="ckpt/sft",
        SLURM_JOB_ID="1234",
        SLURM_JOB_NODELIST="lrn1,lrn2,sgl1",  # what `scontrol show hostnames` expands
        SLURM_NTASKS="3",  # the batch step itself: not an srun task
        SLURM_JOB_NAME="stare-tir",
        HEALTH_POLL_S="0.1",
        CALLS_LOG=str(tmp_path / "calls.log"),
        **extra,
    )
    return env, log, shared


def dry_run(tmp_path: Path, curl_ok: bool = True, **extra: str) -> tuple[subprocess.CompletedProcess, Path, Path]:
    """Run the sbatch script with the stand-ins; returns the result, the srun log and SHARED."""
    env, log, shared = _environment(tmp_path, curl_ok, **extra)
    res = subprocess.run(["bash", str(SBATCH)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return res, log, shared


def usr1_run(tmp_path: Path, **extra: str) -> tuple[int, str, list[str], list[str], float]:
    """The job with a trainer-like learner step, sent USR1 (Slurm's --signal=B:USR1) once the
    trainer runs: returns the script's status, its stderr, the trainer's events, the recorded
    scontrol/scancel calls, and the time of the USR1. A script still running 30 s later is killed."""
    (tmp_path / "trainer.py").write_text(TRAINER)
    trainer_log, calls = tmp_path / "trainer.log", tmp_path / "calls.log"
    env, _, _ = _environment(
        tmp_path, TRAINER_STANDIN=str(tmp_path / "trainer.py"), TRAINER_LOG=str(trainer_log), **extra
    )
    job = subprocess.Popen(
        ["bash", str(SBATCH)], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not (trainer_log.exists() and "started" in trainer_log.read_text()):
        assert job.poll() is None and time.monotonic() < deadline, "the trainer never started"
        time.sleep(0.1)
    sent = time.time()
    job.send_signal(signal.SIGUSR1)
    try:
        rc = job.wait(timeout=30)
    except subprocess.TimeoutExpired:
        rc = None
    with contextlib.suppress(ProcessLookupError):  # what is left (a step that never ended): the requeue ends it
        os.killpg(job.pid, signal.SIGKILL)
    _, err = job.communicate()
    events = trainer_log.read_text().splitlines()
    return rc, err, events, calls.read_text().splitlines() if calls.exists() else [], sent


def test_sbatch_dry_run_places_learner_and_servers_and_builds_a_valid_config(tmp_path):
    t0 = time.monotonic()
    res, log, shared = dry_run(tmp_path)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert time.monotonic() - t0 < 100  # the servers' step was stopped at exit, not waited for

    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(steps) == 2, steps
    # The servers' step starts in the background: which srun logs first is up to the scheduler.
    servers, learner = sorted(steps, key=lambda step: any(a.endswith("scripts/train_tir.py") for a in step["cmd"]))
    assert servers["opts"]["nodelist"] == "sgl1" and servers["opts"]["nodes"] == "1"  # their own node
    assert "sglang.launch_server" in servers["cmd"][-1]
    assert learner["opts"]["nodelist"] == "lrn1,lrn2" and learner["opts"]["ntasks-per-node"] == "8"
    assert learner["opts"]["gpus-per-node"] == "8" and "gpus-per-task" not in learner["opts"]

    cfg = yaml.safe_load(res.stdout)  # --print-config: the resolved, validated config
    sglang = cfg["rollout"]["sglang"]
    assert sglang["urls"] == [f"http://sgl1:{30000 + gpu}" for gpu in range(8)]
    assert sglang["weight_sync"] == "distributed" and sglang["master_address"] == "lrn1"  # learner rank 0
    assert sglang["sync_dir"] == str(shared / "sync") and (shared / "sync").is_dir()
    assert cfg["trainer"]["run_dir"] == str(shared / "run") and cfg["model"]["path"] == "ckpt/sft"
    assert cfg["learner"]["zero_stage"] == 3 and cfg["trainer"]["backend"] == "sglang"
    assert "--resume" in learner["cmd"] and learner["cmd"][learner["cmd"].index("--resume") + 1] == "auto"
    opts = _sbatch_options()
    assert "requeue" in opts and opts["signal"].startswith("B:USR1@")


def test_sbatch_fails_fast_with_the_server_log_when_the_servers_die(tmp_path):
    t0 = time.monotonic()
    res, log, _ = dry_run(tmp_path, curl_ok=False, SERVER_FAILS="1")
    assert res.returncode == 1, res.stderr
    assert time.monotonic() - t0 < 60
    assert "the SGLang server step on sgl1 exited (status 1)" in res.stderr
    assert "CUDA out of memory" in res.stderr  # the tail of the server's log
    assert not any(a.endswith("scripts/train_tir.py") for step in map(json.loads, log.read_text().splitlines()) for a in step["cmd"])  # fmt: skip


def test_sbatch_health_wait_is_bounded(tmp_path):
    t0 = time.monotonic()
    res, _, shared = dry_run(tmp_path, curl_ok=False, HEALTH_TIMEOUT_S="2")
    assert res.returncode == 1, res.stderr
    assert time.monotonic() - t0 < 60  # and the still-running server step was killed at exit
    assert "did not answer /health within HEALTH_TIMEOUT_S=2 s" in res.stderr


def test_usr1_stops_the_trainer_after_its_step_then_requeues(tmp_path):
    """Slurm's USR1 before the time limit: the SIGINT reaches the trainer through srun (which
    forwards a single one only with --disable-status), the trainer saves and ends, and the job is
    requeued within seconds."""
    rc, err, events, calls, sent = usr1_run(tmp_path)
    assert rc == 0, err[-3000:]
    assert [e.split()[1] for e in events] == ["started", "SIGINT", "saved"], (events, err[-3000:])
    requeues = [c for c in calls if c.split()[1:] == ["scontrol", "requeue", "1234"]]
    assert len(requeues) == 1, calls
    assert float(requeues[0].split()[0]) - sent < 10  # the step ended in 0.5 s; one poll of 1 s after it
    assert float(requeues[0].split()[0]) >= float(events[-1].split()[0])  # requeued once it had saved


def test_usr1_requeues_within_the_grace_even_if_the_trainer_does_not_stop(tmp_path):
    rc, err, events, calls, sent = usr1_run(tmp_path, TRAINER_HANGS="1", STOP_GRACE_S="2")
    assert rc == 0, err[-3000:]
    assert [e.split()[1] for e in events] == ["started", "SIGINT"], events
    requeues = [c for c in calls if c.split()[1:] == ["scontrol", "requeue", "1234"]]
    assert len(requeues) == 1 and 2 <= float(requeues[0].split()[0]) - sent < 10, calls
    assert "did not stop within STOP_GRACE_S=2 s: requeueing anyway" in err
