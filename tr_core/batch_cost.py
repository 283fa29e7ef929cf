"""t(B, w): what a shared forward of B rows of w tokens each costs, learned from a batch's own forwards.

A batched forward is not an alone forward of B * w tokens: each row attends over its own cache through a padded
mask. On a 2-core AMD EPYC (SmolLM2-135M, float32, 2026-12-06) eight rows of 1, 2, 3, 5 and 9 tokens took 52, 79,
88, 119 and 164 ms, where one row of 8 to 72 tokens costs far less more than one of 8. A batch sized by the alone
curve drafted trees that lost to plain batched decoding (0.96x). So each (rows, width) the batch runs is timed
and kept; one never run is estimated from the alone curve's shape, and never below a narrower width already timed
for the same rows (a forward does not get cheaper with more tokens), so a width found dear is not retried wider.

    cost = shared_cost(model, alone)      # one per model: what earlier batches learnt carries over
    cost.observe(rows, width, ms)         # after each batched forward
    cost(rows, width)                     # ms, for tree_width
"""
from __future__ import annotations

import weakref
from typing import Any, Callable

ALPHA = 0.3  # weight of a new timing of a (rows, width) already timed: a batched forward is a large sample


class BatchCost:
    """t(B, w) in ms: timed where the batch ran it, else estimated (see the module's doc)."""

    def __init__(self, alone: Callable[[int], float]) -> None:
        self.alone = alone  # t(n) of one row of n tokens (the drafter's ForwardCost): the estimate's shape
        self.ms: dict[tuple[int, int], float] = {}

    def observe(self, rows: int, width: int, ms: float) -> None:
        key = (rows, width)
        self.ms[key] = ms if key not in self.ms else (1 - ALPHA) * self.ms[key] + ALPHA * ms

    def __call__(self, rows: int, width: int) -> float:
        if (rows, width) in self.ms:
            return self.ms[(rows, width)]
        narrower = [ms for (b, w), ms in self.ms.items() if b == rows and w < width]
        return max([self.estimate(rows, width), *narrower])

    def estimate(self, rows: int, width: int) -> float:
        """A (rows, width) never timed: this row count's one-token forward (timed, else the alone curve's) times the
        width's cost over one token, from the nearest row count that timed both, else from the alone curve."""
        base = self.ms.get((rows, 1), self.alone(rows))
        timed = [b for (b, w) in self.ms if w == width and (b, 1) in self.ms]
        if timed:
            b = min(timed, key=lambda b: abs(b - rows))
            return base * self.ms[(b, width)] / self.ms[(b, 1)]
        return base * self.alone(rows * width) / max(self.alone(rows), 1e-9)


_SHARED: "weakref.WeakKeyDictionary[Any, BatchCost]" = weakref.WeakKeyDictionary()


def shared_cost(model: Any, alone: Callable[[int], float]) -> BatchCost:
    """The model's BatchCost, made on first use with `alone` as its shape: batches of one model share what they
    timed (the studio's decode loop and every `generate_batch` call)."""
    cost = _SHARED.get(model)
    if cost is None:
        cost = _SHARED[model] = BatchCost(alone)
    return cost
