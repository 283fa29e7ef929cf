"""Provenance for the microscope, opt-in (`DecodeConfig.provenance`): which step wrote each drafted candidate, and
the rows a step read or rewrote as they were BEFORE its rewrite (Sec. 3.3). Without the flag none of it is gathered
or synced, and the event's provenance fields stay empty."""
from __future__ import annotations

from typing import Any

import torch

from .drafters import Draft
from .events import EVENT_DIGITS
from .matrix import AdjacencyMatrix

_STORED = [round(q / 255, EVENT_DIGITS) for q in range(256)]  # a stored probability (1/255 steps) as events show it


def gather(matrix: AdjacencyMatrix, draft: Draft) -> dict[str, torch.Tensor]:
    """The step's provenance tensors for its sync, read before the matrix update: every node's candidate stamp and
    probability (`origin_*`, [N]; none for the root alone) and its row as it is now (`rows_read`, [N, k]), each cell
    id * 256 + stored probability in a float64: half the sync of ids and probabilities apart, and exact (< 2^53)."""
    parts: dict[str, torch.Tensor] = {}
    if draft.size > 1:  # the root alone has no origin to show
        parts["origin_stamps"], parts["origin_probs"] = matrix.origins(draft.tokens, draft.parents, draft.ranks)
    parts["rows_read"] = matrix.table[draft.tokens].double() * 256 + matrix.probs[draft.tokens]
    return parts


def event_fields(host: dict[str, list], sources: tuple[str, ...] | None, written_rows: list[int], k: int,
                 origin_of: Any) -> dict[str, Any]:
    """The event's provenance fields from a recycling step's synced `gather` (`written_rows`: the rows the step
    rewrote; `origin_of(stamp)` -> [answer, step], `MatrixClock.origin_of`)."""
    written, probs = [[-1, -1]], [0.0]  # the root and tokens copied from the context have no writer
    for i in range(1, len(host.get("origin_stamps", ()))):
        copied = sources is not None and i < len(sources) and sources[i] == "context"
        written.append([-1, -1] if copied else origin_of(host["origin_stamps"][i]))
        probs.append(0.0 if copied else round(host["origin_probs"][i], EVENT_DIGITS))
    return {"written": written, "candidate_probs": probs, **recorded_rows(host, sources, written_rows, k)}


def recorded_rows(host: dict[str, list], sources: tuple[str, ...] | None, written: list[int],
                  k: int) -> dict[str, list]:
    """`rows_read*` (the parent of every node not copied from the context, each row once, in parent order) and
    `rows_before*` (the rows it wrote, `written`, that it did not read) as they were before the step; nothing when
    the step synced no rows."""
    packed = host.get("rows_read")
    if packed is None:
        return {}
    tokens, parents = host["tokens"], host["parents"]
    node_of: dict[int, int] = {}
    for node, token in enumerate(tokens):  # nodes of one token share its row: the first one's
        node_of.setdefault(token, node)
    readers = sorted({parents[i] for i in range(1, len(tokens)) if sources is None or sources[i] != "context"})
    read = dict.fromkeys(tokens[node] for node in readers)  # ordered, each once
    out: dict[str, list] = {}
    for name, rows in (("rows_read", list(read)), ("rows_before", [row for row in written if row not in read])):
        cells = [[divmod(int(c), 256) for c in packed[node_of[row] * k : (node_of[row] + 1) * k]] for row in rows]
        out.update({name: rows, f"{name}_values": [[token for token, _ in row] for row in cells],
                    f"{name}_probs": [[_STORED[q] for _, q in row] for row in cells]})  # (id, stored probability)
    return out
