"""The draft tree's layout: where each node stands, from the tree's shape alone (computed once per shape)."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

import networkx as nx


@dataclass(frozen=True)
class TreeLayout:
    """Positions of a draft tree's nodes: root at the top (y = 0), depth d at y = -d, x in [0, 1]."""

    x: tuple[float, ...]
    y: tuple[float, ...]


LONE_X = (0.25, 0.75)  # a node alone at its depth stays near these x (a run under an edge node steps in once)
LONE_SLACK = 0.07  # ... within this much of them it hangs straight under its parent (a small bend crowds labels)


def _stepped_in(parent_x: float) -> float:
    """The x of a node alone at its depth: under its parent, or at LONE_X if its parent is far outside it."""
    if parent_x > LONE_X[1] + LONE_SLACK:
        return LONE_X[1]
    if parent_x < LONE_X[0] - LONE_SLACK:
        return LONE_X[0]
    return parent_x


@lru_cache(maxsize=64)
def tree_layout(parents: tuple[int, ...], ranks: tuple[int, ...] | None = None, spread: float = 1.0) -> TreeLayout:
    """Layered layout of a tree given by parent indices (root: -1), computed once per tree shape.

    Each leaf of the tree owns an equal slot of the width, so a subtree owns a band as wide as its leaves; children
    divide their parent's band in candidate-rank order (`ranks`, else node index: candidate #0 leftmost,
    context-only drafts of hybrid trees, rank >= k, after the matrix's candidates) and a node stands over the
    middle of its band. So a node's children sit under it, no two edges cross, and two nodes of one depth are at
    least a slot apart. `spread` < 1 shares a band by leaves ** spread instead: a big subtree gives its small
    siblings room (the paper's 80-node tree: its first candidate's subtree held most leaves, and five of the
    root's eight candidates stood too close to be named). A node alone at its depth stands under its parent (or
    steps toward LONE_X, where its label has room on either side, _stepped_in): a long copied run hangs straight
    down from where it starts. Every node under it is its descendant, so its band is the whole width again.
    """
    n = len(parents)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((p, i) for i, p in enumerate(parents) if p >= 0)
    depth = nx.shortest_path_length(graph, 0)
    order = list(nx.bfs_tree(graph, 0))  # parents before children
    key = (lambda c: (ranks[c], c)) if ranks is not None else (lambda c: c)
    children = {i: sorted(graph.successors(i), key=key) for i in order}
    per_depth = Counter(depth.values())
    leaves = [0] * n
    for i in reversed(order):
        leaves[i] = leaves[i] or 1  # a leaf counts itself; an inner node, its subtree's leaves (added below)
        if parents[i] >= 0:
            leaves[parents[i]] += leaves[i]
    shares = {i: sum(leaves[c] ** spread for c in children[i]) for i in order}
    x, y = [0.5] * n, [0.0] * n
    bands = {0: (0.0, 1.0)}
    for i in order:
        a, b = bands[i]
        lone = i != 0 and per_depth[depth[i]] == 1
        x[i] = _stepped_in(x[parents[i]]) if lone else (a + b) / 2
        if lone:  # every deeper node is its descendant: they may have the whole width
            a, b = 0.0, 1.0
        y[i] = -float(depth[i])
        pos = a
        for c in children[i]:
            width = (b - a) * leaves[c] ** spread / shares[i]
            bands[c], pos = (pos, pos + width), pos + width
    return TreeLayout(tuple(x), tuple(y))
