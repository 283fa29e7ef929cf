"""Best-first draft trees grown over the adjacency matrix, on the device without a sync or in plain Python on a CPU:
a node scores the product of its path's calibrated acceptance rates, so the best n nodes form a tree."""
from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass
from functools import lru_cache

import torch

from .calibration import BIN_OF_STORED, BIN_OF_STORED_LIST
from .drafters import Draft
from .matrix import AdjacencyMatrix

GROWN = ("tokens", "parents", "depths", "bins")  # the grown tree's fields synced for learning (and merging)
DRAFTED = ("tokens", "parents", "depths", "ranks", "scores", "bins")  # a host tree's fields a Draft is built from


# small constant tensors, built once per size and device (never written to): each would be an allocation a step
@lru_cache(maxsize=256)
def _level_index(sizes: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For level sizes (root first): each node's previous level's first index (root: 0) and its depth, [sum] each."""
    starts = [0, 0]  # the root's (itself), then the level before each level's
    for size in sizes[:-2]:
        starts.append(starts[-1] + size)
    level_start = torch.repeat_interleave(torch.tensor(starts), torch.tensor(sizes)).to(device)
    dep = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(device)
    return level_start, dep


@lru_cache(maxsize=8)
def _root_parts(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """[1] long zero, [1] float one (a root's score), the [1, 1] bool mask of a root alone, and [512] long: the
    calibration key of every stored probability (+256: in an older row)."""
    return (torch.zeros(1, dtype=torch.long, device=device), torch.ones(1, device=device),
            torch.ones(1, 1, dtype=torch.bool, device=device), BIN_OF_STORED.to(device))


@lru_cache(maxsize=256)
def _arange(n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, device=device)


def root_alone(name: str, root: torch.Tensor, levels: int, extras: tuple[str, ...] = ("bins",), **fields) -> Draft:
    """The Draft of a zero-draft step (the root [1] alone) from cached parts; `extras`: per-node fields, all 0."""
    zero, one, mask, _ = _root_parts(root.device)
    return Draft(name=name, tokens=root.view(1), parents=zero, depths=zero, ranks=zero, tree_mask=mask, size=1,
                 levels=levels, node_probs=one, extras={key: zero for key in extras}, **fields)


@dataclass
class GrownTree:
    """A best-first tree on the device, nodes sorted by score (so any prefix is a valid tree)."""
    tokens: torch.Tensor  # [B+1] long, node 0 = root
    parents: torch.Tensor  # [B+1] long, parent index < own index (root: 0)
    depths: torch.Tensor  # [B+1] long
    ranks: torch.Tensor  # [B+1] long, candidate rank in the parent's row (root: 0)
    scores: torch.Tensor  # [B+1] float, estimated probability that the node is accepted (root: 1)
    bins: torch.Tensor  # [B+1] long, calibration bin of the node's candidate (root: 0)
    expected: torch.Tensor  # [B+1] float, expected accepted draft tokens using the first n nodes (n = 0..B)


def grow_on_device(matrix: AdjacencyMatrix, root: torch.Tensor, lut: torch.Tensor, answer_start: int, budget: int,
                   max_depth: int) -> GrownTree:
    """The best `budget` nodes `max_depth` deep under `root`, one gather per depth, no sync; lut [512]: the rate of a
    stored probability (+256 in an older row)."""
    table, probs, stamps = matrix.table, matrix.probs, matrix.stamps
    filled = matrix.filled.float()  # [V] 0 for a row never written: its candidates score 0, below every real one
    device, k = table.device, table.shape[1]
    zero, one, _, bin_of = _root_parts(device)
    levels = [(root.view(1), one, zero, zero)]  # per level: tokens, scores, index among the candidates, stored prob
    for _ in range(max_depth):
        level_tok, level_score = levels[-1][:2]
        cand = table[level_tok].view(-1)  # [F*k]
        older = (stamps[level_tok] < answer_start).long() * 256  # [F] 256 where the row is older
        cprob = (probs[level_tok].long() + older[:, None]).view(-1)  # [F*k] stored probabilities (+256: older)
        cscore = (level_score[:, None] * filled[level_tok][:, None] * lut[cprob].view(-1, k)).view(-1)
        level_score, top = torch.topk(cscore, min(budget, cscore.shape[0]))
        levels.append((cand[top], level_score, top, cprob[top]))  # int32 ids index as well as long ones
    toks, scores, tops, raws = zip(*levels)
    # parents and ranks of all levels at once: candidate j of a level is child j // k of the previous level
    # (the root's entry 0 gives it parent 0 and rank 0)
    level_start, dep = _level_index(tuple(top.shape[0] for top in tops), device)
    top_all = torch.cat(tops)
    par, rnk = level_start + top_all // k, top_all % k
    tok, score = torch.cat(toks), torch.cat(scores)  # promoted to long by the root
    # The root (score 1) and the best n candidates; every rate is below 1, so a child scores below its parent
    # and parents are kept. topk's values come best first: their running sum is the expected-acceptance curve.
    best, order = torch.topk(score, min(budget, tok.shape[0] - 1) + 1)
    expected = best.cumsum(0) - 1.0  # expected accepted draft tokens using the best m nodes, m = 0..n
    order = torch.sort(order).values  # index order: parents before children (levels are stored in order)
    new_index = torch.zeros(tok.shape[0], dtype=torch.long, device=device)
    new_index[order] = _arange(order.shape[0], device)
    return GrownTree(tokens=tok[order], parents=new_index[par[order]], depths=dep[order], ranks=rnk[order],
                     scores=score[order], bins=bin_of[torch.cat(raws)[order]], expected=expected)


def grow_lists(matrix: AdjacencyMatrix, root: int, rates: list[float], answer_start: int, budget: int,
               max_depth: int) -> dict[str, list]:
    """`grow_on_device`'s nodes (ties aside) grown in plain Python over a CPU matrix, as lists {tokens, parents,
    depths, ranks, bins, scores, expected} in the order taken (best first); fastest right after a forward."""
    table, probs, stamps = matrix.table.numpy(), matrix.probs.numpy(), matrix.stamps.numpy()
    filled = matrix.filled.numpy()
    tree: dict[str, list] = {"tokens": [root], "parents": [0], "depths": [0], "ranks": [0], "bins": [0],
                             "scores": [1.0]}
    heap: list[tuple[float, int, int, int, int, int]] = []  # (-score, order pushed, parent, rank, token, key)
    pushed = itertools.count()

    def expand(node: int) -> None:
        token, score = tree["tokens"][node], tree["scores"][node]
        if not filled[token]:  # a row never written holds zeros, not candidates
            return
        older = 256 if stamps[token] < answer_start else 0
        for rank, (cand, stored) in enumerate(zip(table[token].tolist(), probs[token].tolist())):
            key = BIN_OF_STORED_LIST[stored + older]
            heapq.heappush(heap, (-score * rates[key], next(pushed), node, rank, cand, key))

    expand(0)
    while heap and len(tree["tokens"]) <= budget:
        neg, _, parent, rank, token, key = heapq.heappop(heap)
        depth = tree["depths"][parent] + 1
        for name, value in (("tokens", token), ("parents", parent), ("depths", depth), ("ranks", rank),
                            ("bins", key), ("scores", -neg)):
            tree[name].append(value)
        if depth < max_depth and len(tree["tokens"]) <= budget:
            expand(len(tree["tokens"]) - 1)
    tree["expected"] = list(itertools.accumulate(tree["scores"][1:], initial=0.0))
    return tree


def host_draft(name: str, nodes: dict[str, list], levels: int, device: torch.device,
               extras: dict[str, list[int]] | None = None, **fields) -> Draft:
    """A Draft from host lists `nodes` (DRAFTED, root first, parents before children), per-node `extras`, `fields`."""
    parents = torch.tensor(nodes["parents"], dtype=torch.long, device=device)
    longs = {key: torch.tensor(nodes[key], dtype=torch.long, device=device) for key in ("tokens", "depths", "ranks")}
    extras = {"bins": nodes["bins"], **(extras or {})}
    return Draft(name=name, parents=parents, tree_mask=ancestor_mask(parents, max(nodes["depths"])),
                 size=len(nodes["tokens"]), levels=levels, node_probs=torch.tensor(nodes["scores"], device=device),
                 extras={key: torch.tensor(value, dtype=torch.long, device=device) for key, value in extras.items()},
                 **longs, **fields)


def grown_tensors(tree: dict[str, list]) -> GrownTree:
    """A `grow_lists` tree as a GrownTree on the CPU."""
    return GrownTree(**{name: torch.tensor(tree[name], dtype=torch.float32 if name in ("scores", "expected")
                                           else torch.long) for name in GrownTree.__dataclass_fields__})


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """[N, N] bool, [i, j] = node j is node i or one of its ancestors, from parents [N] (root: 0). No sync."""
    n = parents.shape[0]
    rows = torch.arange(n, device=parents.device)
    anc = torch.eye(n, dtype=torch.bool, device=parents.device)
    reach = rows
    for _ in range(max_depth):
        reach = parents[reach]  # the root is its own parent, so walking past it stays there
        anc[rows, reach] = True
    return anc
