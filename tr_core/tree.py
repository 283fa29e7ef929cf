"""Draft trees (paper Sec. 3.2): static templates turned once into tensors, BFS drafting, the tree attention mask.
Path (a, b) is candidate b of candidate a of the root; node 0 is the root, the rest follow in BFS order."""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import torch

Path = tuple[int, ...]


def _paths(digits: str) -> list[Path]:
    """Paths written as their ranks' digits, space-separated ("01": candidate 1 of the root's candidate 0)."""
    return [tuple(map(int, path)) for path in digits.split()]


TEMPLATES: dict[str, list[Path]] = {
    # The paper's default (Luo et al. 2025, App.; reference code tree_template_.py): 80 nodes, 6 levels, a line each
    "2.2.2": _paths("""0 1 2 3 4 5 6 7
        00 01 02 03 04 05 06 07 10 11 12 13 20 21 22 30 31 40 50 60 70
        000 001 002 003 004 005 006 007 010 011 012 020 021 030 040 050 060 070 100 101 110 200 300 400 500
        0000 0001 0002 0003 0004 0010 0011 0020 0030 0040 0100 0200 1000 2000 3000
        00000 00001 00002 00010 00020 00100 01000 10000
        000000 000001 000100"""),
    # A 16-node cut of the same shape: most of the paper tree's accepted mass at a fifth of its size.
    "small-16": _paths("0 1 2 3 00 01 10 000 001 010 100 0000 0001 0010 00000 000000"),
    "chain-4": [(0,) * d for d in range(1, 5)],  # greedy chain: the top candidate of the top candidate...
    "chain-8": [(0,) * d for d in range(1, 9)],
    "wide-8": [(r,) for r in range(8)],  # one level, all 8 candidates of the root
}
ADAPTIVE = "adaptive"  # dynamic, hardware-aware tree (see adaptive.py); not a static template
ADAPTIVE_FIXED = "adaptive-fixed"  # the same dynamic tree, always grown to the full node budget (no cost model)
HYBRID = "hybrid"  # matrix + context retrieval in one best-first tree, sized by cost (see hybrid.py)
HYBRID_FIXED = "hybrid-fixed"  # the hybrid tree, always grown to the full node budget
SIZED_BY_COST = (ADAPTIVE, HYBRID)  # the dynamic trees whose size follows the measured forward cost
DYNAMIC = (ADAPTIVE, ADAPTIVE_FIXED, HYBRID, HYBRID_FIXED)
TEMPLATE_NAMES = (*TEMPLATES, *DYNAMIC)  # every name the engine accepts


def default_template(device: torch.device | str) -> str:
    """The tree that wins on `device` in the benchmark: hybrid on a CPU, the paper's on a GPU (hybrid unmeasured)."""
    return "2.2.2" if torch.device(device).type == "cuda" else HYBRID


def check_template(name: str, where: str = "", names: Iterable[str] | None = None) -> str:
    """Return `name` if it is a template the engine accepts (or one of `names`); else raise ValueError listing them."""
    known = tuple(TEMPLATE_NAMES if names is None else names)
    if name not in known:
        raise ValueError(f"unknown template {name!r}{where}; choose from {', '.join(known)}")
    return name


def template_problem(template: str | None, k: int) -> str | None:
    """Why a static template cannot be drafted with k candidates per matrix row (it names deeper ranks), or None."""
    if template not in TEMPLATES:
        return None  # the grown trees take whatever k gives
    need = 1 + max(max(path) for path in TEMPLATES[template])
    if k >= need:
        return None
    return (f"--template {template} drafts candidates up to rank {need - 1}, so it needs --topk-candidates >= {need}, "
            f"got {k}")


class TemplateError(ValueError):
    """A draft tree template is malformed."""


def validate_template(paths: list[Path] | list[list[int]], k: int) -> list[Path]:
    """Check a template (every node's parent present, ranks in [0, k), no duplicates); return it BFS-sorted."""
    if not isinstance(paths, (list, tuple)):
        raise TemplateError(f"a template is a list of paths, got {type(paths).__name__}")
    out: list[Path] = []
    for p in paths:
        if not isinstance(p, (list, tuple)) or len(p) == 0 or \
                not all(isinstance(r, int) and not isinstance(r, bool) for r in p):
            raise TemplateError(f"every path must be a non-empty list of ints, got {p!r}")
        out.append(tuple(p))
    seen = set(out)
    if len(seen) != len(out):
        raise TemplateError("template has duplicate paths")
    for p in out:
        if any(r < 0 or r >= k for r in p):
            raise TemplateError(f"path {list(p)} has a rank outside [0, {k}) (k = candidates per matrix row)")
        if len(p) > 1 and p[:-1] not in seen:
            raise TemplateError(f"path {list(p)} has no parent {list(p[:-1])} in the template")
    return sorted(out, key=lambda p: (len(p), p))


def resolve_template(template: str | list, k: int) -> tuple[str, list[Path]]:
    """Return (name, validated paths) for a template name or a user list of paths."""
    if isinstance(template, str):
        if template not in TEMPLATES:
            names = ", ".join(TEMPLATE_NAMES)
            raise TemplateError(f"unknown template {template!r}; choose one of {names}, or give a list of paths")
        return template, validate_template(TEMPLATES[template], k)
    paths = validate_template(template, k)
    return f"custom-{len(paths)}", paths


