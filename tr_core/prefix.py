"""The tokens a batch's prompts start with, prefilled once: a chat template's system turn is the same for every
visitor, so a class asking at once need not run it through the model thirty times.

A prompt's first tokens see nothing after them (causal attention), so their cache entries are the same whatever
follows: each joining answer's row starts with a copy of them and only the rest of its prompt is prefilled
(ModelRunner.prefill_rows). `SharedPrefix` keeps the last one used, for the answers that join later.
"""
from __future__ import annotations

from typing import Any

from .divergence import first_difference
from .invariant import storage_dtype
from .kv_cache import TreeKVCache

MIN_SHARED = 8  # shared tokens worth a forward of their own (SmolLM2's chat template starts every prompt with 24)


def common_length(prompts: list[list[int]]) -> int:
    """How many first tokens every prompt of `prompts` has in common (where each parts from the first one:
    divergence.first_difference)."""
    parts = (first_difference(prompts[0], p) for p in prompts)
    return min((len(p) if part is None else part for p, part in zip(prompts, parts)), default=0)


class SharedPrefix:
    """The cache of the first tokens that the prompts joining a batch share (held between groups of joiners)."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.cache: TreeKVCache | None = None
        self.model: Any = None

    def take(self, runner: Any, prompts: list[list[int]]) -> tuple[TreeKVCache | None, int]:
        """(a one-row cache, n): the cache holds at least the first n tokens of every prompt, n >= MIN_SHARED, and
        every prompt keeps a token of its own after them (its logits are read); (None, 0) when they share too few.
        The one held serves when the prompts start with enough of it; else prompts joining together that share
        enough are prefilled once into a new one (a prompt alone shares with no one)."""
        limit = min(len(p) for p in prompts) - 1
        if self.usable(runner):
            held = min(common_length([self.tokens] + prompts), limit)
            if held >= MIN_SHARED:
                return self.cache, held
        shared = min(common_length(prompts), limit)
        if len(prompts) < 2 or shared < MIN_SHARED:
            return None, 0
        self.tokens, self.cache, self.model = prompts[0][:shared], TreeKVCache(), runner.model
        runner.prefill(self.tokens, self.cache)
        return self.cache, shared

    def usable(self, runner: Any) -> bool:
        """Whether the held cache was made by this model, in the dtype its caches store now (exact mode's float64
        or the model's own)."""
        if self.cache is None or self.model is not runner.model or not self.cache.layers:
            return False
        return self.cache.layers[0].keys.dtype == storage_dtype(runner.dtype)
