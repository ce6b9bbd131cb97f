"""SFT masks interpreter output whatever its newline layout, and refuses to train on a stray tag."""

from __future__ import annotations

import pytest

BEFORE = "Let me compute.\n<code>\n```python\nprint(6 * 7)\n```\n</code>"
AFTER = "So the answer is \\boxed{42}."
# The env's own layout first, then variations seen in traces written by other tools.
LAYOUTS = {
    "env": "\n<interpreter>\n4242\n</interpreter>\n",
    "crlf": "\r\n<interpreter>\r\n4242\r\n</interpreter>\r\n",
    "no_newlines": "<interpreter>4242</interpreter>",
    "blank_lines": "\n\n<interpreter>\n4242\n</interpreter>\n",
    "trailing_spaces": "\n<interpreter>\n4242  \n</interpreter>   \n",
    "inner_only": "\n<interpreter>4242</interpreter>\n",
}


@pytest.fixture(scope="module")
def tokenizer():
    from stare_tir.model import build_qwen_tokenizer

    return build_qwen_tokenizer()  # the real Qwen2.5 BPE: real token boundaries


def _record(assistant: str) -> dict:
    return {"messages": [{"role": "user", "content": "What is 6 * 7?"}, {"role": "assistant", "content": assistant}]}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_interpreter_output_is_masked_in_every_layout(tokenizer, layout):
    from stare_tir.sft.train import encode_record

    ex = encode_record(_record(BEFORE + LAYOUTS[layout] + AFTER), tokenizer)
    trained = tokenizer.decode([t for t, m in zip(ex.response_ids, ex.loss_mask) if m == 1])
    masked = tokenizer.decode([t for t, m in zip(ex.response_ids, ex.loss_mask) if m == 0])
    assert "interpreter" not in trained and "4242" not in trained
    assert "<interpreter>" in masked and "4242" in masked
    assert BEFORE in trained and AFTER in trained


@pytest.mark.parametrize(
    "assistant",
    [
        BEFORE + "\n<interpreter>\n4242\n" + AFTER,  # never closed
        "I will write <interpreter>4242</interpreter> myself. " + AFTER,  # not after a code block
        BEFORE + LAYOUTS["env"] + "stray </interpreter> " + AFTER,
    ],
)
def test_interpreter_text_that_would_be_trained_is_an_error(tokenizer, assistant):
    from stare_tir.sft.train import encode_record

    with pytest.raises(ValueError, match="interpreter output would be trained"):
        encode_record(_record(assistant), tokenizer)


def test_run_sft_names_the_bad_row(tmp_path):
    import json

    from stare_tir.model import pretrained_tiny_base
    from stare_tir.sft.train import SFTConfig, run_sft

    data = tmp_path / "traces.jsonl"
    good = _record(BEFORE + LAYOUTS["env"] + AFTER)
    bad = _record(BEFORE + "\n<interpreter>\n4242\n" + AFTER)
    data.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(ValueError, match=r"SFT row 2 of .*traces.jsonl: unmatched <interpreter>"):
        run_sft(SFTConfig(), str(pretrained_tiny_base()), data, tmp_path / "out")
