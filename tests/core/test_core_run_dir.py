"""A run directory belongs to one run: a second run into it is refused, `--resume` continues what
is there with its own config, `--overwrite` replaces it only once the new run's checks passed,
and a failed start writes nothing. Fast: the refusals come before anything heavy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from stare_tir.app.cli import train_main
from stare_tir.app.preflight import StartupError
from stare_tir.app.run_dir import clear_run_dir, resume_config
from stare_tir.config import resolve_config, to_dict
from stare_tir.train_config import TrainConfig

SAVED = ["trainer.steps=3", "rollout.max_total_tokens=64", "sft.num_traces=96", "algo.stare.target_entropy=100"]


def used_run_dir(root: Path, checkpoint: bool = True) -> Path:
    """A run directory as an earlier run left it (config.yaml, metrics, a checkpoint)."""
    run = root / "run"
    cfg = resolve_config(TrainConfig, {}, [f"trainer.run_dir={run}", *SAVED])
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    if checkpoint:
        (run / "checkpoints" / "step_000002").mkdir(parents=True)
        (run / "checkpoints" / "latest").write_text("step_000002")
    return run


def snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def test_a_second_run_into_a_used_directory_is_refused(tmp_path, capsys):
    run = used_run_dir(tmp_path)
    before = snapshot(run)
    assert train_main([f"trainer.run_dir={run}", "trainer.steps=50"]) == 2
    err = capsys.readouterr().err
    assert f"trainer.run_dir='{run}' already holds a run (config.yaml, metrics.jsonl, checkpoints)" in err
    assert "--resume" in err and "--overwrite" in err and "Traceback" not in err
    assert snapshot(run) == before  # nothing appended, nothing replaced


def test_resume_restores_the_runs_own_config(tmp_path, capsys):
    run = used_run_dir(tmp_path)
    assert train_main(["--resume", f"trainer.run_dir={run}", "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed == yaml.safe_load((run / "config.yaml").read_text())  # not the defaults
    assert printed["trainer"]["steps"] == 3 and printed["rollout"]["max_total_tokens"] == 64


def test_resume_shows_changed_settings_and_needs_them_accepted(tmp_path, capsys):
    run = used_run_dir(tmp_path)
    assert train_main(["--resume", f"trainer.run_dir={run}", "trainer.steps=5", "learner.lr=0.5"]) == 2
    err = capsys.readouterr().err
    assert "these settings differ from" in err and "learner.lr: 1e-06 -> 0.5" in err
    assert "trainer.steps: 3 -> 5" in err and "--accept-changes" in err
    assert (
        train_main(["--resume", f"trainer.run_dir={run}", "trainer.steps=5", "--accept-changes", "--print-config"]) == 0
    )
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["steps"] == 5
    # An interactive "y" accepts them too; anything else refuses.
    saved = TrainConfig
    assert resume_config(saved, run, ["trainer.steps=5"], confirm=lambda changes: True).trainer.steps == 5
    with pytest.raises(StartupError, match="trainer.steps: 3 -> 5"):
        resume_config(saved, run, ["trainer.steps=5"], confirm=lambda changes: False)
    # A config file given with --resume is compared with the run too.
    other = tmp_path / "other.yaml"
    other.write_text("trainer:\n  steps: 7\n")
    assert train_main(["--resume", "--config", str(other), f"trainer.run_dir={run}"]) == 2
    assert "trainer.steps: 3 -> 7" in capsys.readouterr().err


@pytest.mark.parametrize(
    "setup,message",
    [
        ("missing", "holds no config.yaml, so no run to resume (check the directory name"),
        ("no_checkpoint", "holds no checkpoint yet"),
    ],
)
def test_resume_without_a_run_or_a_checkpoint_is_an_error(tmp_path, capsys, setup, message):
    run = tmp_path / "typo" if setup == "missing" else used_run_dir(tmp_path, checkpoint=False)
    assert train_main(["--resume", f"trainer.run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert setup != "missing" or not run.exists()  # nothing started there


def test_a_failed_start_writes_no_config_and_overwrite_waits_for_the_checks(tmp_path, capsys):
    fresh = tmp_path / "fresh"
    assert train_main([f"trainer.run_dir={fresh}", "model.path=./no/such/model"]) == 2
    assert not (fresh / "config.yaml").exists()
    run = used_run_dir(tmp_path)
    before = snapshot(run)
    assert train_main(["--overwrite", f"trainer.run_dir={run}", "model.path=./no/such/model"]) == 2
    assert train_main(["--resume", "--accept-changes", f"trainer.run_dir={run}", "model.path=./no/such/model"]) == 2
    assert snapshot(run) == before  # the old run is intact: config.yaml included
    assert "no such directory" in capsys.readouterr().err
    assert train_main(["--resume", "--overwrite", f"trainer.run_dir={run}"]) == 2
    assert "contradict" in capsys.readouterr().err


def test_overwrite_clears_the_old_runs_outputs_but_keeps_its_keyed_sft(tmp_path):
    run = used_run_dir(tmp_path)
    for name in ("final", "plots", "hf/step_000001", "sft/model"):
        (run / name).mkdir(parents=True, exist_ok=True)
    for name in ("summary.json", "train.log", "train.rank1.log", "train.rank3.log", "wandb_run_id", "notes.txt"):
        (run / name).write_text("x")
    gone = clear_run_dir(run, world_size=2)
    left = sorted(p.name for p in run.iterdir())
    assert left == ["notes.txt", "sft", "train.rank1.log"], left  # rank 1 truncates its own log
    assert "train.rank3.log" in gone and "checkpoints" in gone and "config.yaml" in gone


def test_requested_tracker_not_installed_fails_at_start(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)
    assert train_main([f"trainer.run_dir={tmp_path / 'run'}", "trainer.wandb_project=proj"]) == 2
    err = capsys.readouterr().err
    assert "pip install 'stare-tir[tracking]'" in err and not (tmp_path / "run" / "config.yaml").exists()


def test_only_rank_0_checks_the_directory(tmp_path, monkeypatch):
    """Under torchrun rank 0 writes config.yaml a moment before another rank starts: that rank must
    not take rank 0's fresh files for an old run."""
    from stare_tir.app import pipeline

    run = used_run_dir(tmp_path)
    calls = []

    def preflight(cfg, problems=None):  # the checks themselves are not under test: only what reaches them
        calls.append("preflight")
        if problems:
            raise StartupError("\n".join(problems))

    monkeypatch.setattr(pipeline, "preflight", preflight)
    monkeypatch.setattr(pipeline, "setup_run_logging", lambda run_dir, fresh: calls.append(("log", fresh)))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    cfg = resolve_config(TrainConfig, {}, [f"trainer.run_dir={run}"])
    pipeline.start_run(cfg)
    assert calls == ["preflight", ("log", True)]
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(StartupError, match="already holds a run"):
        pipeline.start_run(cfg)
    assert os.environ["RANK"] == "0"


