"""What one answer carries from step to step (DecodeState), and a drafted step waiting for its forward."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from .config import DecodeConfig
from .cost import StepClock
from .drafters import Draft, Drafter
from .kv_cache import TreeKVCache


@dataclass
class DecodeState:
    """What one answer carries from step to step."""

    prompt_len: int  # tokens in the prompt
    cache: TreeKVCache  # committed keys/values (length == past before every forward)
    past: int  # committed tokens in the cache = position of the root
    root: torch.Tensor  # [1] long, the last committed token
    budget: int  # most tokens this answer may emit
    context: torch.Tensor | None  # [prompt + budget] committed ids for prefix processors (None: not needed)
    committed: int  # valid entries of `context`
    out: list[int]  # emitted tokens
    stop_ids: set[int]  # tokens that end the answer
    stop_tensor: torch.Tensor  # [S] long, the same on the device (for min_new_tokens)
    scores_hook: Callable[[torch.Tensor], None] | None = None  # gets the processed scores [len(emitted), V] per step
    cfg: DecodeConfig = DecodeConfig()
    drafter: Drafter | None = None  # the answer's drafter (a step may fall back to plain decoding: `_active`)
    processors: list = field(default_factory=list)  # the answer's logits processors (sampling.build_processors)
    stop_reason: str = "length"
    # the first step's draft and, when it is the root alone, its logits from the prompt's own forward (`_begin`)
    first: tuple[Drafter, Draft, torch.Tensor | None] | None = None
    steps: int = 0
    forward_ms: float = 0.0  # summed over steps
    overhead_ms: float = 0.0  # summed over steps
    prefill_s: float = 0.0
    opened_at: float = 0.0  # perf_counter when the answer was opened (its prefill time counts from there)
    prefill_ids: list[int] | None = None  # the prompt's forward still to run (Engine.open_answer(prefill=False))
    decode_start: float = 0.0  # perf_counter when the first step began

    @property
    def verified_first(self) -> bool:
        """The next step is the first, already verified by the prompt's forward: it needs no forward of its own."""
        return self.first is not None and self.first[2] is not None


class Drafted(NamedTuple):
    """A drafted step waiting for its forward (`logits` set: the prompt's forward already verified it)."""

    drafter: Drafter
    draft: Draft
    logits: torch.Tensor | None
    timer: StepClock
