"""The real SGLang server (CPU build) serving a real pretrained model: SmolLM2-135M-Instruct.

The tiny base is a 2-layer Qwen2; this model is a 30-layer Llama (grouped-query attention, tied
embedding and head, a 49,152-token BPE), so SGLang's real Llama loader runs here: q/k/v fused into
one projection and gate/up into another, the embedding shared with the head. After a push of
changed weights in each sync mode the CPU allows (disk, tensor, distributed over gloo), the
server's greedy tokens on probe prompts are exactly those of HF transformers with the same
weights, and its prefill log-probs agree to float32 kernel noise.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from stare_tir.rollout.backends._http import request_sync
from stare_tir.rollout.backends.base import SamplingParams
from stare_tir.rollout.backends.sglang import SGLangBackend, SGLangConfig

from .conftest import start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("sglang_real"), pytest.mark.timeout(1800)]

NEW_TOKENS = 24
PROBES = ("What is 17*23?", "Name three colours of the rainbow.", "Write a Python line that prints 2**10.")
MODES = ("disk", "tensor", "distributed")


@pytest.fixture(scope="module")
def smol_server(smollm2_path, tmp_path_factory):
    server = start_server(tmp_path_factory.mktemp("sglang_smollm2") / "server.log", model=smollm2_path)
    print(f"\nreal SGLang server on SmolLM2-135M-Instruct ready in {server.start_s:.1f} s at {server.url}")
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def hf_model(smollm2_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(smollm2_path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def probes(smollm2_path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_path))
    out = []
    for text in PROBES:
        s = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        out.append(tok(s, add_special_tokens=False)["input_ids"])
    return out


def _base_state(path) -> dict[str, torch.Tensor]:
    from stare_tir.rollout.backends._weights import iter_checkpoint_tensors

    return dict(iter_checkpoint_tensors(str(path)))


def _changed_state(base: dict[str, torch.Tensor], seed: int) -> dict[str, torch.Tensor]:
    """Every tensor moved by 2% of its own scale (seeded): a change the size of many RL steps,
    visible in greedy decoding, that keeps the model fluent."""
    gen = torch.Generator().manual_seed(seed)
    return {n: t + 0.02 * t.float().std() * torch.randn(t.shape, generator=gen, dtype=t.dtype) for n, t in base.items()}


def _hf_greedy(model, prompts: list[list[int]]) -> list[list[int]]:
    """Greedy continuation by plain HF generate (stops at EOS, as the server does)."""
    out = []
    with torch.no_grad():
        for ids in prompts:
            gen = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)
            out.append(gen[0, len(ids) :].tolist())
    return out


def _server_greedy(url: str, prompts: list[list[int]]) -> list[list[int]]:
    answers = request_sync(
        "POST",
        url + "/generate",
        {"input_ids": prompts, "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW_TOKENS}},
        timeout_s=300,
    )
    return [a["output_ids"] for a in answers]


def _server_scores(url: str, ids: list[int]) -> torch.Tensor:
    out = request_sync(
        "POST",
        url + "/generate",
        {
            "input_ids": ids,
            "return_logprob": True,
            "logprob_start_len": 0,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 1},
        },
        timeout_s=300,
    )
    return torch.tensor([p[0] for p in out["meta_info"]["input_token_logprobs"][1:]])


def _hf_scores(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def _load(model, state: dict[str, torch.Tensor]) -> None:
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # the head is tied


def test_server_serves_the_real_model_as_hf_does(smol_server, hf_model, probes):
    """Before any push: the server loaded the converted directory through SGLang's Llama loader
    and decodes what HF decodes (the base model answers the probes in words, not in ids 0)."""
    got = _server_greedy(smol_server.url, probes)
    assert got == _hf_greedy(hf_model, probes)
    assert all(len(g) > 3 for g in got)


def test_every_sync_mode_pushes_weights_the_server_then_decodes_with(
    smol_server, smollm2_path, hf_model, probes, tmp_path
):
    """disk, tensor and distributed (gloo) in turn, each with other changed weights: after each
    push the server's greedy tokens on every probe equal HF's with the same weights, and differ
    from the previous weights' on at least one probe (the push arrived). Base weights go back."""
    url = smol_server.url
    base = _base_state(smollm2_path)
    scored = probes[0] + _hf_greedy(hf_model, probes[:1])[0]
    previous = _server_greedy(url, probes)
    try:
        for seed, mode in enumerate(MODES, start=1):
            state = _changed_state(base, seed)
            cfg = SGLangConfig(weight_sync=mode, dist_backend="gloo", sync_dir=str(tmp_path / "sync"), bucket_mb=16)
            be = SGLangBackend([url], cfg)
            try:
                be.update_weights(state.items())
            finally:
                be.close()
            _load(hf_model, state)
            want = _hf_greedy(hf_model, probes)
            got = _server_greedy(url, probes)
            assert got == want, f"{mode}: server and HF disagree after the push"
            assert got != previous, f"{mode}: the greedy tokens did not change: the push did not arrive"
            diff = (_server_scores(url, scored) - _hf_scores(hf_model, scored)).abs().max()
            assert diff < 2e-3, f"{mode}: prefill log-probs differ by {float(diff)}"
            previous = got
    finally:
        back = SGLangBackend([url], SGLangConfig(weight_sync="tensor"))
        back.update_weights(base.items())
        back.close()
        _load(hf_model, base)
    assert _server_greedy(url, probes) == _hf_greedy(hf_model, probes), "base weights not restored"


def test_the_backend_generates_through_the_real_template(smol_server, smollm2_path, probes):
    """The project's SGLang backend on this model: token in/token out with the ChatML EOS
    (<|im_end|>) ending a greedy answer, and the text decoding to what the ids say."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smollm2_path))
    be = SGLangBackend([smol_server.url], tokenizer=tok)
    g = asyncio.run(be.generate(probes[1], SamplingParams(temperature=0.0, max_new_tokens=64), []))
    assert len(g.token_ids) == len(g.logprobs) > 0
    assert g.finish_reason in ("eos", "length")
    if g.finish_reason == "eos":
        assert g.token_ids[-1] == tok.convert_tokens_to_ids("<|im_end|>")
