"""What a step's event says of each node of its draft tree: its group (root, accepted, past the answer's end,
rejected), where its token came from (the matrix, the context or both) and which step wrote it, and its hover text."""
from __future__ import annotations

import html

from typing import Any

from tr_core.context import LIBRARY
from tr_core.events import StepEvent
from .reasons import origin_text
from .style import TokenText


def kept_drafts(ev: StepEvent) -> int:
    """How many of the accepted path's drafts the answer kept: all of them, unless its end (an end-of-turn token or
    the length limit) came inside the path, which then has no bonus token either."""
    return min(len(ev.emitted) - (ev.bonus is not None), len(ev.accepted) - 1)


def node_group(ev: StepEvent) -> list[str]:
    """Each node's group: "root", "accepted" (a draft the answer kept), "past end" (accepted past the answer's
    end) or "rejected"."""
    groups = ["rejected"] * len(ev.tokens)
    kept = kept_drafts(ev)
    for rank, i in enumerate(ev.accepted):
        groups[i] = "root" if rank == 0 else "accepted" if rank <= kept else "past end"
    groups[0] = "root"
    return groups


def node_groups(ev: StepEvent) -> dict[str, list[int]]:
    """The tree's nodes by trace, in drawing order: rejected drafts, the root, the accepted path's drafts (those
    the answer kept, then those past its end)."""
    groups = node_group(ev)
    return {"rejected": [i for i in range(1, len(ev.tokens)) if groups[i] == "rejected"], "root": [0],
            "accepted": [i for i in ev.accepted if groups[i] == "accepted"],
            "past end": [i for i in ev.accepted if groups[i] == "past end"]}


def node_source(ev: StepEvent, i: int) -> str | None:
    """Where node i's token came from ("root", "matrix", "context" or "both"); None when the step does not say."""
    return ev.sources[i] if ev.sources is not None and i < len(ev.sources) else None


def draft_sources(ev: StepEvent) -> list[str]:
    """Where this step's drafts came from, of "matrix", "context", "both" in that order (a step that does not
    say: the matrix)."""
    present = {node_source(ev, i) or "matrix" for i in range(1, len(ev.tokens))}
    return [source for source in ("matrix", "context", "both") if source in present]


LEARNED = "the sample answers learned beforehand"  # the answers the matrix starts from (tr_core.warm), in plain
# words (present/glossary.py explains them)


def copy_place(ev: StepEvent, nodes) -> str:
    """Where these copied nodes were found, in words: "the conversation", LEARNED (a run of the answers the matrix
    was learned on beforehand, tr_core.warm) or both."""
    return place_of([node_origin(ev, i) for i in nodes])


def node_origin(ev: StepEvent, i: int) -> dict[str, Any] | None:
    """Where node i's token was copied from (StepEvent.origins); None when it was not, or the step does not say."""
    return ev.origins[i] if ev.origins is not None and i < len(ev.origins) else None


def place_of(origins: list[dict[str, Any] | None]) -> str:
    """`copy_place` from the copied nodes' origins (StepEvent.origins)."""
    shipped = [origin is not None and origin["where"] == LIBRARY for origin in origins]
    if not any(shipped):
        return "the conversation"
    return LEARNED if all(shipped) else f"the conversation and {LEARNED}"


def has_retrieved(ev: StepEvent) -> bool:
    """Whether some draft token of the step was retrieved from the context (alone or agreeing with the matrix)."""
    return ev.sources is not None and any(s in ("context", "both") for s in ev.sources)


def node_hover(ev: StepEvent, i: int, token_text: TokenText) -> str:
    """A node's hover text: token, id, depth, and its rank or where it came from; all model text escaped."""
    head = f"<b>{html.escape(repr(token_text(ev.tokens[i])))}</b><br>id {ev.tokens[i]} · depth {ev.depths[i]}"
    source = node_source(ev, i)
    if ev.ranks[i] < 0:
        head += " · root"
    elif source is None and ev.written is None:
        head += f" · rank {ev.ranks[i]}"
    elif source is None:
        head += "<br>" + source_text(ev, i, "matrix", token_text)
    else:
        head += "<br>" + source_text(ev, i, source, token_text)
    prob = f"<br>p(reach) ≈ {ev.node_probs[i]:.2f}" if ev.node_probs and i < len(ev.node_probs) else ""
    return f"{head}<br>node {i}, parent {ev.parents[i]}{prob}"


def provenance_text(ev: StepEvent, i: int, token_text: TokenText) -> str | None:
    """Plain text (callers escape it): which step's logits wrote node i's candidate, e.g. "recycled from step 12,
    where it was candidate #2 after '␣a' (p = 0.18)"; None when the event does not record it."""
    if ev.written is None or i >= len(ev.written) or i == 0:
        return None
    answer, step = ev.written[i]
    after = repr(token_text(ev.tokens[ev.parents[i]]))
    prob = ev.candidate_probs[i] if ev.candidate_probs is not None and i < len(ev.candidate_probs) else None
    where = "" if answer == ev.answer else f" of answer {answer + 1}" if answer >= 0 else ""
    if step >= 0:
        p = f" (p = {prob:.2f})" if prob is not None else ""
        return f"recycled from step {step + 1}{where}, where it was candidate #{ev.ranks[i]} after {after}{p}"
    if answer >= 0:
        return f"seeded from the prompt{where}: it followed {after} there"
    if ev.tokens[i] == 0 and not prob:
        return f"an empty matrix row: nothing learned after {after} yet"
    return f"candidate #{ev.ranks[i]} after {after}, written before this session's record (a loaded matrix)"


def source_text(ev: StepEvent, i: int, source: str, token_text: TokenText) -> str:
    """Where a draft token came from: its matrix row and rank, or the place in the context it was copied from."""
    recycled = provenance_text(ev, i, token_text)
    if source not in ("context", "both"):
        if recycled is not None:
            return html.escape(recycled)
        after = html.escape(repr(token_text(ev.tokens[ev.parents[i]])))
        return f"from the matrix: candidate #{ev.ranks[i]} after {after}"
    text = html.escape(origin_text(node_origin(ev, i)) or "copied from the context")
    if source == "both":
        text += (f"<br>and the matrix (candidate #{ev.ranks[i]})" if recycled is None
                 else "<br>and the matrix: " + html.escape(recycled))
    return text

