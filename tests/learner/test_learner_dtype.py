"""learner.dtype on a CPU: which CPUs have native bf16 (the flags the learner's warning reads)."""

from __future__ import annotations

from stare_tir.learner.config import LearnerConfig, cpu_has_bf16

SAPPHIRE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
COOPER = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n"
SKYLAKE = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512bw\nbugs\t\t: avx512_bf16_like\n"


def test_bf16_instructions_are_read_from_the_flags_line_only():
    assert cpu_has_bf16(SAPPHIRE) and cpu_has_bf16(COOPER)
    assert not cpu_has_bf16(SKYLAKE)  # avx512f alone; a similar word on another line does not count
    assert not cpu_has_bf16("")


def test_auto_is_fp32_on_a_cpu_and_bf16_on_cuda():
    cfg = LearnerConfig(zero_stage=1)
    assert not cfg.bf16(on_cuda=False) and cfg.bf16(on_cuda=True)
    assert LearnerConfig(zero_stage=1, dtype="bf16").bf16(on_cuda=False)
