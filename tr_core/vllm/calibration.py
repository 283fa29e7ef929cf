"""Calibrated acceptance, learned from every verified step: per kind of drafted token (a matrix candidate's probability
band, or a context token's match length and whether the row lists it), rate = (accepted + prior) / (tried + prior
weight); tokens past the first rejection were never tried. `chains.draft_chains` multiplies rates along a chain."""
from __future__ import annotations

import torch

BANDS = 5  # bands of a matrix candidate's stored probability: [0, .2), [.2, .4), ... [.8, 1]
MATCHES = 4  # context kinds by matched suffix length 1..4
KINDS = BANDS + 2 * MATCHES
PRIOR_WEIGHT = 8.0  # pseudo-tries behind the prior rates (a few steps of evidence outweigh them)
MEMORY = 4096.0  # a kind's evidence is halved past this many tries, so rates follow a changing workload


def prior_rates() -> torch.Tensor:
    """[KINDS] rates before any evidence: a band's midpoint; context 0.3 (1-token match) to 0.6, +0.2 if agreed."""
    bands = (torch.arange(BANDS, dtype=torch.float32) + 0.5) / BANDS
    matches = torch.tensor([0.3, 0.45, 0.55, 0.6])
    context = torch.stack([matches, (matches + 0.2).clamp(max=0.9)], dim=1).reshape(-1)  # [match, agrees]
    return torch.cat([bands, context])


class Acceptance:
    """Per-kind tried/accepted counts on the matrix's device; `rate` of a kind tensor is one gather."""

    def __init__(self, device: torch.device) -> None:
        self.tried = torch.full((KINDS,), PRIOR_WEIGHT, device=device)
        self.accepted = prior_rates().to(device) * PRIOR_WEIGHT

    def rate(self, kinds: torch.Tensor) -> torch.Tensor:
        """[...] estimated acceptance of tokens of these kinds."""
        return (self.accepted / self.tried)[kinds]

    @staticmethod
    def matrix_kind(stored_prob: torch.Tensor) -> torch.Tensor:
        """[B] kind of a matrix candidate stored with this probability."""
        return (stored_prob * BANDS).long().clamp(0, BANDS - 1)

    @staticmethod
    def context_kind(match: torch.Tensor, agrees: torch.Tensor) -> torch.Tensor:
        """[B] kind of a context token after a `match`-token suffix match; `agrees`: the matrix row lists it."""
        return BANDS + 2 * (match.clamp(1, MATCHES) - 1) + agrees.long()

    def record(self, kinds: list[list[int]], accepted: list[int]) -> None:
        """Count one verified step: request i drafted tokens of `kinds[i]` and had `accepted[i]` of them accepted."""
        tried_kinds, accepted_kinds = [], []
        for kind, n in zip(kinds, accepted):
            tried_kinds += kind[: n + 1]  # the accepted ones and the first rejected one
            accepted_kinds += kind[:n]
        device = self.tried.device
        self.tried += torch.bincount(torch.tensor(tried_kinds, dtype=torch.long), minlength=KINDS).to(device)
        self.accepted += torch.bincount(torch.tensor(accepted_kinds, dtype=torch.long), minlength=KINDS).to(device)
        full = self.tried > MEMORY
        self.tried[full] *= 0.5
        self.accepted[full] *= 0.5

    def summary(self) -> dict[str, list[float]]:
        """Plain data for logs and tests: rates and evidence (tries beyond the prior) per kind."""
        return {"rate": (self.accepted / self.tried).tolist(), "tries": (self.tried - PRIOR_WEIGHT).tolist()}
