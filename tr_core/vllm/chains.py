"""Drafting for vLLM, which verifies chains only: each request's path of its Token Recycling tree most likely to be
accepted, at each depth the matrix's top candidate or the token that followed the same suffix in its own context,
chosen and cut by calibrated acceptance (docs/vllm.md). Pure functions of tensors and arrays, tested without vLLM."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

MAX_NGRAM = 4  # longest suffix matched in the context (longer matches score like this one)
EMPTY = -1  # an adjacency-matrix row that was never written


def context_continuation(tokens: np.ndarray, length: int) -> tuple[np.ndarray, int]:
    """(at most `length` tokens that followed the latest earlier occurrence of the longest suffix of tokens [L],
    1..MAX_NGRAM long, that suffix's length); (empty, 0) when nothing matches."""
    n_tokens = len(tokens)
    for n in range(min(MAX_NGRAM, n_tokens - 1), 0, -1):
        suffix = tokens[n_tokens - n:]
        # starts s of an earlier occurrence tokens[s:s+n] == suffix whose continuation tokens[s+n] exists
        starts = np.flatnonzero(tokens[: n_tokens - n] == suffix[0])
        for j in range(1, n):
            starts = starts[tokens[starts + j] == suffix[j]]
        if len(starts):
            begin = int(starts[-1]) + n
            return tokens[begin: begin + length], n
    return tokens[:0], 0


@dataclass(frozen=True)
class Contexts:
    """The context continuations of a batch, padded: tokens [B, N] (EMPTY past each one's end), match lengths [B]."""

    tokens: torch.Tensor
    match: torch.Tensor


def batch_contexts(histories: list[np.ndarray], length: int, device: torch.device) -> Contexts:
    """context_continuation for every request, as two tensors on `device` (one host-to-device copy)."""
    tokens = np.full((len(histories), length), EMPTY, dtype=np.int64)
    match = np.zeros(len(histories), dtype=np.int64)
    for i, history in enumerate(histories):
        found, n = context_continuation(history, length)
        tokens[i, : len(found)] = found
        match[i] = n
    return Contexts(torch.from_numpy(tokens).to(device), torch.from_numpy(match).to(device))


@dataclass(frozen=True)
class Chains:
    """Drafted chains of a batch: tokens [B, N], kinds [B, N] (calibration keys), kept lengths [B]."""

    tokens: torch.Tensor
    kinds: torch.Tensor
    lengths: torch.Tensor

    def lists(self) -> tuple[list[list[int]], list[list[int]]]:
        """The drafts and their kinds as Python lists (the one device-to-host copy of a step)."""
        tokens, kinds, lengths = self.tokens.tolist(), self.kinds.tolist(), self.lengths.tolist()
        return ([t[:n] for t, n in zip(tokens, lengths)], [k[:n] for k, n in zip(kinds, lengths)])


def draft_chains(last: torch.Tensor, contexts: Contexts, matrix: torch.Tensor, probs: torch.Tensor,
                 acceptance, min_reach: float, caps: torch.Tensor) -> Chains:
    """The best chain of each request's draft tree, cut where its estimated reach falls under `min_reach`: last [B],
    matrix [V, k] (EMPTY: unwritten), probs [V, k], caps [B] most tokens each may draft. A request takes the
    context's token while it follows the context and its rate is at least the matrix's top candidate's."""
    batch, depth = contexts.tokens.shape
    device = last.device
    prev, on_context = last, contexts.match > 0
    reach = torch.ones(batch, device=device)
    alive = torch.ones(batch, dtype=torch.bool, device=device)
    tokens = torch.full((batch, depth), EMPTY, dtype=torch.long, device=device)
    kinds = torch.zeros((batch, depth), dtype=torch.long, device=device)
    lengths = torch.zeros(batch, dtype=torch.long, device=device)
    for d in range(depth):
        row, row_probs = matrix[prev].long(), probs[prev].float()  # [B, k] each
        ctx = contexts.tokens[:, d]
        agrees = (row == ctx[:, None]).any(dim=1)
        ctx_kind = acceptance.context_kind(contexts.match, agrees)
        mat_kind = acceptance.matrix_kind(row_probs[:, 0])
        ctx_rate = torch.where(on_context & (ctx != EMPTY), acceptance.rate(ctx_kind), torch.zeros_like(reach))
        mat_rate = torch.where(row[:, 0] != EMPTY, acceptance.rate(mat_kind), torch.zeros_like(reach))
        use_ctx = ctx_rate >= mat_rate
        on_context = on_context & use_ctx
        rate = torch.maximum(ctx_rate, mat_rate)
        reach = reach * rate
        alive = alive & (rate > 0) & (reach >= min_reach) & (d < caps)  # rate 0: no candidate at all
        choice = torch.where(use_ctx, ctx, row[:, 0])
        tokens[:, d] = choice
        kinds[:, d] = torch.where(use_ctx, ctx_kind, mat_kind)
        lengths += alive.long()
        prev = torch.where(alive, choice, prev)
    return Chains(tokens, kinds, lengths)
