"""The tiny token dataset every HF runtime test and script trains on (fixed seed, no download)."""

from __future__ import annotations

import torch

SEQ = 8
VOCAB = 64


class TokenDataset(torch.utils.data.Dataset):
    def __init__(self, n: int = 64) -> None:
        g = torch.Generator().manual_seed(1)
        self.ids = torch.randint(0, VOCAB, (n, SEQ), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}
