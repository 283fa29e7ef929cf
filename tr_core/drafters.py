"""The drafter seam (like transformers' CandidateGenerator): `draft` proposes the step's tree on the device,
`lookahead` does device work after verification that rides the step's one sync to `observe`, which learns from it."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from .config import DecodeConfig
from .matrix import AdjacencyMatrix
from .tree import DraftTree, bfs_draft, chain_tree, live_nodes, tree_from_parents


@dataclass(frozen=True)
class NoDraft:
    """Why a step drafted nothing (host data, with the numbers that decided it) and the best tree it considered."""
    why: str  # "first step" (the prompt's forward verifies it), "empty row" (no candidates after the root), "cost"
    gain: float = 0.0  # "cost": the best tree's expected accepted draft tokens (its trust applied)
    cost_ratio: float = 0.0  # "cost": that tree's step cost over a one-token step's, as measured on this machine
    tokens: tuple[int, ...] = ()  # the best tree considered, root first (empty: none)
    parents: tuple[int, ...] = ()  # its parents (root: -1), each before its children
    expected: tuple[float, ...] = ()  # per node, its estimated probability of being accepted (root: 1)
    context: bool = False  # the drafter also searched the conversation for runs to copy (hybrid)

    def as_data(self) -> dict[str, Any]:
        """The reason as plain data for the step event (StepEvent.no_draft); the views phrase it."""
        return {"why": self.why, "drafts": max(len(self.tokens) - 1, 0), "gain": round(self.gain, 4),
                "cost_ratio": round(self.cost_ratio, 4), "context": self.context}

    def unverified(self) -> dict[str, list] | None:
        """The tree it would have drafted, as plain lists {"tokens", "parents", "expected"}; None when there is none."""
        if len(self.tokens) < 2:
            return None
        return {"tokens": list(self.tokens), "parents": list(self.parents), "expected": list(self.expected)}


@dataclass(frozen=True)
class Draft:
    """One step's draft tree on the device: node 0 is the root (the last committed token)."""
    name: str  # the template (or drafter) name, for events
    tokens: torch.Tensor  # [N] long, token id of every node
    parents: torch.Tensor  # [N] long, parent index (root: 0), < own index
    depths: torch.Tensor  # [N] long, 0 for the root
    ranks: torch.Tensor  # [N] long, candidate rank in the parent's matrix row (root: 0)
    tree_mask: torch.Tensor  # [N, N] bool, [i, j] = node j is node i or one of its ancestors
    size: int  # N, known on the host
    levels: int  # an upper bound on depth + 1, known on the host (sampling noise is drawn per level)
    node_probs: torch.Tensor | None = None  # [N] float, estimated probability of reaching each node, if known
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # per-node tensors the drafter wants back
    sources: tuple[str, ...] | None = None  # host-known: where each node's token came from ("matrix", "context", ...)
    origins: tuple[dict | None, ...] | None = None  # host-known: per node, where a copied token came from (None: not)
    no_draft: NoDraft | None = None  # a root-alone draft of a drafter that could have drafted: why it did not


@dataclass(frozen=True)
class StepResult:
    """What verification decided, on the host: handed to the drafter's `observe`."""
    parents: list[int]  # parent of every node (root: -1)
    accepted: list[int]  # node indices of the accepted path, root first
    emitted: list[int]  # the tokens the step committed (accepted drafts, then the bonus)
    forward_tokens: int  # N, the tokens of the step's forward
    forward_ms: float  # its measured time
    step_ms: float  # the step's time up to the commit (draft, forward, verify, update, sync, commit)
    extras: dict[str, list[float]]  # the drafter's `Draft.extras` and `lookahead` tensors, synced
    forwarded: bool = True  # False: the prompt's forward verified it (an answer's first step), no step cost to learn


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may use when an answer begins."""
    prompt: list[int]  # the prompt's token ids
    cfg: DecodeConfig  # the answer's settings
    matrix: AdjacencyMatrix  # the engine's adjacency matrix
    runner: Any  # tr_core.runner.ModelRunner, to measure forward costs
    answer_start: int = -1  # the matrix clock at this answer's start: rows stamped before it were written earlier


class Drafter:
    """The seam, with do-nothing defaults: a drafter overrides `draft` and whichever of the rest it needs."""
    recycles = False  # True: every step's logits are recycled into the adjacency matrix
    seeds_prompt = False  # prompt seeding's default when DecodeConfig.prompt_seeding is None
    max_depth = 0  # the deepest draft it can propose (host-known)
    cap: int | None = None  # most draft nodes its next step may take, set by a batch sizing its trees (batch.py)

    def begin(self, ctx: DraftContext) -> None:
        """Start an answer."""

    def times_forwards(self, cfg: DecodeConfig) -> bool:
        """True when `begin` will first time forwards of every size on this device (seconds on a CPU)."""
        return False

    def draft(self, root: torch.Tensor, matrix: AdjacencyMatrix) -> Draft:
        """The draft tree under `root` ([1] long)."""
        raise NotImplementedError

    def lookahead(self, bonus: torch.Tensor, matrix: AdjacencyMatrix) -> dict[str, torch.Tensor]:
        """Device work after verification (the bonus token [1] is known there); returns tensors to sync."""
        return {}

    def observe(self, result: StepResult) -> None:
        """Learn from the verified step."""

    def next_curve(self) -> list[float] | None:
        """Expected accepted tokens of the next step's best m nodes, m = 0.. (None: not sized by cost; batch.py)."""
        return None


