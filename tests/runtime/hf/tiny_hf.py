"""The tiny token dataset and GPT-2 the HF runtime tests and scripts train (fixed seeds, built from
a config: no download)."""

from __future__ import annotations

import torch
from transformers import GPT2Config, GPT2LMHeadModel

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


def tiny_gpt2() -> GPT2LMHeadModel:
    """Seeded, dropout off: two runs from the same state take bitwise-equal steps."""
    torch.manual_seed(0)
    cfg = GPT2Config(
        vocab_size=VOCAB,
        n_positions=SEQ,
        n_embd=16,
        n_layer=1,
        n_head=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    return GPT2LMHeadModel(cfg)
