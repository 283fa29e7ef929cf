"""Decoding settings: one frozen dataclass, one comment per field."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any


class DecodeConfigError(ValueError):
    """A decoding setting out of range; `name` is the field, the message reads "name rule, got value"."""

    def __init__(self, name: str, rule: str, value: Any) -> None:
        self.name, self.rule, self.value = name, rule, value
        super().__init__(f"{name} {rule}, got {value}")

    def as_option(self) -> str:
        """The message with the field written as its command-line option (`--max-new-tokens must be ...`)."""
        return f"--{self.name.replace('_', '-')} {self.rule}, got {self.value}"


MIN_TEMPERATURE = 1e-6  # the smallest sampling temperature (0 = greedy)
_REALS = ("temperature", "top_p", "repetition_penalty")
_INTEGERS = ("max_new_tokens", "min_new_tokens", "top_k", "seed", "node_budget", "max_depth")


@dataclass(frozen=True)
class DecodeConfig:
    """Settings of one `Engine.generate` call."""

    max_new_tokens: int = 256  # stop after this many emitted tokens (checked inside an accepted path)
    min_new_tokens: int = 0  # stop tokens are suppressed at every node until this many tokens were emitted
    stop_token_ids: tuple[int, ...] | None = None  # tokens that end the answer (None: the model's and chat template's)
    temperature: float = 0.0  # 0 = greedy; > 0 samples with seeded, position-keyed Gumbel noise
    top_p: float = 1.0  # nucleus sampling threshold (1.0 = off); applied after temperature and top-k
    top_k: int = 0  # keep only the k most likely tokens before sampling (0 = off)
    repetition_penalty: float = 1.0  # > 0; 1.0 = off; applied to each tree node with that node's own prefix
    seed: int = 0  # the sampling seed: same seed -> same tokens for plain decoding and Token Recycling
    template: str = "2.2.2"  # draft tree: see tree.TEMPLATE_NAMES ("adaptive": dynamic, sized by cost)
    plain: bool = False  # True = plain decoding (one token per step) through the same harness
    node_budget: int = 80  # adaptive trees: most draft nodes per step (the paper's static tree has 80)
    max_depth: int = 8  # adaptive trees: deepest draft level
    hardware_aware: bool = True  # "adaptive": size each step by measured forward cost (False: node_budget)
    # before decoding, put each prompt token's successor in the prompt first in its matrix row;
    # None = on for adaptive trees, off for the static templates (which then run as the paper published them)
    prompt_seeding: bool | None = None
    sync_timings: bool = False  # CUDA only: synchronise around each phase so per-phase timings are exact
    provenance: bool = False  # record provenance for the microscope (tr_core/provenance.py): costs a copy and sync

    def __post_init__(self) -> None:
        """Make ints and NumPy numbers the fields' types (transformers' warpers refuse an int temperature), then raise
        DecodeConfigError for the first setting out of range (the one place these rules live)."""
        for names, kind, cast, what in ((_REALS, numbers.Real, float, "a number"),
                                        (_INTEGERS, numbers.Integral, int, "an integer")):
            for name in names:
                value = getattr(self, name)
                if isinstance(value, bool) or not isinstance(value, kind):
                    raise DecodeConfigError(name, f"must be {what}", value)
                object.__setattr__(self, name, cast(value))
        rules = (
            ("max_new_tokens", "must be >= 1", self.max_new_tokens >= 1),
            ("min_new_tokens", "must be >= 0", self.min_new_tokens >= 0),
            # below 1e-6 the logits divided by it can overflow float32 (then the argmax is not greedy's)
            ("temperature", f"must be 0 (greedy) or from {MIN_TEMPERATURE:g} up",
             self.temperature == 0.0 or MIN_TEMPERATURE <= self.temperature < math.inf),
            ("top_p", "must be in (0, 1]", 0.0 < self.top_p <= 1.0),
            ("top_k", "must be >= 0", self.top_k >= 0),
            ("repetition_penalty", "must be a finite number > 0",
             self.repetition_penalty > 0.0 and math.isfinite(self.repetition_penalty)),
            ("node_budget", "must be >= 0", self.node_budget >= 0),
            ("max_depth", "must be >= 1", self.max_depth >= 1),
        )
        for name, rule, ok in rules:
            if not ok:
                raise DecodeConfigError(name, rule, getattr(self, name))

    @property
    def greedy(self) -> bool:
        """True when decoding takes the argmax (temperature 0)."""
        return self.temperature == 0.0

    def with_(self, **changes) -> "DecodeConfig":
        return replace(self, **changes)
