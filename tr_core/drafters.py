"""The drafter seam (in the spirit of transformers' CandidateGenerator): what proposes the tree each step.

A drafter turns the last committed token into a `Draft` (the tree's tokens and shape on the device), may do
device work right after verification whose results ride along in the step's one host sync (`lookahead`),
and learns from the verified step (`observe`). The engine never branches on the kind of drafter:
plain decoding, the paper's static templates and the adaptive tree are three classes behind one protocol;
a new drafter is one new class.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from .config import DecodeConfig
from .matrix import AdjacencyMatrix
from .tree import DraftTree, bfs_draft, tree_from_parents


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
    origins: tuple[str, ...] | None = None  # host-known: per node, where a retrieved token was found ("" if not)


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


class Drafter(Protocol):
    """Proposes each step's draft tree and learns from its verification."""

    recycles: bool  # True: every step's logits are recycled into the adjacency matrix
    seeds_prompt: bool  # prompt seeding's default when DecodeConfig.prompt_seeding is None
    max_depth: int  # the deepest draft it can propose (host-known)

    def begin(self, ctx: DraftContext) -> None:
        """Start an answer."""

    def times_forwards(self, cfg: DecodeConfig) -> bool:
        """True when `begin` will first time forwards of every size on this device (seconds on a CPU)."""

    def draft(self, root: torch.Tensor, matrix: AdjacencyMatrix) -> Draft:
        """The draft tree under `root` ([1] long)."""

    def lookahead(self, bonus: torch.Tensor, matrix: AdjacencyMatrix) -> dict[str, torch.Tensor]:
        """Device work after verification (the bonus token [1] is known there); returns tensors to sync."""

    def observe(self, result: StepResult) -> None:
        """Learn from the verified step."""


def _draft_of(tree: DraftTree, tokens: torch.Tensor) -> Draft:
    return Draft(name=tree.name, tokens=tokens, parents=tree.parents, depths=tree.depths, ranks=tree.ranks,
                 tree_mask=tree.tree_mask, size=tree.size, levels=tree.max_depth + 1)


class PlainDrafter:
    """Plain decoding through the same harness: a one-node tree, nothing recycled."""

    recycles = False
    seeds_prompt = False
    max_depth = 0

    def __init__(self, device: torch.device) -> None:
        self.tree = tree_from_parents("plain", [-1], [-1], device)

    def begin(self, ctx: DraftContext) -> None:
        """Nothing to prepare."""

    def times_forwards(self, cfg: DecodeConfig) -> bool:
        """Never: nothing is sized by cost."""
        return False

    def draft(self, root: torch.Tensor, matrix: AdjacencyMatrix) -> Draft:
        """The root alone."""
        return _draft_of(self.tree, root.view(1))

    def lookahead(self, bonus: torch.Tensor, matrix: AdjacencyMatrix) -> dict[str, torch.Tensor]:
        """Nothing to prepare."""
        return {}

    def observe(self, result: StepResult) -> None:
        """Nothing to learn."""


class StaticTreeDrafter(PlainDrafter):
    """A fixed template (the paper's "2.2.2" and others), filled by BFS over the adjacency matrix (Sec. 3.2)."""

    recycles = True

    def __init__(self, tree: DraftTree) -> None:
        self.tree = tree
        self.max_depth = tree.max_depth

    def draft(self, root: torch.Tensor, matrix: AdjacencyMatrix) -> Draft:
        """The template's nodes filled with candidates, one gather per level."""
        return _draft_of(self.tree, bfs_draft(matrix.table, root, self.tree))
