"""Where a command's logs go: `stare-sft` logs into its output directory (not beside it, where
it mixed with whatever else lives there), W&B writes its files into the run directory (not the
directory the command was started from)."""

from __future__ import annotations

import sys
from types import SimpleNamespace


def test_stare_sft_logs_inside_its_output_directory(tmp_path, monkeypatch):
    import stare_tir.sft.stage as stage
    from stare_tir.app.cli import sft_main

    def reused(cfg, base_model, run_dir, overwrite=False):  # the SFT itself is not under test
        from loguru import logger

        logger.info("sft: reusing it")
        return str(tmp_path / "ckpt" / "sft"), {"reused": True, "from": "x", "key": "k"}

    monkeypatch.setattr(stage, "sft_stage", reused)
    monkeypatch.setattr(stage, "check_sft_traces", lambda cfg: None)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "ckpt" / "sft"
    assert sft_main(["model.path=tiny", f"sft.output={out}", "sft.traces=traces.jsonl"]) == 0
    assert "sft: reusing it" in (out / "train.log").read_text()
    assert not (tmp_path / "ckpt" / "train.log").exists()


def test_wandb_writes_into_the_run_directory(tmp_path, monkeypatch):
    from stare_tir.tracking import MetricsLog

    calls = []
    fake = SimpleNamespace(init=lambda **kw: calls.append(kw) or SimpleNamespace(log=lambda *a, **k: None))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    MetricsLog(tmp_path / "run", wandb_project="p", run_name="r", wandb_id="x")
    assert calls[0]["dir"] == str(tmp_path / "run")


def test_an_overwritten_sft_output_keeps_its_open_log(tmp_path, monkeypatch):
    """`stare-sft --overwrite` over a model made from other inputs: the old model goes, the log
    the command is writing into that directory stays (deleting it would lose the whole SFT's log)."""
    import json

    import stare_tir.sft.stage as stage
    import stare_tir.sft.train as train
    from stare_tir.config import resolve_config
    from stare_tir.train_config import TrainConfig

    out = tmp_path / "sft"
    (out / "old_shards").mkdir(parents=True)
    (out / "config.json").write_text("{}")
    (out / stage.KEY_FILE).write_text(json.dumps({"key": "other", "inputs": {}}))
    (out / "train.log").write_text("the log so far\n")
    monkeypatch.setattr(stage, "check_sft_traces", lambda cfg: None)
    monkeypatch.setattr(stage, "sft_traces", lambda cfg, run_dir: [])
    monkeypatch.setattr(stage, "load_tokenizer", lambda *a: None)
    monkeypatch.setattr(train, "run_sft", lambda *a, **kw: {"steps": 0})
    (tmp_path / "t.jsonl").write_text("")
    cfg = resolve_config(
        TrainConfig, {}, ["model.path=tiny", f"sft.output={out}", f"sft.traces={tmp_path / 't.jsonl'}"]
    )
    stage.sft_stage(cfg, "tiny", tmp_path / "run", overwrite=True)
    assert sorted(p.name for p in out.iterdir()) == [stage.KEY_FILE, "train.log"]
    assert (out / "train.log").read_text() == "the log so far\n"
