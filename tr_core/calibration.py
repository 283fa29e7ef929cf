"""Calibration keys of matrix candidates (adaptive and hybrid trees): the bin of the stored probability and whether
the row was written before this answer; their starting rates; which candidates a step tested (docs/cpu-policy.md)."""
from __future__ import annotations

import torch

N_BINS = 16  # calibration bins over the stored candidate probability (uint8 0..255), finer where it is small
# Matrix calibration keys: bin, plus N_BINS when the candidate's row was written before this answer began
MATRIX_KEYS = 2 * N_BINS


def stored_bin(stored: torch.Tensor) -> torch.Tensor:
    """The calibration bin (long) of stored probabilities (uint8, p = stored / 255): bins even in sqrt(p), bin b
    holding sqrt(stored / 256) in [b/16, (b+1)/16), so unlikely candidates are not pooled with likely ones."""
    return (torch.sqrt(stored.float() / 256) * N_BINS).long()


def bin_centers() -> torch.Tensor:
    """[N_BINS] float64: the probability at the middle of each bin (a calibrated model's rate there)."""
    return ((torch.arange(N_BINS, dtype=torch.float64) + 0.5) / N_BINS) ** 2


def matrix_prior(prior: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Starting (hits, trials) [MATRIX_KEYS] of the matrix keys: this answer's bins at their own stored probability,
    weight `prior`; older rows' bins empty, as their rate leans on this answer's bin (AdaptiveDrafter._rate)."""
    hits = torch.cat([bin_centers() * prior, torch.zeros(N_BINS, dtype=torch.float64)])
    trials = torch.cat([torch.full((N_BINS,), prior, dtype=torch.float64), torch.zeros(N_BINS, dtype=torch.float64)])
    return hits, trials


# the calibration key of every stored value (0..255) of a row of this answer, then (256..511) of an older row
BIN_OF_STORED = torch.cat([stored_bin(torch.arange(256)), stored_bin(torch.arange(256)) + N_BINS])
BIN_OF_STORED_LIST = BIN_OF_STORED.tolist()


def tested_candidates(tokens: list[int], parents: list[int], depths: list[int], keys: list[int], kept: list[int],
                      accepted: list[int], emitted: list[int]) -> tuple[list[int], list[bool]]:
    """(keys, passed) of every candidate a step tested (its parent accepted), over a whole tree of which the nodes
    `kept` (root first, draft order) were drafted; `accepted` indexes the draft. One not drafted passed if its
    token is the one the model emitted after its parent, as greedy verification would decide."""
    path = [kept[a] for a in accepted]  # tree nodes of the accepted path; path[d] is at depth d
    on_path, drafted = set(path), set(kept)
    out_keys, hits = [], []
    for node in range(1, len(tokens)):
        parent = parents[node]
        depth = depths[parent]
        if parent in on_path and depth < len(emitted):
            out_keys.append(keys[node])
            hits.append(node in on_path if node in drafted else tokens[node] == emitted[depth])
    return out_keys, hits

