"""Attention problem shapes, their FLOP and byte counts, and dtype names."""
from __future__ import annotations

from dataclasses import asdict, dataclass

DTYPE_BYTES = {"fp16": 2, "bf16": 2}
TORCH_DTYPE_NAMES = {"fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Shape:
    B: int
    H: int
    S: int
    D: int
    causal: bool
    graph: bool = False

    @classmethod
    def from_dict(cls, data: dict) -> "Shape":
        return cls(int(data["B"]), int(data["H"]), int(data["S"]), int(data["D"]),
                   bool(data["causal"]), bool(data.get("graph", False)))

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def label(self) -> str:
        return f"B{self.B}_H{self.H}_S{self.S}_D{self.D}_{'causal' if self.causal else 'full'}"

    @property
    def flops(self) -> float:
        """4*B*H*S^2*D (two matmuls), halved under the causal mask."""
        total = 4.0 * self.B * self.H * self.S * self.S * self.D
        return total / 2 if self.causal else total

    def min_bytes(self, dtype: str) -> int:
        """q, k, v read once and o written once: the least any kernel must move."""
        return 4 * self.B * self.H * self.S * self.D * DTYPE_BYTES[dtype]


def torch_dtype(name: str):
    import torch

    return getattr(torch, TORCH_DTYPE_NAMES[name])
