"""The weight-format constants SGLang's quantization modules read from `sgl_kernel.scalar_type`.

Only names and bit layouts (enough for the module-level tables those imports build and for
supported-type checks); the real module also encodes them for its compiled kernels, which this
stand-in does not have. Each constant is described by its bit layout: `uint4b8` is a 4-bit
unsigned integer stored with a bias of 8 (GPTQ), `float4_e2m1f` a 4-bit float with 2 exponent
bits and 1 mantissa bit (MXFP4/NVFP4), and so on.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace


@dataclass(frozen=True)
class ScalarType:
    name: str
    exponent: int  # exponent bits (0 for integers)
    mantissa: int  # mantissa bits (value bits for integers)
    signed: bool
    bias: int = 0

    @property
    def size_bits(self) -> int:
        return self.exponent + self.mantissa + int(self.signed)

    def is_floating_point(self) -> bool:
        return self.exponent != 0

    def is_integer(self) -> bool:
        return self.exponent == 0

    def has_bias(self) -> bool:
        return self.bias != 0

    def __str__(self) -> str:
        return self.name


def _int(name: str, bits: int, bias: int = 0) -> ScalarType:
    return ScalarType(name, 0, bits, False, bias)


scalar_types = SimpleNamespace(
    uint4=_int("uint4", 4),
    uint8=_int("uint8", 8),
    uint4b8=_int("uint4b8", 4, bias=8),
    uint8b128=_int("uint8b128", 8, bias=128),
    float4_e2m1f=ScalarType("float4_e2m1f", 2, 1, True),
    float8_e4m3fn=ScalarType("float8_e4m3fn", 4, 3, True),
)