def _draft_of(tree: DraftTree, tokens: torch.Tensor) -> Draft:
    return Draft(name=tree.name, tokens=tokens, parents=tree.parents, depths=tree.depths, ranks=tree.ranks,
                 tree_mask=tree.tree_mask, size=tree.size, levels=tree.max_depth + 1)


class PlainDrafter(Drafter):
    """Plain decoding through the same harness: a one-node tree, nothing recycled."""

    def __init__(self, device: torch.device) -> None:
        self.tree = tree_from_parents("plain", [-1], [-1], device)

    def draft(self, root: torch.Tensor, matrix: AdjacencyMatrix) -> Draft:
        return _draft_of(self.tree, root.view(1))


class StaticTreeDrafter(Drafter):
    """A fixed template (the paper's "2.2.2" and others), filled by BFS over the adjacency matrix (Sec. 3.2). Nodes
    under a never-written row are left out with their subtrees; which live rides the step's one sync (`lookahead`)."""
    recycles = True

    def __init__(self, tree: DraftTree) -> None:
        self.tree = tree
        self.max_depth = tree.max_depth
        self.ahead: tuple[torch.Tensor, list[int]] | None = None  # the next step's tokens and live nodes (lookahead)
        self._shapes: dict[tuple[int, ...], tuple[torch.Tensor, ...]] = {}  # pruned shapes, built once each

    def begin(self, ctx: DraftContext) -> None:
        self.ahead = None

    def draft(self, root: torch.Tensor, matrix: AdjacencyMatrix) -> Draft:
        """The template's live nodes filled with candidates, one gather per level."""
        if self.ahead is not None:
            (tokens, keep), self.ahead = self.ahead, None
        else:
            tokens = bfs_draft(matrix.table, root, self.tree)
            keep = live_nodes(matrix.filled, tokens, self.tree).nonzero().view(-1).tolist()  # an answer's first step
        if len(keep) == self.tree.size:
            return _draft_of(self.tree, tokens)
        if len(keep) == 1:
            return replace(_draft_of(chain_tree(1, self.tree.parents.device), tokens[:1]), name=self.tree.name,
                           no_draft=NoDraft("empty row"))
        return self._pruned(tokens, keep)

    def _pruned(self, tokens: torch.Tensor, keep: list[int]) -> Draft:
        """The draft of the template's nodes `keep` (the root first, BFS order), each with its template rank."""
        key = tuple(keep)
        if key not in self._shapes:
            if len(self._shapes) >= 256:  # a long session sees few distinct shapes; bound them anyway
                self._shapes.clear()
            index = torch.tensor(keep, dtype=torch.long, device=tokens.device)
            new = {old: i for i, old in enumerate(keep)}
            parents = torch.tensor([0] + [new[self.tree.parents_list[i]] for i in keep[1:]], device=tokens.device)
            self._shapes[key] = (index, parents, self.tree.depths[index], self.tree.ranks[index],
                                 self.tree.tree_mask[index][:, index])
        index, parents, depths, ranks, mask = self._shapes[key]
        return Draft(name=self.tree.name, tokens=tokens[index], parents=parents, depths=depths, ranks=ranks,
                     tree_mask=mask, size=len(keep), levels=self.tree.max_depth + 1)

    def lookahead(self, bonus: torch.Tensor, matrix: AdjacencyMatrix) -> dict[str, torch.Tensor]:
        """The next step's tokens (from the bonus token, the matrix as updated) and which nodes live: to the sync."""
        tokens = bfs_draft(matrix.table, bonus, self.tree)
        self.ahead = (tokens, [])
        return {"live": live_nodes(matrix.filled, tokens, self.tree)}

    def observe(self, result: StepResult) -> None:
        """Take the synced live nodes of the next step's tree."""
        live = result.extras.get("live")
        if self.ahead is not None and live is not None:
            self.ahead = (self.ahead[0], [i for i, alive in enumerate(live) if alive])
        else:
            self.ahead = None
