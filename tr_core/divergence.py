"""Where two answers to one prompt part, and why: the first differing token, the two competing tokens, how far
apart the model scores them in its dtype (a near tie), and the setting that would make the answers agree.

Plain data for the views to phrase (present/), the benchmark and the library's users.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from .invariant import LOW_PRECISION
from .kv_cache import TreeKVCache

# What would make the two agree: exact mode (row-invariant products, invariant.py), float32 where exact mode is
# unavailable on this device, or nothing known (exact mode was on, or is unavailable in float32)
EXACT_MODE, FLOAT32, UNKNOWN = "exact_mode", "float32", "unknown"


@dataclass(frozen=True)
class Divergence:
    """Two answers parting at answer token `index`: `first` chose `first_token`, `second` chose `second_token`."""

    index: int
    first_token: int
    second_token: int
    first_logit: float  # each token's score at that position, from a one-token forward of the common prefix
    second_logit: float
    gap: float  # |first_logit - second_logit|: a near tie when small against the logits' rounding in `dtype`
    dtype: str
    fix: str  # EXACT_MODE, FLOAT32 or UNKNOWN

    def as_data(self) -> dict[str, Any]:
        return asdict(self)


def first_difference(first: list[int], second: list[int]) -> int | None:
    """The first index where the answers differ (one ending early counts), None when identical."""
    for i, (a, b) in enumerate(zip(first, second)):
        if a != b:
            return i
    return None if len(first) == len(second) else min(len(first), len(second))


def explain(engine: Any, prompt: list[int], first: list[int], second: list[int]) -> Divergence | None:
    """Why `first` and `second` (answers to `prompt` by `engine`'s model) part; None when they do not or one of
    them simply ends there."""
    index = first_difference(first, second)
    if index is None or index >= min(len(first), len(second)):
        return None
    return explain_at(engine, list(prompt) + list(first[:index]), index, first[index], second[index])


@torch.no_grad()
def explain_at(engine: Any, context: list[int], index: int, first_token: int, second_token: int) -> Divergence:
    """Two answers that agree up to `context` (the prompt and the common prefix, `index` tokens of answer) chose
    `first_token` and `second_token` next: one forward of the context scores both."""
    logits = _scores_after(engine.runner, list(context), len(context) - index)
    low = engine.dtype in LOW_PRECISION
    fix = UNKNOWN if engine.exact else EXACT_MODE if exact_available(engine) else FLOAT32 if low else UNKNOWN
    a, b = float(logits[first_token]), float(logits[second_token])
    return Divergence(index=index, first_token=first_token, second_token=second_token, first_logit=a, second_logit=b, gap=abs(a - b),
                      dtype=str(engine.dtype).removeprefix("torch."), fix=fix)


def _scores_after(runner: Any, context: list[int], prompt_len: int) -> torch.Tensor:
    """The logits [V] after `context` as the answers' forwards gave them: the prompt but its last token prefilled
    (Engine._begin), the rest in one causal forward (rows that round as one-token forwards in exact mode)."""
    cache, split = TreeKVCache(), max(prompt_len - 1, 0)
    runner.prefill(context[:split], cache)
    rest = torch.tensor([context[split:]], dtype=torch.long, device=runner.device)
    positions = torch.arange(split, len(context), device=runner.device)[None]
    return runner.forward(rest, positions, None, cache, last_only=True)[-1].float()


def exact_available(engine: Any) -> bool:
    """Whether exact mode could run `engine`'s model on this device (a chunking was found row-invariant)."""
    from .kernels import exact_plan

    return exact_plan(engine.model) is not None
