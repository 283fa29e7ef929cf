"""The plausibility bound on a measured speedup, shared by the benchmark's results (results.py) and the studio's meter.

A tree forward never costs less than a one-token forward, so a step that emits `a` tokens is at most `a` times as
fast as one plain step; a larger ratio means the machine's load changed while measuring.
"""
from __future__ import annotations

PLAUSIBLE_SLACK = 1.10  # ratio <= slack x mean accepted tokens per step (slack covers per-step overheads)


def plausible_limit(mean_accepted: float) -> float:
    """The largest ratio a run with this many tokens per step can honestly reach."""
    return mean_accepted * PLAUSIBLE_SLACK
