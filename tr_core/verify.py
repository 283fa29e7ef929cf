"""Verification (paper Sec. 3.2): which drafted path the model agrees with, and what a step then emits."""
from __future__ import annotations

import torch


def verify_tree(tokens: torch.Tensor, targets: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                tree_mask: torch.Tensor) -> torch.Tensor:
    """The end of the accepted path (node index [], 0 = nothing accepted): the deepest node that, as every ancestor,
    equals the model's choice at its parent. tokens, targets, parents, depths: [N] long; tree_mask: [N, N] ancestry.
    Siblings hold distinct candidates, so at most one child matches: this equals walking the tree from the root."""
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
    """(emitted, "eos" | "length" | None): the accepted drafts, then the bonus, cut after a stop token or at `room`."""
    emitted: list[int] = []
    for token in [*path_tokens, bonus]:
        emitted.append(token)
        if token in stop_ids:
            return emitted, "eos"
        if len(emitted) >= room:
            return emitted, "length"
    return emitted, None
