"""The SFT stage's outputs are reused only when made from the same inputs (a hash of base model,
tokenizer, traces and SFT settings): from this run, or from a sibling run directory; a named
sft.output made from other inputs is refused, naming what changed. No training here: each case
ends before (or instead of) SFT."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stare_tir.app.preflight import StartupError
from stare_tir.config import resolve_config
from stare_tir.model import ModelConfig, model_fingerprint, resolve_model_path
from stare_tir.sft import stage as cold_start
from stare_tir.sft.stage import KEY_FILE, digest, sft_inputs, sft_stage
from stare_tir.train_config import TrainConfig


def cfg_for(run_dir: Path, *overrides: str) -> TrainConfig:
    return resolve_config(TrainConfig, {}, [f"trainer.run_dir={run_dir}", "sft.num_traces=8", *overrides])


def stored_model(path: Path, cfg: TrainConfig, base: str) -> Path:
    """An SFT output as sft_stage leaves it: an HF directory plus its key file."""
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    inputs = sft_inputs(cfg, base)
    (path / KEY_FILE).write_text(json.dumps({"key": digest(inputs), "inputs": inputs}))
    return path


@pytest.fixture
def no_training(monkeypatch):
    """Any attempt to make traces or train fails the test loudly."""

    def refuse(*args, **kwargs):
        raise AssertionError("SFT ran although a model made from the same inputs exists")

    monkeypatch.setattr(cold_start, "make_synthetic_traces", refuse)
    monkeypatch.setattr("stare_tir.sft.train.run_sft", refuse)


def test_a_sibling_runs_sft_model_from_the_same_inputs_is_reused_and_linked(tmp_path, no_training):
    base = resolve_model_path(ModelConfig(path="tiny"))
    first = tmp_path / "runs" / "first"
    stored_model(first / "sft" / "model", cfg_for(first), base)
    second = tmp_path / "runs" / "second"
    path, summary = sft_stage(cfg_for(second), base, second)
    assert path == str(first / "sft" / "model") and summary["reused"] and summary["from"] == path
    own = second / "sft" / "model"
    assert (own / "config.json").is_file() and (own / KEY_FILE).is_file()  # this run keeps its inputs
    assert (own / "config.json").stat().st_ino == (first / "sft" / "model" / "config.json").stat().st_ino
    # Resuming the second run later finds its own copy.
    assert sft_stage(cfg_for(second), base, second)[0] == str(own)


def test_other_inputs_are_never_reused(tmp_path, monkeypatch):
    base = resolve_model_path(ModelConfig(path="tiny"))
    first = tmp_path / "runs" / "first"
    stored_model(first / "sft" / "model", cfg_for(first), base)
    made = []
    monkeypatch.setattr(cold_start, "sft_traces", lambda cfg, run_dir: made.append(cfg.sft.train.epochs) or [])
    monkeypatch.setattr(cold_start, "load_tokenizer", lambda model, path: None)

    def fake_sft(cfg, base_model, data, out, **kwargs):
        Path(out).mkdir(parents=True)
        return {"steps": 1}

    monkeypatch.setattr("stare_tir.sft.train.run_sft", fake_sft)
    second = tmp_path / "runs" / "second"
    _, summary = sft_stage(cfg_for(second, "sft.train.epochs=1"), base, second)
    assert made == [1] and not summary.get("reused")  # trained anew, with its own key
    assert json.loads((second / "sft" / "model" / KEY_FILE).read_text())["key"] == summary["key"]


def test_a_named_sft_output_made_from_other_traces_is_refused(tmp_path, no_training):
    base = resolve_model_path(ModelConfig(path="tiny"))
    traces = tmp_path / "traces.jsonl"
    traces.write_text('{"text": "a"}\n')
    out = tmp_path / "ckpt" / "sft"
    cfg = cfg_for(tmp_path / "run", f"sft.traces={traces}", f"sft.output={out}")
    stored_model(out, cfg, base)
    assert sft_stage(cfg, base, tmp_path / "run")[1]["reused"]  # same traces: reused
    traces.write_text('{"text": "b"}\n')  # new traces, same file name
    with pytest.raises(StartupError, match=r"sft.output=.* made from other inputs \(changed: traces.sha256\)"):
        sft_stage(cfg, base, tmp_path / "run")
    (out / KEY_FILE).unlink()  # made by hand or by an older version: nothing says what it is
    with pytest.raises(StartupError, match=r"no record of its inputs"):
        sft_stage(cfg, base, tmp_path / "run")


def test_a_model_fingerprint_changes_with_its_weights(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"a" * 1000)
    first = model_fingerprint(str(model))
    (model / KEY_FILE).write_text("{}")  # bookkeeping does not change what the model is
    assert model_fingerprint(str(model)) == first
    (model / "model.safetensors").write_bytes(b"b" * 1000)  # retrained at the same path
    assert model_fingerprint(str(model)) != first
    assert model_fingerprint("Qwen/Qwen2.5-7B") == "hub:Qwen/Qwen2.5-7B"


def test_parquet_traces_load_like_jsonl(tmp_path):
    """ReTool-SFT ships as train_2000.parquet with a `messages` column: usable as sft.traces as is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from stare_tir.sft.train import load_records

    rows = [{"messages": [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "\\boxed{2}"}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    (tmp_path / "train.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert load_records(tmp_path / "train.parquet") == load_records(tmp_path / "train.jsonl") == rows


def test_sibling_reuse_can_be_turned_off(tmp_path, monkeypatch):
    base = resolve_model_path(ModelConfig(path="tiny"))
    first = tmp_path / "runs" / "first"
    stored_model(first / "sft" / "model", cfg_for(first), base)
    trained = []
    monkeypatch.setattr(cold_start, "sft_traces", lambda cfg, run_dir: [])
    monkeypatch.setattr(cold_start, "load_tokenizer", lambda model, path: None)

    def fake_sft(cfg, base_model, data, out, **kwargs):
        trained.append(out)
        Path(out).mkdir(parents=True)
        return {}

    monkeypatch.setattr("stare_tir.sft.train.run_sft", fake_sft)
    second = tmp_path / "runs" / "second"
    sft_stage(cfg_for(second, "sft.reuse=false"), base, second)
    assert trained == [second / "sft" / "model"]


def test_code_styles_enter_the_traces_key_only_when_set(tmp_path):
    from stare_tir.config import load_config
    from stare_tir.sft.stage import traces_inputs

    tiny = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"
    default = load_config(TrainConfig, tiny, [])
    # The key of configs/tiny_cpu.yaml's traces as it was before sft.code_styles existed: existing
    # runs keep reusing their traces and SFT models.
    assert digest(traces_inputs(default)) == "245c67b40b573948"
    assert "code_styles" not in traces_inputs(default)
    mixed = load_config(TrainConfig, tiny, ["sft.code_styles=[print,assign]"])
    assert traces_inputs(mixed)["code_styles"] == ["print", "assign"]
    assert digest(sft_inputs(mixed, "tiny")) != digest(sft_inputs(default, "tiny"))
