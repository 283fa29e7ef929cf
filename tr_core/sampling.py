"""Choosing the model's token at each position: greedy argmax, or Gumbel-max sampling with noise hashed from (seed,
position, token id), so the draw does not depend on how many tokens a step decoded: Token Recycling and plain decoding
with the same seed agree."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from transformers import (LogitsProcessorList, MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from .config import DecodeConfig
from .reduce import row_argmax

_MASK32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit hash (two xorshift-multiply rounds) of int64 values < 2^32; the multiplier < 2^27 fits int64."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _MASK32
    return (x >> 16) ^ x


def gumbel_noise(seed: int, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """Standard Gumbel noise [P, V] (float32), a deterministic function of (seed, position, token id)."""
    device = positions.device
    key = _hash32((positions.long() & _MASK32) ^ _hash32(torch.tensor(seed & _MASK32, device=device)))  # [P]
    ids = torch.arange(vocab, device=device, dtype=torch.long)
    bits = _hash32(key[:, None] ^ _hash32(ids + 0x9E3779B)[None, :])  # [P, V] uniform 32-bit integers
    u = (bits.double() + 0.5) / 4294967296.0  # in (0, 1)
    return (-torch.log(-torch.log(u))).float()


# processors that depend only on a node's logits and its prefix's token set: applied to all nodes at once
PER_NODE = (RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper,
            MinPLogitsWarper)


def check_per_node(processor: Any) -> None:
    """Refuse a logits processor that cannot be applied to each tree node with the node's own prefix."""
    if not isinstance(processor, PER_NODE):
        names = ", ".join(cls.__name__ for cls in PER_NODE)
        raise ValueError(f"{type(processor).__name__} cannot be applied per tree node (Token Recycling verifies many "
                         f"positions at once); supported: {names}")


def build_processors(cfg: DecodeConfig, extra: Iterable[Any] = ()) -> LogitsProcessorList:
    """transformers' processors for the settings, in `generate`'s order: penalties, then the sampling warpers."""
    procs = LogitsProcessorList()
    if cfg.repetition_penalty != 1.0:
        procs.append(RepetitionPenaltyLogitsProcessor(penalty=cfg.repetition_penalty))
    for p in extra:
        check_per_node(p)
        procs.append(p)
    if not cfg.greedy:
        if cfg.temperature != 1.0:
            procs.append(TemperatureLogitsWarper(cfg.temperature))
        if cfg.top_k > 0:
            procs.append(TopKLogitsWarper(cfg.top_k))
        if cfg.top_p < 1.0:
            procs.append(TopPLogitsWarper(cfg.top_p))
    return procs


def needs_prefix(processors: LogitsProcessorList) -> bool:
    """Whether a processor reads the prefix (the repetition penalty); the others only read the logits."""
    return any(isinstance(p, RepetitionPenaltyLogitsProcessor) for p in processors)


def node_prefixes(context: torch.Tensor, tokens: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
    """Each node's prefix [N, L + N]: the context [L], then its path, non-ancestors written as the root token (which
    the context already ends with, so prefix-set processors see exactly the node's prefix)."""
    n = tokens.shape[0]
    path = torch.where(tree_mask, tokens[None, :], tokens[:1][None, :])  # [N, N]
    return torch.cat([context[None, :].expand(n, -1), path], dim=1)


def process(logits: torch.Tensor, processors: LogitsProcessorList, prefixes: torch.Tensor | None) -> torch.Tensor:
    """Apply the processors to every node's logits [N, V] (fp32) with its prefix [N, L] (None: no prefix needed)."""
    scores = logits.float()
    if not processors:
        return scores
    return processors(scores.new_zeros(scores.shape[0], 0, dtype=torch.long) if prefixes is None else prefixes, scores)


def choose_tokens(scores: torch.Tensor, cfg: DecodeConfig, first_position: int, depths: torch.Tensor,
                  levels: int) -> torch.Tensor:
    """The model's token [N] long for scores [N, V], node i at position first_position + depths[i] (depths [N] <
    levels): greedy argmax, or argmax of scores + Gumbel noise keyed by (seed, position)."""
    if cfg.greedy:
        return row_argmax(scores)
    positions = torch.arange(first_position, first_position + levels, device=scores.device)
    noise = gumbel_noise(cfg.seed, positions, scores.shape[-1])  # all nodes of one depth share their noise
    return row_argmax(scores + noise[depths])
