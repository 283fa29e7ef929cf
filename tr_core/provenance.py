"""Provenance for the microscope, opt-in (`DecodeConfig.provenance`): which step wrote each drafted candidate, and
the rows a step read or rewrote as they were BEFORE its rewrite (Sec. 3.3). `gather` adds them to the step's one host
sync, `event_fields` makes the event's `written`, `candidate_probs`, `rows_read*` and `rows_before*` of them. Without
the flag none of it is gathered or synced, and those fields stay empty.
"""
from __future__ import annotations

from typing import Any

import torch

from .drafters import Draft
from .events import EVENT_DIGITS
from .matrix import AdjacencyMatrix

_STORED = [round(q / 255, EVENT_DIGITS) for q in range(256)]  # a stored probability (1/255 steps) as events show it


def gather(matrix: AdjacencyMatrix, draft: Draft) -> dict[str, torch.Tensor]:
    """The step's provenance tensors for the sync, read before the matrix update: every node's candidate stamp and
    probability (`origin_*`, [N]; none for the root alone) and every node's row packed (`rows_read`, [N * k])."""
    parts: dict[str, torch.Tensor] = {}
    if draft.size > 1:  # the root alone has no origin to show
        parts["origin_stamps"], parts["origin_probs"] = matrix.origins(draft.tokens, draft.parents, draft.ranks)
    parts["rows_read"] = packed_rows(matrix, draft.tokens)
    return parts


def packed_rows(matrix: AdjacencyMatrix, tokens: torch.Tensor) -> torch.Tensor:
    """The matrix row of every node's token as it is now, each cell id * 256 + stored probability (0..255) in a
    float64 ([N, k]): half the sync of ids and probabilities apart, exact (< 2^39 < 2^53), and no Python ints."""
    return matrix.table[tokens].double() * 256 + matrix.probs[tokens]


def event_fields(host: dict[str, list], sources: tuple[str, ...] | None, written_rows: list[int], k: int,
                 origin_of: Any) -> dict[str, Any]:
    """The event's provenance fields from a recycling step's synced `gather` (`written_rows`: the rows the step
    rewrote; `origin_of(stamp)` -> [answer, step], `MatrixClock.origin_of`)."""
    written, probs = node_origins(host, sources, origin_of)
    return {"written": written, "candidate_probs": probs, **recorded_rows(host, sources, written_rows, k)}


def node_origins(host: dict[str, list], sources: tuple[str, ...] | None,
                 origin_of: Any) -> tuple[list[list[int]], list[float]]:
    """Per node: [answer, step] of the step whose logits wrote its candidate (step -1: that answer's prompt
    seeding; [-1, -1]: the root, a token copied from the context, or unknown) and the candidate's probability
    then."""
    if "origin_stamps" not in host:  # it drafted nothing: the root alone
        return [[-1, -1]], [0.0]
    sources = sources or ()
    written, probs = [[-1, -1]], [0.0]
    for i in range(1, len(host["origin_stamps"])):
        from_matrix = i >= len(sources) or sources[i] != "context"
        written.append(origin_of(host["origin_stamps"][i]) if from_matrix else [-1, -1])
        probs.append(round(host["origin_probs"][i], EVENT_DIGITS) if from_matrix else 0.0)
    return written, probs


def recorded_rows(host: dict[str, list], sources: tuple[str, ...] | None, written: list[int],
                  k: int) -> dict[str, list]:
    """The event's rows as they were before the step, from its `packed_rows`: `rows_read*` (the parent of every node
    not copied from the context, each row once, in parent order) and `rows_before*` (the rows it wrote, `written`,
    that it did not read). Nothing when the step synced no rows."""
    packed = host.get("rows_read")
    if packed is None:
        return {}
    tokens, parents = host["tokens"], host["parents"]
    node_of: dict[int, int] = {}
    for node, token in enumerate(tokens):  # nodes of one token share its row: the first one's
        node_of.setdefault(token, node)
    readers = sorted({parents[i] for i in range(1, len(tokens)) if sources is None or sources[i] != "context"})
    read = list(dict.fromkeys(tokens[node] for node in readers))
    was_read = set(read)
    out: dict[str, list] = {}
    for name, rows in (("rows_read", read), ("rows_before", [row for row in written if row not in was_read])):
        cells = [[divmod(int(c), 256) for c in packed[node_of[row] * k : (node_of[row] + 1) * k]] for row in rows]
        out.update({name: rows, f"{name}_values": [[token for token, _ in row] for row in cells],
                    f"{name}_probs": [[_STORED[q] for _, q in row] for row in cells]})  # (id, stored probability)
    return out
