"""Adaptive, hardware-aware draft trees: the paper's "dynamic tree" next step.

Each step the tree is grown best-first from the root over the adjacency matrix: a node's score is the
product, along its path, of calibrated acceptance probabilities of its candidates. The calibration maps
the probability stored with a candidate (matrix.probs) to how often such candidates were really accepted,
learned online. The tree size is chosen each step to maximise expected tokens per second,
(expected accepted + 1) / t(N), with t(N) the measured cost of a forward of N tokens on this device.

Everything up to the forward runs on the device without host syncs: the next step's tree is grown right
after verification (the bonus token is known on the device then), and its expected-acceptance curve rides
along in the step's single sync, so the host can pick the size for the next step.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import torch

from .tree import DraftTree

N_BINS = 16  # calibration bins over the stored candidate probability (uint8 0..255)


def stored_bin(stored: torch.Tensor) -> torch.Tensor:
    """The calibration bin (long) of stored candidate probabilities (uint8 0..255)."""
    return stored.long() * N_BINS // 256


_BIN_OF_STORED = stored_bin(torch.arange(256))  # the bin of every possible stored value
COST_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 81, 96, 128)  # forward sizes (tokens) whose cost is tracked


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


class ForwardCost:
    """t(N): the measured cost of one forward of N tokens, from a start-up probe refined online (EMA)."""

    def __init__(self) -> None:
        self.ms = {n: float(n) for n in COST_GRID}  # placeholder shape until measured: linear in N
        self.measured = False

    def __call__(self, n: int) -> float:
        """Interpolated cost in ms of a forward of n tokens."""
        grid = COST_GRID
        if n <= grid[0]:
            return self.ms[grid[0]]
        if n > grid[-1]:
            return self.ms[grid[-1]] * n / grid[-1]
        i = bisect.bisect_left(grid, n)  # grid[i - 1] < n <= grid[i]
        lo, hi = grid[i - 1], grid[i]
        w = (n - lo) / (hi - lo)
        return self.ms[lo] * (1 - w) + self.ms[hi] * w

    def observe(self, n: int, ms: float, alpha: float = 0.1) -> None:
        """Blend one measured forward into the nearest grid point."""
        g = min(COST_GRID, key=lambda x: abs(x - n))
        self.ms[g] = (1 - alpha) * self.ms[g] + alpha * ms * self(g) / max(self(n), 1e-9)

    def probe(self, forward, max_tokens: int, repeats: int = 2) -> None:
        """Time forwards of each grid size (median of `repeats` after a warm-up); forward(n) runs one of n tokens."""
        forward(1)
        for n in COST_GRID:
            if n > max_tokens:
                self.ms[n] = self.ms[max(g for g in COST_GRID if g <= max_tokens)] * n / max_tokens
                continue
            times = []
            for _ in range(repeats):
                t0 = time.perf_counter()
                forward(n)
                times.append((time.perf_counter() - t0) * 1e3)
            self.ms[n] = sorted(times)[len(times) // 2]
        for a, b in zip(COST_GRID, COST_GRID[1:]):  # costs never fall with more tokens
            self.ms[b] = max(self.ms[b], self.ms[a])
        self.measured = True


class AdaptiveDrafter:
    """Grows best-first trees, picks their size from the cost model, and learns its calibration online."""

    def __init__(self, device: torch.device, prior: float = 4.0):
        self.device = device
        self.cost = ForwardCost()
        # Acceptance rate per bin starts at the bin's own stored probability (a calibrated model), weight `prior`.
        centers = (torch.arange(N_BINS, dtype=torch.float64) + 0.5) / N_BINS
        self.hits = centers * prior
        self.trials = torch.full((N_BINS,), prior, dtype=torch.float64)
        self._refresh()
        self.next: GrownTree | None = None  # the tree grown for the next step, from the bonus token
        self.last_size = 0  # draft nodes chosen for the latest step (the first step of an answer starts there)
        self._index_cache: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _rates(self) -> torch.Tensor:
        return (self.hits / self.trials).clamp(1e-3, 0.98).float()

    def _refresh(self) -> None:
        """Recompute the per-bin rates and the lookup table from stored probability (0..255) to rate."""
        self.rate = self._rates()
        self.rate_lut = self.rate[_BIN_OF_STORED].to(self.device)

    def reset(self) -> None:
        """Forget the pending tree (call at the start of every answer)."""
        self.next = None

    # -- growing ----------------------------------------------------------------------------------------------
    def grow(self, table: torch.Tensor, probs: torch.Tensor, root: torch.Tensor, budget: int, max_depth: int) -> GrownTree:
        """Best-first tree of up to `budget` draft nodes under `root` ([1] long), one gather per depth, no sync.

        table, probs: [V, k] candidate ids and their stored probabilities (uint8). Each level keeps its best
        `budget` candidates by path score; then the best `budget` nodes over all levels form the tree.
        """
        device = table.device
        k = table.shape[1]
        lut = self.rate_lut  # [256] calibrated acceptance rate of a stored probability
        level_tok, level_score = root.view(1), torch.ones(1, device=device)
        toks, scores, tops, sizes = [level_tok], [level_score], [], [1]
        for _ in range(max_depth):
            cand = table[level_tok].view(-1)  # [F*k]
            cprob = probs[level_tok].view(-1)  # [F*k] uint8
            cscore = (level_score[:, None] * lut[cprob.long()].view(-1, k)).view(-1)
            level_score, top = torch.topk(cscore, min(budget, cscore.shape[0]))
            level_tok = cand[top]  # int32 ids index as well as long ones
            toks.append(level_tok)
            scores.append(level_score)
            tops.append(top)
            sizes.append(top.shape[0])
        # parents and ranks of all levels at once: candidate j of a level is child j // k of the previous level
        level_start, dep = self._level_index(tuple(sizes), device)
        top_all = torch.cat(tops)
        par = torch.cat([torch.zeros(1, dtype=torch.long, device=device), level_start + top_all // k])
        rnk = torch.cat([torch.zeros(1, dtype=torch.long, device=device), top_all % k])
        tok, score = torch.cat(toks), torch.cat(scores)  # promoted to long by the root
        raw = probs[tok[par], rnk]  # each node's stored probability: its parent's row, its rank (root: unused)
        n = min(budget, tok.shape[0] - 1)
        # Root first, then the best n candidates by score; a child scores below its parent, so parents are kept.
        # Sorting the kept global ids keeps parents before children (levels are stored in order).
        order = torch.cat([torch.zeros(1, dtype=torch.long, device=device),
                           torch.sort(torch.topk(score[1:], n).indices + 1).values])
        new_index = torch.zeros(tok.shape[0], dtype=torch.long, device=device)
        new_index[order] = torch.arange(n + 1, device=device)
        s = score[order]
        best_first = torch.sort(s[1:], descending=True).values
        expected = torch.cat([torch.zeros(1, device=device), best_first.cumsum(0)])  # expected accepted, best m nodes
        return GrownTree(tokens=tok[order], parents=new_index[par[order]], depths=dep[order], ranks=rnk[order],
                         scores=s, bins=stored_bin(raw[order]), expected=expected)

    def _level_index(self, sizes: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """For level sizes (root level first): the first node index of each candidate's previous level [sum - 1],
        and every node's depth [sum]. They depend on the sizes only, which repeat: built once, then cached."""
        key = (sizes, str(device))
        if key not in self._index_cache:
            starts = [0]
            for size in sizes[:-1]:
                starts.append(starts[-1] + size)
            level_start = torch.repeat_interleave(torch.tensor(starts[:-1]), torch.tensor(sizes[1:])).to(device)
            dep = torch.repeat_interleave(torch.arange(len(sizes)), torch.tensor(sizes)).to(device)
            self._index_cache[key] = (level_start, dep)
        return self._index_cache[key]

    def choose_size(self, expected: list[float], budget: int) -> int:
        """Draft nodes to verify next: argmax over m of (expected[m] + 1) / t(m + 1); 0 means a plain step."""
        best_m, best_rate = 0, 1.0 / self.cost(1)
        for m in range(1, min(budget, len(expected) - 1) + 1):
            rate = (expected[m] + 1.0) / self.cost(m + 1)
            if rate > best_rate:
                best_m, best_rate = m, rate
        return best_m

    @staticmethod
    def take(grown: GrownTree, m: int, max_depth: int) -> tuple[DraftTree, torch.Tensor]:
        """The tree of the best m nodes by score as a device-only DraftTree, and its tokens [m+1]. No sync."""
        device = grown.tokens.device
        best = torch.topk(grown.scores[1:], m).indices + 1 if m > 0 else torch.zeros(0, dtype=torch.long, device=device)
        keep = torch.cat([torch.zeros(1, dtype=torch.long, device=device), torch.sort(best).values])  # parents first
        remap = torch.zeros(grown.tokens.shape[0], dtype=torch.long, device=device)
        remap[keep] = torch.arange(m + 1, device=device)
        parents = remap[grown.parents[keep]]
        rows = torch.arange(m + 1, device=device)
        anc = torch.eye(m + 1, dtype=torch.bool, device=device)  # [i, j]: j is i or an ancestor of i
        reach = rows
        for _ in range(max_depth):
            reach = parents[reach]  # the root is its own parent, so walking past it stays there
            anc[rows, reach] = True
        tree = DraftTree(name="adaptive", parents=parents, depths=grown.depths[keep], ranks=grown.ranks[keep],
                         level_slices=(), tree_mask=anc, paths=torch.empty(0, dtype=torch.long),
                         parents_list=(), depths_list=(), ranks_list=())
        return tree, keep

    # -- learning ---------------------------------------------------------------------------------------------
    def observe(self, parents: list[int], bins: list[int], accepted: list[int], forward_tokens: int, forward_ms: float) -> None:
        """Learn from one verified tree: a node whose parent was accepted was tested; did the model agree?"""
        on_path = set(accepted)
        for node in range(1, len(parents)):
            if parents[node] in on_path:
                b = bins[node]
                self.trials[b] += 1
                self.hits[b] += node in on_path
        self._refresh()
        self.cost.observe(forward_tokens, forward_ms)
