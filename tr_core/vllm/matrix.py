"""The adjacency matrix inside vLLM (the paper's M, shared by all requests as in its "hot start"), on vLLM's device:
every logits row of a forward overwrites its input token's row with its top-k, one top-k and one scatter a batch."""
from __future__ import annotations

import torch

from .chains import EMPTY

K = 8  # candidates per row, as in the paper


class SharedMatrix:
    """ids [V, K] int32 (EMPTY where never written) and probs [V, K] float16, on `device`."""

    def __init__(self, vocab: int, device: torch.device, k: int = K) -> None:
        self.ids = torch.full((vocab, k), EMPTY, dtype=torch.int32, device=device)
        self.probs = torch.zeros((vocab, k), dtype=torch.float16, device=device)
        self.updates = 0  # rows written so far (for logs and tests)

    def update(self, inputs: torch.Tensor, logits: torch.Tensor) -> None:
        """Write row inputs[r] from logits[r] for every r; inputs [R], logits [R, V'] raw scores."""
        keep = (inputs >= 0) & (inputs < self.ids.shape[0])
        inputs, logits = inputs[keep].long(), logits[keep].float()
        if inputs.numel() == 0:
            return
        top, ids = logits.topk(self.ids.shape[1], dim=-1)  # [R, K]
        probs = (top - logits.logsumexp(dim=-1, keepdim=True)).exp()
        self.ids[inputs] = ids.to(torch.int32)
        self.probs[inputs] = probs.to(torch.float16)
        self.updates += int(inputs.numel())

    def written(self) -> int:
        """How many rows hold candidates."""
        return int((self.ids[:, 0] != EMPTY).sum())
