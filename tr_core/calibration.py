"""Calibration keys of matrix candidates (adaptive and hybrid trees): the bin of the stored probability and whether
the row was written before this answer; their starting rates; which candidates a step tested (docs/cpu-policy.md)."""
from __future__ import annotations

import torch

N_BINS = 16  # calibration bins over the stored candidate probability (uint8 0..255), finer where it is small
MATRIX_KEYS = 2 * N_BINS  # a matrix key: the bin, plus N_BINS when the row was written before this answer began


def stored_bin(stored: torch.Tensor) -> torch.Tensor:
    """The calibration bin (long) of stored probabilities (uint8, p = stored / 255): bins even in sqrt(p), bin b
    holding sqrt(stored / 256) in [b/16, (b+1)/16), so unlikely candidates are not pooled with likely ones."""
    return (torch.sqrt(stored.float() / 256) * N_BINS).long()


def matrix_prior(prior: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting (hits, trials) [MATRIX_KEYS] of the matrix keys: this answer's bins at the probability of their
    middle, weight `prior`; older rows' bins empty, as their rate leans on this answer's bin (AdaptiveDrafter._rate)."""
    centers = ((torch.arange(N_BINS, dtype=torch.float64) + 0.5) / N_BINS) ** 2
    empty = torch.zeros(N_BINS, dtype=torch.float64)
    return torch.cat([centers * prior, empty]), torch.cat([torch.full((N_BINS,), prior, dtype=torch.float64), empty])


# the calibration key of every stored value (0..255) of a row of this answer, then (256..511) of an older row
BIN_OF_STORED = torch.cat([stored_bin(torch.arange(256)), stored_bin(torch.arange(256)) + N_BINS])
BIN_OF_STORED_LIST = BIN_OF_STORED.tolist()


def tested_candidates(tokens: list[int], parents: list[int], depths: list[int], keys: list[int], kept: list[int],
                      accepted: list[int], emitted: list[int]) -> tuple[list[int], list[bool]]:
    """(keys, passed) of every candidate a step tested (its parent accepted), over a whole tree of which the nodes
    `kept` (root first, draft order) were drafted; `accepted` indexes the draft. One not drafted passed if its
    token is the one the model emitted after its parent, as greedy verification would decide."""
    on_path, drafted = {kept[a] for a in accepted}, set(kept)  # tree nodes of the accepted path, of the draft
    out_keys, hits = [], []
    for node in range(1, len(tokens)):
        parent = parents[node]
        if parent in on_path and depths[parent] < len(emitted):
            out_keys.append(keys[node])
            hits.append(node in on_path if node in drafted else tokens[node] == emitted[depths[parent]])
    return out_keys, hits