def test_a_full_disk_is_one_line_at_start_and_leaves_nothing(tmp_path, capsys, monkeypatch):
    """The file system refuses the run directory's write (ENOSPC, as a full disk does at the
    sync): rc 2 with one line naming the directory and its free space; nothing is left there."""
    import errno

    from stare_tir.app import run_dir as run_dir_mod

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(run_dir_mod.os, "fsync", full)
    (tmp_path / "runs").mkdir()
    assert train_main([f"trainer.run_dir={tmp_path / 'runs' / 'a'}"]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "cannot be written" in line]
    assert len(lines) == 1 and "No space left on device" in lines[0] and "free in" in lines[0], err
    assert "Traceback" not in err
    assert list((tmp_path / "runs").iterdir()) == []  # no run directory, no probe, no temporary config


def test_the_run_directorys_free_space_is_logged_at_start(tmp_path, capfd):
    from stare_tir.app.run_dir import check_run_dir

    check_run_dir(tmp_path / "run", resume=False, overwrite=False)
    assert f"run directory {tmp_path / 'run'}: " in capfd.readouterr().err and list(tmp_path.iterdir()) == []


def test_a_full_file_system_through_the_command(tmp_path):
    """The user's case for real: a full tmpfs (mounted in a user namespace of its own) under the
    run directory. Without the check: a traceback (rc 1) at config.yaml and a zero-byte temporary
    file per attempt. Skipped where user namespaces cannot mount."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"]).returncode != 0:
        pytest.skip("no user namespaces here to mount a small tmpfs in")
    root = Path(__file__).resolve().parents[2]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (
        'mount -t tmpfs -o size=256k tmpfs "$MNT" || exit 97; '
        'head -c 1048576 /dev/zero >"$MNT/fill" 2>/dev/null; '
        '"$PY" "$ROOT/scripts/train_tir.py" trainer.run_dir="$MNT/run" sandbox.backend=local; rc=$?; '
        'echo "LEFT: $(ls -A "$MNT" | grep -v "^fill$" | tr "\\n" " ")"; exit $rc'
    )
    env = {**os.environ, "MNT": str(mnt), "PY": sys.executable, "ROOT": str(root)}
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path
    )
    if proc.returncode == 97:
        pytest.skip("this kernel refuses tmpfs in a user namespace")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert any(f"trainer.run_dir='{mnt / 'run'}' cannot be written (No space left on device" in e for e in errors)
    assert "Traceback" not in proc.stderr
    assert proc.stdout.strip().splitlines()[-1].strip() == "LEFT:", proc.stdout  # nothing but the filler
