"""Calibration keys (adaptive and hybrid trees): what a matrix candidate's acceptance rate is learned by, its
starting rates, and which candidates a verified step tested.

A candidate's key is the bin of its stored probability (uint8 0..255, p = stored / 255) and whether its row was
written before this answer began (a row recycled from another question's context, rather than from this answer's
or its prompt's). The drafters learn a rate per key online (adaptive.py); the hybrid adds keys for runs copied
from the context (hybrid.py).
"""
from __future__ import annotations

import torch

N_BINS = 16  # calibration bins over the stored candidate probability (uint8 0..255), finer where it is small
# Matrix calibration keys: bin, plus N_BINS when the candidate's row was written before this answer began
MATRIX_KEYS = 2 * N_BINS


def stored_bin(stored: torch.Tensor) -> torch.Tensor:
    """The calibration bin (long) of stored candidate probabilities (uint8 0..255, p = stored / 255).

    Bins are even in sqrt(p): bin b holds stored values s with sqrt(s / 256) in [b/16, (b+1)/16), so p up to
    about 0.4%, 1.6%, 3.5%, 6.3%, ... 88% and 100%.
    Most of a tree's candidates are unlikely ones; with even bins in p, the first bin (p < 6%) would pool the
    p = 0.1% candidates with the p = 5% ones the drafts take, and the calibration learned from every tested
    candidate (`tested_candidates`) would rate the latter by the former."""
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
    """The calibration keys of every candidate a step tested, and whether each passed, over a whole tree of which
    only the nodes `kept` (root first, in draft order) were drafted; `accepted` indexes the draft.

    A candidate was tested when its parent was accepted, drafted or not. A drafted one passed if verification
    accepted it; one left out (all of them on a zero-draft step) would have passed if its token is the one the
    model emitted after its parent, which is what greedy verification decides. So candidates the size choice
    keeps out still teach their rates: without them a source that starts too pessimistic never drafts, so never
    learns (a copy from the prompt in a translation), and one too optimistic learns only from what it drafted."""
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

