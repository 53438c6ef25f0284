"""A learnable synthetic task, the same tokens in every layout.

Every sequence walks one fixed random cycle through ``cycle_len`` tokens of the vocabulary from a
random start (token t+1 = the cycle's successor of token t): a model that learns the cycle's
bigram table predicts every token after the first, and since every step shows the same few
hundred bigrams, a few optimizer steps lower the loss. That shows the timed steps train. Step s's
global batch comes from a generator seeded by (seed, s) on the CPU, identical on every rank; each
rank then takes its dp rows (and, with context parallel, its sequence shards)."""

from __future__ import annotations

import torch


class SyntheticTask:
    def __init__(self, *, vocab_size: int, seq_len: int, global_batch: int, seed: int) -> None:
        self.seq_len, self.global_batch, self.seed = seq_len, global_batch, seed
        cycle_len = max(2, min(vocab_size // 4, 256))
        self.cycle = torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))[:cycle_len]

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of step ``step``, each [global_batch, seq_len] int64 on the CPU."""
        gen = torch.Generator().manual_seed(self.seed * 7919 + step + 1)
        start = torch.randint(0, len(self.cycle), (self.global_batch, 1), generator=gen)
        seq = self.cycle[(start + torch.arange(self.seq_len + 1)) % len(self.cycle)]
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
