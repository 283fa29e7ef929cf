"""Verification (paper Sec. 3.2): which drafted path the model agrees with, and what a step then emits.

Pure functions of the tree and the model's choices, shared by the engine's step and the tests.
"""
from __future__ import annotations

import torch


def verify_tree(tokens: torch.Tensor, targets: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                tree_mask: torch.Tensor) -> torch.Tensor:
    """The deepest node whose whole path agrees with the model: the end of the accepted path.

    tokens, targets, parents, depths: [N] long; tree_mask: [N, N] bool ancestry. A node is accepted when it and
    every ancestor equal the model's choice at their parent. Siblings hold distinct candidates, so at most one
    child can match: this equals walking the tree from the root. Returns the node index [] (0 = nothing accepted).
    """
    if tokens.shape[0] == 1:  # the root alone (a plain or zero-draft step): nothing to walk
        return torch.zeros((), dtype=torch.long, device=tokens.device)
    ok = tokens == targets[parents]  # [N]; ok[i]: node i is what the model chose after its parent
    ok[0] = True
    accepted = ~(tree_mask & ~ok[None, :]).any(dim=1)  # [N]
    return torch.argmax(torch.where(accepted, depths, -1))  # first of the deepest: deterministic


def path_to(parents: list[int] | tuple[int, ...], node: int) -> list[int]:
    """Node indices from the root down to `node`."""
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


def accept_tokens(path_tokens: list[int], bonus: int, stop_ids: set[int], room: int) -> tuple[list[int], str | None]:
    """The tokens a step emits: the accepted drafts, then the bonus, cut after an end-of-turn token or at `room`.

    Returns (emitted, "eos" | "length" | None).
    """
    emitted: list[int] = []
    for token in [*path_tokens, bonus]:
        emitted.append(token)
        if token in stop_ids:
            return emitted, "eos"
        if len(emitted) >= room:
            return emitted, "length"
    return emitted, None
