"""Chunked log-probabilities and entropy: equal to the naive full-logits computation (values
and gradients), temperature-aware, and never saving [N, V] tensors for backward; CPU only."""

import math

import pytest
import torch

from stare_tir.algos.logprobs import logprobs_and_entropy, logprobs_and_entropy_from_logits


def _naive(logits, targets, temperature):
    logq = torch.log_softmax(logits.float() / temperature, dim=-1)
    lp = logq.gather(-1, targets[..., None]).squeeze(-1)
    ent = -(logq.exp() * logq).sum(-1)
    return lp, ent


def _inputs(n=37, h=16, v=101, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g, dtype=dtype) / 2).requires_grad_()
    bias = torch.randn(v, generator=g, dtype=dtype).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, bias, targets


def test_hand_computed_two_token_vocab():
    logits = torch.tensor([[0.0, math.log(3.0)]])
    lp, ent = logprobs_and_entropy_from_logits(logits, torch.tensor([1]))
    assert lp.item() == pytest.approx(math.log(0.75))
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))
    # temperature 2: logits / 2 -> p1 = sqrt(3) / (1 + sqrt(3))
    lp, ent = logprobs_and_entropy_from_logits(logits, torch.tensor([0]), temperature=2.0)
    p0 = 1 / (1 + math.sqrt(3))
    assert lp.item() == pytest.approx(math.log(p0))
    assert ent.item() == pytest.approx(-(p0 * math.log(p0) + (1 - p0) * math.log(1 - p0)))
    # same through the hidden-state path: hidden [1, 1] @ W^T with W = [[0], [ln 3]]
    lp2, ent2 = logprobs_and_entropy(
        torch.ones(1, 1), torch.tensor([[0.0], [math.log(3.0)]]), torch.tensor([0]), temperature=2.0
    )
    assert lp2.item() == pytest.approx(math.log(p0))
    assert ent2.item() == pytest.approx(ent.item())


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
@pytest.mark.parametrize("chunk_size", [1, 8, 1000])
def test_hidden_path_equals_naive_with_gradients(temperature, chunk_size):
    hidden, weight, bias, targets = _inputs()
    g_out = torch.randn(targets.shape, generator=torch.Generator().manual_seed(1))
    lp, ent = logprobs_and_entropy(
        hidden, weight, targets, temperature=temperature, chunk_size=chunk_size, lm_head_bias=bias
    )
    grads = torch.autograd.grad((lp * g_out).sum(), [hidden, weight, bias])
    lp0, ent0 = _naive(hidden @ weight.t() + bias, targets, temperature)
    grads0 = torch.autograd.grad((lp0 * g_out).sum(), [hidden, weight, bias])
    torch.testing.assert_close(lp, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent0, atol=1e-5, rtol=0)
    for a, b in zip(grads, grads0):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)
    assert not ent.requires_grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logits_path_equals_naive_with_gradients(temperature):
    g = torch.Generator().manual_seed(2)
    logits = (torch.randn(3, 9, 211, generator=g) * 3).requires_grad_()  # [B, T, V]
    targets = torch.randint(0, 211, (3, 9), generator=g)
    before = logits.detach().clone()
    lp, ent = logprobs_and_entropy_from_logits(logits, targets, temperature, 4)
    assert lp.shape == (3, 9) and ent.shape == (3, 9)
    g_out = torch.randn(3, 9, generator=g)
    (grad,) = torch.autograd.grad((lp * g_out).sum(), logits)
    lp0, ent0 = _naive(logits, targets, temperature)
    (grad0,) = torch.autograd.grad((lp0 * g_out).sum(), logits)
    torch.testing.assert_close(lp, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent0, atol=1e-5, rtol=0)
    torch.testing.assert_close(grad, grad0, atol=1e-5, rtol=0)
    assert torch.equal(logits.detach(), before)  # the caller's float32 logits are untouched


def test_gradcheck_float64():
    hidden, weight, bias, targets = _inputs(n=5, h=3, v=7, dtype=torch.float64)

    def f(h, w, b):
        return logprobs_and_entropy(h, w, targets, temperature=0.8, chunk_size=2, lm_head_bias=b)[0]

    assert torch.autograd.gradcheck(f, (hidden, weight, bias))
    logits = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    t = torch.tensor([0, 5, 2, 2])
    assert torch.autograd.gradcheck(lambda z: logprobs_and_entropy_from_logits(z, t, 1.3, 3)[0], (logits,))


def test_bfloat16_inputs_close_to_float32():
    hidden, weight, _, targets = _inputs(n=20, h=32, v=300)
    hb = hidden.detach().bfloat16().requires_grad_()
    wb = weight.detach().bfloat16().requires_grad_()
    lp, ent = logprobs_and_entropy(hb, wb, targets, chunk_size=7)
    assert lp.dtype == torch.float32
    lp.sum().backward()
    assert hb.grad.dtype == torch.bfloat16 and wb.grad.dtype == torch.bfloat16
    lp0, ent0 = _naive((hb @ wb.t()).detach(), targets, 1.0)  # same bf16 matmul, float32 softmax
    torch.testing.assert_close(lp, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent0, atol=1e-5, rtol=0)
    lp3, _ = logprobs_and_entropy_from_logits((hb @ wb.t()).detach(), targets, 1.0, 6)
    torch.testing.assert_close(lp3, lp0, atol=1e-5, rtol=0)


def test_no_entropy_and_argument_checks():
    hidden, weight, _, targets = _inputs()
    lp, ent = logprobs_and_entropy(hidden, weight, targets, with_entropy=False)
    assert ent is None and lp.shape == targets.shape
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_and_entropy(hidden, weight, targets, chunk_size=0)
    with pytest.raises(ValueError, match="temperature"):
        logprobs_and_entropy_from_logits(hidden @ weight.t(), targets, temperature=0.0)


def _largest_saved(fn):
    """Largest tensor (numel) autograd keeps for backward while running fn."""
    sizes = []

    def pack(t):
        sizes.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return max(sizes)


def test_never_saves_full_logits_for_backward():
    n, v = 64, 500
    hidden, weight, _, targets = _inputs(n=n, h=8, v=v)
    chunked = _largest_saved(lambda: logprobs_and_entropy(hidden, weight, targets, chunk_size=16))
    naive = _largest_saved(lambda: _naive(hidden @ weight.t(), targets, 1.0))
    assert naive >= n * v  # the probe sees [N, V] buffers when they exist
    assert chunked == weight.numel()  # hidden, weight, targets, per-token lse only
