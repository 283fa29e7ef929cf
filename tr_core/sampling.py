"""Choosing the model's token at each position: greedy argmax, or sampling that is a pure function of (seed, position).

Sampling uses the Gumbel-max trick with noise derived from a counter-based hash of (seed, position, token id).
The draw at a position therefore does not depend on how many tokens were decoded per step, so Token
Recycling and plain decoding with the same seed return the same tokens, on any device.
"""
from __future__ import annotations

import torch

from .config import DecodeConfig

_MASK32 = 0xFFFFFFFF


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (two xorshift-multiply rounds) on int64 tensors holding values < 2^32."""
    # The multiplier stays below 2^27 so products fit int64 without overflow.
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


def process_logits(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """Temperature, then top-k, then top-p, in the order transformers' `generate` applies them. [N, V] -> [N, V]."""
    scores = logits.float() / cfg.temperature
    if cfg.top_k > 0 and cfg.top_k < scores.shape[-1]:
        kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_scores, sorted_idx = torch.sort(scores, descending=False, dim=-1)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - cfg.top_p)
        remove_sorted[..., -1:] = False  # always keep the most likely token
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores


def choose_tokens(
    logits: torch.Tensor, cfg: DecodeConfig, first_position: int, depths: torch.Tensor, levels: int
) -> torch.Tensor:
    """The model's token for each tree node's logits [N, V]; node i's token goes to position first_position + depths[i].

    depths: [N] long, every value < levels (the tree's depth + 1, known on the host: no sync).

    Greedy: argmax. Sampling: argmax(processed logits + Gumbel noise keyed by (seed, position)). Returns [N] long.
    """
    if cfg.greedy:
        return logits.argmax(dim=-1)
    scores = process_logits(logits, cfg)
    positions = torch.arange(first_position, first_position + levels, device=logits.device)
    noise = gumbel_noise(cfg.seed, positions, scores.shape[-1])  # all nodes of one depth share their noise
    return (scores + noise[depths]).argmax(dim=-1)
