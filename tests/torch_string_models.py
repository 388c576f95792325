"""TorchScript models with TYPE_STRING tensors (``List[str]``), for the pytorch backend's
string tests: the unit ones (tests/unit/backends/test_pytorch_strings.py) and the real
path (tests/integration/serving/test_triton_parity_torch_strings.py)."""

from __future__ import annotations

import torch


class Upper(torch.nn.Module):
    """List[str] -> List[str]: each string upper-cased, with its length in bytes."""

    def forward(self, TEXT__0: list[str]) -> list[str]:
        return [s.upper() + ":" + str(len(s)) for s in TEXT__0]


class Mixed(torch.nn.Module):
    """A string and a numeric input; a string and a numeric output (a tuple)."""

    def forward(self, words: list[str], scale: torch.Tensor) -> tuple[list[str], torch.Tensor]:
        lengths = torch.tensor([len(w) for w in words], dtype=torch.float32)
        return [w + "!" for w in words], lengths * scale


class Label(torch.nn.Module):
    """A numeric input, a string output: each row's argmax as a label."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, list[str]]:
        best = torch.argmax(x, dim=1)
        return best, ["label" + str(int(i)) for i in best]