@dataclass(frozen=True)
class DraftTree:
    """A draft tree as tensors on the model's device (Medusa-style buffers, built once per template)."""
    name: str
    parents: torch.Tensor  # [N] long, parent node of each node (root: 0, masked by depth)
    depths: torch.Tensor  # [N] long, 0 for the root
    ranks: torch.Tensor  # [N] long, candidate rank in the parent's row (root: 0)
    level_slices: tuple[tuple[int, int], ...]  # (start, end) node range of each depth 1..D (BFS order)
    tree_mask: torch.Tensor  # [N, N] bool, [i, j] = node j is node i or one of its ancestors
    parents_list: tuple[int, ...]  # host copies for events (root: -1)
    depths_list: tuple[int, ...]
    ranks_list: tuple[int, ...]  # root: -1

    @property
    def size(self) -> int:
        return self.parents.shape[0]

    @property
    def max_depth(self) -> int:
        return len(self.level_slices)


def build_tree(name: str, paths: list[Path], device: torch.device | str = "cpu") -> DraftTree:
    """Turn BFS-sorted, validated paths into a DraftTree (done once; the decode loop never walks Python trees)."""
    index = {p: i for i, p in enumerate([(), *paths])}
    parents = [-1] + [index[p[:-1]] for p in paths]
    ranks = [-1] + [p[-1] for p in paths]
    return tree_from_parents(name, parents, ranks, device)


def tree_from_parents(name: str, parents: list[int], ranks: list[int],
                      device: torch.device | str = "cpu") -> DraftTree:
    """Build a DraftTree from BFS-ordered parent indices (parents[0] = -1, parents[i] < i, depth non-decreasing)."""
    n = len(parents)
    if not n or parents[0] != -1 or not all(0 <= parents[i] < i for i in range(1, n)):
        raise ValueError("a tree's parents must be BFS-ordered: parents[0] = -1 and 0 <= parents[i] < i")
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    if any(depths[i] > depths[i + 1] for i in range(n - 1)):
        raise ValueError("a tree's nodes must be sorted by depth")
    mask = torch.eye(n, dtype=torch.bool)
    for i in range(1, n):  # parents come first: a node sees what its parent sees, and itself
        mask[i] |= mask[parents[i]]
    slices = [(depths.index(d), n - depths[::-1].index(d)) for d in range(1, max(depths) + 1)]  # depths are sorted
    return DraftTree(name=name, parents=torch.tensor([max(p, 0) for p in parents], dtype=torch.long, device=device),
                     depths=torch.tensor(depths, dtype=torch.long, device=device),
                     ranks=torch.tensor([max(r, 0) for r in ranks], dtype=torch.long, device=device),
                     level_slices=tuple(slices), tree_mask=mask.to(device), parents_list=tuple(parents),
                     depths_list=tuple(depths), ranks_list=tuple(ranks))


@lru_cache(maxsize=64)
def chain_tree(n: int, device: torch.device | str = "cpu") -> DraftTree:
    """A chain of n nodes (root + n - 1 top candidates): the widest mask for n tokens, used to time forwards."""
    return tree_from_parents(f"chain-{n}", [-1] + list(range(n - 1)), [-1] + [0] * (n - 1), device)


def bfs_draft(table: torch.Tensor, root_token: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """Candidate tokens [N] long for the tree's nodes from table [V, k], root_token [] or [1]; one gather per depth."""
    tokens = torch.empty(tree.size, dtype=torch.long, device=table.device)
    tokens[0] = root_token.reshape(())
    for start, end in tree.level_slices:
        tokens[start:end] = table[tokens[tree.parents[start:end]], tree.ranks[start:end]]
    return tokens


def live_nodes(filled: torch.Tensor, tokens: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """[N] bool: nodes whose ancestors' rows all hold candidates (an unwritten row proposes token 0); filled [V]."""
    live = torch.ones(tree.size, dtype=torch.bool, device=tokens.device)
    for start, end in tree.level_slices:
        parents = tree.parents[start:end]
        live[start:end] = live[parents] & filled[tokens[parents]]
    return live


def attention_bias(tree_mask: torch.Tensor, past: int, dtype: torch.dtype, window: int | None = None,
                   depths: torch.Tensor | None = None) -> torch.Tensor:
    """Additive mask [1, 1, N, past + N]: the prefix is visible, nodes see their ancestors and themselves. With
    `window`, keys window or more positions behind a query are hidden too (node i sits at past + depths[i])."""
    n, device = tree_mask.shape[0], tree_mask.device
    allowed = torch.ones(n, past + n, dtype=torch.bool, device=device)
    allowed[:, past:] = tree_mask
    if window is not None and past + n > window:
        q_pos = past + depths  # [N]
        k_pos = torch.cat([torch.arange(past, device=device), past + depths])  # [past + N]
        allowed &= (q_pos[:, None] - k_pos[None, :]) < window
    bias = torch.zeros(n, past + n, dtype=dtype, device=device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[None, None]
