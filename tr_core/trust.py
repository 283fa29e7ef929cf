"""The trust factor of a cost-sized tree: realised / predicted accepted tokens per size class, against the winner's
curse; judged in hindsight on every step's tree, drafted or not (docs/cpu-policy.md)."""
from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field

TRUST_PRIOR = 2.0  # pseudo-tokens behind each trust factor's start at 1.0
TRUST_DECAY = 0.97  # per tree judged: a trust factor follows about the last 30 steps
TRUST_FORGET = 0.98  # per tree too small to judge a size class: that class drifts back towards 1
TRUST_MAX = 1.5
TRUST_SIZES = (1, 3, 6, 12, 24)  # the trust's size classes (draft nodes): 1-2, 3-5, 6-11, 12-23, 24+


def size_class(m: int) -> int:
    """The trust's size class of a draft of m >= 1 nodes (TRUST_SIZES)."""
    return bisect.bisect_right(TRUST_SIZES, m) - 1


def class_sizes(c: int, largest: int) -> range:
    """The draft sizes of size class c that a tree of `largest` draft nodes holds."""
    hi = TRUST_SIZES[c + 1] - 1 if c + 1 < len(TRUST_SIZES) else largest
    return range(TRUST_SIZES[c], min(hi, largest) + 1)


@dataclass
class Watched:
    """A tree waiting for the tokens that judge it: its shape, its nodes' best-first ranks and its curve."""
    start: int  # stream position of the first token its root predicts (its root is the token before)
    children: dict[tuple[int, int], list[int]]  # (parent, token) -> nodes (a matrix row may repeat a token)
    rank: list[int]  # node -> position in best-first order, 1-based (a draft of m nodes holds ranks 1..m)
    expected: list[float]  # expected accepted tokens of a draft of m nodes, m = 0..len - 1
    path: list[int] = field(default_factory=list)  # per depth matched so far, the lowest rank of a matching node
    frontier: list[int] = field(default_factory=lambda: [0])  # the matching nodes at the deepest matched depth


def realised_counts(path_ranks: list[int], largest: int) -> list[int]:
    """Accepted draft tokens of every draft size m = 0..largest, from each matched depth's lowest matching rank
    (ranks rise along a path, so the best m nodes hold depth d's match exactly when its rank is <= m)."""
    counts = [0] * (largest + 1)
    for r in path_ranks:
        if r <= largest:
            counts[r] += 1
    return list(itertools.accumulate(counts))


class HindsightTrust:
    """Trust per size class, learned from every step's tree once the answer's next tokens are known."""

    def __init__(self, decay: float = TRUST_DECAY) -> None:
        self.decay = decay  # per tree judged, the weight left to the trees before it
        self.factors = [1.0] * len(TRUST_SIZES)
        self.predicted, self.realised = [0.0] * len(TRUST_SIZES), [0.0] * len(TRUST_SIZES)  # decayed sums per class
        self.stream: list[int] = []  # this answer's emitted tokens
        self.watched: list[Watched] = []

    def __getitem__(self, c: int) -> float:
        return self.factors[c]

    def state(self) -> dict[str, list[float]]:
        """What it learned, as plain data: {"factors", "predicted", "realised"} per size class (TRUST_SIZES)."""
        return {"factors": list(self.factors), "predicted": list(self.predicted), "realised": list(self.realised)}

    def load_state(self, state: dict) -> None:
        """Take a `state()` (e.g. a warm start's); raises ValueError, changing nothing, for anything malformed."""
        classes = len(TRUST_SIZES)
        if not isinstance(state, dict) or set(state) != {"factors", "predicted", "realised"}:
            raise ValueError("a trust state holds exactly factors, predicted and realised")
        for name, values in state.items():
            if not isinstance(values, list) or len(values) != classes or not all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
                    for v in values):
                raise ValueError(f"trust {name}: {classes} finite numbers >= 0 expected")
        if not all(0 < f <= TRUST_MAX for f in state["factors"]):
            raise ValueError(f"trust factors must lie in (0, {TRUST_MAX}]")
        self.factors, self.predicted, self.realised = ([float(v) for v in state[name]]
                                                       for name in ("factors", "predicted", "realised"))

    def start_answer(self) -> None:
        """A new answer: the last one's open trees are judged by its tokens so far; the factors carry over."""
        for tree in self.watched:
            self._fold(tree)
        self.stream.clear()
        self.watched.clear()

    def watch(self, tokens: list[int], parents: list[int], order: list[int], expected: list[float]) -> None:
        """Judge this tree once the tokens after it are known; expected[m]: predicted accepted tokens of order[:m]."""
        largest = min(len(order), len(expected) - 1)
        if largest < 1:
            return
        rank = [0] * len(tokens)
        for position, node in enumerate(order, 1):
            rank[node] = position
        children: dict[tuple[int, int], list[int]] = {}
        for i in range(1, len(tokens)):
            children.setdefault((parents[i], tokens[i]), []).append(i)
        self.watched.append(Watched(len(self.stream), children, rank, list(expected[: largest + 1])))
        self._advance(self.watched[-1])

    def extend(self, emitted: list[int]) -> None:
        """The step's emitted tokens: follow every watched tree's path, and fold those that are settled."""
        self.stream.extend(emitted)
        for tree in self.watched:
            self._advance(tree)
            if not tree.frontier:
                self._fold(tree)
        self.watched = [tree for tree in self.watched if tree.frontier]

    def _advance(self, tree: Watched) -> None:
        """Follow the tree's matching nodes along the known tokens; settled when the frontier empties."""
        while tree.frontier and tree.start + len(tree.path) < len(self.stream):
            token = self.stream[tree.start + len(tree.path)]
            tree.frontier = [c for node in tree.frontier for c in tree.children.get((node, token), ())]
            if tree.frontier:
                tree.path.append(min(tree.rank[c] for c in tree.frontier))

    def _fold(self, tree: Watched) -> None:
        """Add a settled tree's predicted and realised tokens, averaged over each class's sizes it holds."""
        largest = len(tree.expected) - 1
        realised = realised_counts(tree.path, largest)
        for c in range(len(TRUST_SIZES)):
            sizes = class_sizes(c, largest)
            if sizes:
                self.predicted[c] = self.decay * self.predicted[c] + sum(tree.expected[m] for m in sizes) / len(sizes)
                self.realised[c] = self.decay * self.realised[c] + sum(realised[m] for m in sizes) / len(sizes)
            else:
                self.predicted[c] *= TRUST_FORGET
                self.realised[c] *= TRUST_FORGET
            self.factors[c] = min(TRUST_MAX, (self.realised[c] + TRUST_PRIOR) / (self.predicted[c] + TRUST_PRIOR))
