"""Figures of the studio, built from plain-data step events: draft tree, adjacency-matrix window, charts.

Every builder is a pure function of events (plus a `token_text(id) -> str` lookup), so the live app, the
replay of a saved trace and the tests draw the same pictures from the same data.
"""
from __future__ import annotations

import html
import json
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable

import networkx as nx

from .events import StepEvent

TokenText = Callable[[int], str]

# Colours chosen for a projector: strong for what was accepted, muted for what was rejected.
ROOT_COLOUR = "#1e3a8a"
ACCEPTED_COLOUR = "#16a34a"
BONUS_COLOUR = "#f59e0b"
REJECTED_COLOUR = "#cbd5e1"
REJECTED_TEXT = "#64748b"
EDGE_COLOUR = "#cbd5e1"
# Candidate probability, light to dark blue (explicit: plotly.js and plotly.py disagree on "Blues").
PROB_SCALE = [[0.0, "#f7fbff"], [0.2, "#deebf7"], [0.4, "#9ecae1"], [0.6, "#4292c6"], [0.8, "#2171b5"], [1.0, "#08306b"]]
# Soft background colours that alternate between the accepted runs of consecutive steps in the chat.
RUN_CLASSES = ("tr-run-a", "tr-run-b")


def display_token(text: str, max_len: int = 10) -> str:
    """Make a token string visible in a label: spaces as '␣', newlines as '↵', tabs as '⇥', cut to max_len."""
    shown = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    if shown == "":
        shown = "∅"
    shown = shown if len(shown) <= max_len else shown[: max_len - 1] + "…"
    return html.escape(shown, quote=False)  # plotly renders a subset of HTML in labels: show tokens as text


# --------------------------------------------------------------------------------------------- draft tree


@dataclass(frozen=True)
class TreeLayout:
    """Positions of a draft tree's nodes: root at the top (y = 0), depth d at y = -d, x in [0, 1]."""

    x: tuple[float, ...]
    y: tuple[float, ...]


@lru_cache(maxsize=64)
def tree_layout(parents: tuple[int, ...]) -> TreeLayout:
    """Layered layout of a tree given by parent indices (root: -1), computed once per tree shape.

    Nodes of one depth are spread evenly over the width in depth-first order, so children sit under
    their parents' side of the tree and no two edges cross.
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(parents)))
    graph.add_edges_from((p, i) for i, p in enumerate(parents) if p >= 0)
    depth = nx.shortest_path_length(graph, 0)
    order = {node: i for i, node in enumerate(nx.dfs_preorder_nodes(graph, 0, sort_neighbors=sorted))}
    levels: dict[int, list[int]] = {}
    for node in sorted(graph.nodes, key=lambda n: order.get(n, n)):
        levels.setdefault(depth.get(node, 0), []).append(node)
    x = [0.5] * len(parents)
    y = [0.0] * len(parents)
    for d, members in levels.items():
        for i, node in enumerate(members):
            x[node] = (i + 0.5) / len(members)
            y[node] = -float(d)
    return TreeLayout(tuple(x), tuple(y))


# Where a draft token came from (StepEvent.sources), shown as the marker's symbol; colour keeps accepted/rejected.
SOURCE_SYMBOLS = {"root": "circle", "matrix": "circle", "context": "square", "both": "diamond"}
SOURCE_NAMES = {"matrix": "● from the matrix", "context": "■ copied from the context", "both": "◆ both agree"}
NODE_GROUPS = {  # the tree's node traces, drawn in this order (accepted on top)
    "rejected": dict(color=REJECTED_COLOUR, size=11, text=REJECTED_TEXT, name="rejected draft tokens"),
    "root": dict(color=ROOT_COLOUR, size=24, text=ROOT_COLOUR, name="root (last committed token)"),
    "accepted": dict(color=ACCEPTED_COLOUR, size=22, text="#14532d", name="accepted draft tokens"),
}


def tree_figure(ev: StepEvent | None, token_text: TokenText, height: int = 430) -> Figure:
    """The draft tree of one step: accepted path green, bonus token amber star, rejected nodes muted.

    Hover shows token id, depth and candidate rank, or (hybrid trees) where the token came from: the adjacency
    matrix (circle), the context (square) or both (diamond). The layout depends only on the tree's shape.
    """
    fig = Figure.empty(height)
    if ev is None or not ev.tokens:
        return fig.note("The draft tree of each step appears here")
    layout = tree_layout(tuple(ev.parents))
    _add_edges(fig, ev, layout)
    retrieved = _has_retrieved(ev)
    accepted = set(ev.accepted)
    groups = {"rejected": [i for i in range(1, len(ev.tokens)) if i not in accepted], "root": [0],
              "accepted": [i for i in ev.accepted if i != 0]}
    for group, nodes in groups.items():
        _add_nodes(fig, ev, layout, token_text, group, nodes, legend_only_by_source=retrieved)
    if retrieved:
        _add_source_legend(fig, ev)
    if ev.bonus is not None:
        _add_bonus(fig, ev, layout, token_text)
    depth = max(ev.depths) if ev.depths else 0
    fig.layout["yaxis"]["range"] = [-depth - 0.9, 0.6]
    fig.layout["xaxis"]["range"] = [-0.08, 1.03]
    n_acc = len(ev.accepted) - 1 if ev.accepted else 0
    fig.title(f"Step {ev.step + 1}: {len(ev.tokens) - 1} draft tokens → {n_acc} accepted + "
              f"{1 if ev.bonus is not None else 0} bonus")
    return fig


def node_source(ev: StepEvent, i: int) -> str | None:
    """Where node i's token came from ("root", "matrix", "context" or "both"); None when the step does not say."""
    return ev.sources[i] if ev.sources is not None and i < len(ev.sources) else None


def _has_retrieved(ev: StepEvent) -> bool:
    """Whether some draft token of the step was retrieved from the context (alone or agreeing with the matrix)."""
    return ev.sources is not None and any(s in ("context", "both") for s in ev.sources)


def _add_edges(fig: Figure, ev: StepEvent, layout: TreeLayout) -> None:
    """Edges: one trace for muted edges, one for the accepted path (None separates segments)."""
    accepted = set(ev.accepted)
    for on_path in (False, True):
        ex: list[float | None] = []
        ey: list[float | None] = []
        for i in range(1, len(ev.tokens)):
            p = ev.parents[i]
            if (i in accepted and p in accepted) == on_path:
                ex += [layout.x[p], layout.x[i], None]
                ey += [layout.y[p], layout.y[i], None]
        fig.add(type="scatter", x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
                line=dict(color=ACCEPTED_COLOUR if on_path else EDGE_COLOUR, width=4 if on_path else 1))


def _add_nodes(fig: Figure, ev: StepEvent, layout: TreeLayout, token_text: TokenText, group: str, nodes: list[int],
               legend_only_by_source: bool = False) -> None:
    """One node trace (root, accepted or rejected): colour by the group, symbol by where each token came from.

    With retrieved tokens the trace's own legend icon would take its first node's symbol, so a plain circle of the
    group's colour stands in for it in the legend (same legend group: clicking it still hides the nodes).
    """
    style = NODE_GROUPS[group]
    muted = group == "rejected"
    symbol: str | list[str] = "circle"
    if ev.sources is not None:
        symbol = [SOURCE_SYMBOLS.get(node_source(ev, i) or "matrix", "circle") for i in nodes]
    fig.add(type="scatter", x=[layout.x[i] for i in nodes], y=[layout.y[i] for i in nodes], mode="markers+text",
            name=style["name"],  # (labels of big markers padded so that the marker does not cover them)
            text=[display_token(token_text(ev.tokens[i]), 6 if muted else 8) + ("" if muted else "   ") for i in nodes],
            textposition="bottom center" if muted else "middle left",
            textfont=dict(size=10 if muted else 15, color=style["text"]),
            marker=dict(color=style["color"], size=style["size"], symbol=symbol, line=dict(color="white", width=1.5)),
            hovertext=[_node_hover(ev, i, token_text) for i in nodes], hoverinfo="text", customdata=nodes)
    if legend_only_by_source:
        fig.traces[-1].update(legendgroup=group, showlegend=False)
        fig.add(type="scatter", x=[None], y=[None], mode="markers", name=style["name"], legendgroup=group,
                hoverinfo="skip", marker=dict(color=style["color"], size=12, symbol="circle"))


def _node_hover(ev: StepEvent, i: int, token_text: TokenText) -> str:
    """A node's hover text: token, id, depth, and its rank or where it came from; all model text escaped."""
    head = f"<b>{html.escape(repr(token_text(ev.tokens[i])))}</b><br>id {ev.tokens[i]} · depth {ev.depths[i]}"
    source = node_source(ev, i)
    if ev.ranks[i] < 0:
        head += " · root"
    elif source is None:
        head += f" · rank {ev.ranks[i]}"
    else:
        head += "<br>" + _source_text(ev, i, source, token_text)
    prob = f"<br>p(reach) ≈ {ev.node_probs[i]:.2f}" if ev.node_probs and i < len(ev.node_probs) else ""
    return f"{head}<br>node {i}, parent {ev.parents[i]}{prob}"


def _source_text(ev: StepEvent, i: int, source: str, token_text: TokenText) -> str:
    """Where a draft token came from: its matrix row and rank, or the place in the context it was copied from."""
    if source not in ("context", "both"):
        after = html.escape(repr(token_text(ev.tokens[ev.parents[i]])))
        return f"from the matrix: candidate #{ev.ranks[i]} after {after}"
    origin = ev.origins[i] if ev.origins is not None and i < len(ev.origins) else ""
    text = html.escape(origin or "copied from the context")
    return text + (f"<br>and the matrix (candidate #{ev.ranks[i]})" if source == "both" else "")


def _add_source_legend(fig: Figure, ev: StepEvent) -> None:
    """Legend entries for the marker symbols of the sources this step's draft tokens came from."""
    present = set(ev.sources[1:])
    for source, name in SOURCE_NAMES.items():
        if source in present:
            fig.add(type="scatter", x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                    marker=dict(color=REJECTED_TEXT, size=12, symbol=SOURCE_SYMBOLS[source]))


def _add_bonus(fig: "Figure", ev: StepEvent, layout: TreeLayout, token_text: TokenText) -> None:
    """The bonus token: an amber star under the end of the accepted path, joined by a dotted edge."""
    last = ev.accepted[-1] if ev.accepted else 0
    bx, by = layout.x[last], layout.y[last] - 0.55
    fig.add(type="scatter", x=[layout.x[last], bx], y=[layout.y[last], by], mode="lines", hoverinfo="skip",
            showlegend=False, line=dict(color=BONUS_COLOUR, width=3, dash="dot"))
    fig.add(type="scatter", x=[bx], y=[by], mode="markers+text", name="bonus token (from the verify forward)",
            text=[display_token(token_text(ev.bonus), 10)], textposition="middle right",
            textfont=dict(size=15, color="#92400e"),
            marker=dict(color=BONUS_COLOUR, size=24, symbol="star", line=dict(color="white", width=1)),
            hovertext=[f"<b>bonus</b> {html.escape(repr(token_text(ev.bonus)))}<br>id {ev.bonus}"], hoverinfo="text")


# ----------------------------------------------------------------------------------- adjacency matrix


@dataclass
class MatrixTracker:
    """Latest known rows of the adjacency matrix and how often each row was used, accumulated from events.

    `hits[row]` counts the steps in which a candidate of that row was accepted (its token was the parent
    of an accepted draft token): the rows that made decoding faster.
    """

    values: dict[int, list[int]] = field(default_factory=dict)
    probs: dict[int, list[float]] = field(default_factory=dict)
    hits: Counter = field(default_factory=Counter)
    writes: Counter = field(default_factory=Counter)

    def update(self, ev: StepEvent) -> None:
        """Fold one step into the tracker: its accepted rows' hits and the rows it rewrote."""
        for i in ev.accepted[1:]:
            if node_source(ev, i) != "context":  # a token copied from the context is no candidate of the row
                self.hits[ev.tokens[ev.parents[i]]] += 1
        for j, row in enumerate(ev.matrix_rows):
            self.values[row] = list(ev.matrix_values[j])
            if j < len(ev.matrix_probs):
                self.probs[row] = list(ev.matrix_probs[j])
            self.writes[row] += 1

    def window(self, ev: StepEvent | None, max_rows: int = 12, step_rows: int = 6) -> list[int]:
        """Rows to show: those of this step's accepted path (rewritten now), then the most-hit rows."""
        rows: list[int] = []
        if ev is not None:
            touched = set(ev.matrix_rows)
            for tok in [ev.tokens[i] for i in ev.accepted] + list(ev.matrix_rows):
                if tok in touched and tok in self.values and tok not in rows:
                    rows.append(tok)
                if len(rows) >= step_rows:
                    break
        for row, _ in self.hits.most_common():
            if len(rows) >= max_rows:
                break
            if row in self.values and row not in rows:
                rows.append(row)
        return rows


def unique_labels(rows: list[int], token_text: TokenText, max_len: int = 12) -> list[str]:
    """Row labels from token strings, made unique by appending the token id where two look the same."""
    shown = [display_token(token_text(r), max_len) for r in rows]
    counts = Counter(shown)
    return [f"{s} #{r}" if counts[s] > 1 else s for s, r in zip(shown, rows)]


def heatmap_figure(tracker: MatrixTracker, ev: StepEvent | None, token_text: TokenText,
                   max_rows: int = 12, height: int = 430) -> Figure:
    """A window of the adjacency matrix: rows = tokens, columns = candidate rank, colour = candidate probability."""
    fig = Figure.empty(height)
    rows = tracker.window(ev, max_rows=max_rows)
    if not rows:
        return fig.note("Rows of the adjacency matrix appear here")
    touched = set(ev.matrix_rows) if ev is not None else set()
    k = max(len(tracker.values[r]) for r in rows)
    labels = unique_labels(rows, token_text)
    labels = [("● " if r in touched else "") + lab for lab, r in zip(labels, rows)]
    z, text, hover = [], [], []
    for r in rows:
        vals = tracker.values[r] + [None] * (k - len(tracker.values[r]))
        probs = tracker.probs.get(r, [])
        z.append([probs[j] if j < len(probs) else None for j in range(k)])
        text.append([display_token(token_text(v), 8) if v is not None else "" for v in vals])
        hover.append([
            (f"row {html.escape(repr(token_text(r)))} (id {r}) → rank {j}: {html.escape(repr(token_text(v)))} (id {v})"
             + (f"<br>p = {probs[j]:.3f}" if j < len(probs) else "")
             + f"<br>hits {tracker.hits[r]}, rewrites {tracker.writes[r]}")
            if v is not None else "" for j, v in enumerate(vals)])
    # Reversed so that the first row is drawn at the top.
    fig.add(type="heatmap", z=z[::-1], x=[f"#{j}" for j in range(k)], y=labels[::-1], text=text[::-1],
            texttemplate="%{text}", textfont=dict(size=13), hovertext=hover[::-1], hoverinfo="text",
            colorscale=PROB_SCALE, zmin=0.0, zmax=1.0, xgap=2, ygap=2,
            colorbar=dict(title=dict(text="p", side="right"), thickness=12, len=0.8))
    fig.title("Adjacency matrix window (● = rewritten this step)")
    fig.layout["margin"] = dict(l=10, r=10, t=44, b=40)
    fig.layout["xaxis"] = dict(visible=True, showgrid=False, side="bottom", tickfont=dict(size=12), type="category",
                               title=dict(text="candidate rank", font=dict(size=12)))
    fig.layout["yaxis"] = dict(visible=True, showgrid=False, tickfont=dict(size=14, family="monospace"), automargin=True)
    return fig


# ------------------------------------------------------------------------------------------- charts


def accepted_chart(events: list[StepEvent], current: int | None = None, height: int = 220) -> Figure:
    """Tokens emitted per step (accepted draft tokens + bonus) as bars, the selected step highlighted."""
    fig = Figure.empty(height)
    lengths = [len(e.emitted) for e in events]
    if not lengths:
        return fig.note("Tokens per step")
    colours = [BONUS_COLOUR if current is not None and i == current else ACCEPTED_COLOUR for i in range(len(lengths))]
    fig.add(type="bar", x=list(range(1, len(lengths) + 1)), y=lengths, marker=dict(color=colours), showlegend=False,
            hovertemplate="step %{x}: %{y} tokens<extra></extra>")
    mean = sum(lengths) / len(lengths)
    fig.layout["shapes"] = [dict(type="line", xref="paper", x0=0, x1=1, y0=mean, y1=mean,
                                 line=dict(color=ROOT_COLOUR, dash="dash", width=2))]
    fig.layout["annotations"] = [dict(text=f"mean {mean:.2f} tokens/step", xref="paper", x=0.01, y=mean,
                                      yanchor="bottom", xanchor="left", showarrow=False,
                                      font=dict(size=13, color=ROOT_COLOUR))]
    fig.layout["xaxis"] = dict(visible=True, showgrid=False, title=dict(text="step", font=dict(size=12)))
    fig.layout["yaxis"] = dict(visible=True, showgrid=True, gridcolor="#eef2f7", rangemode="tozero", dtick=1,
                               title=dict(text="tokens", font=dict(size=12)))
    fig.layout["margin"] = dict(l=50, r=10, t=16, b=40)
    fig.layout["bargap"] = 0.15
    return fig


class Figure(dict):
    """A plotly figure as plain JSON data: {"data": [trace dicts], "layout": {...}}.

    Building plotly.graph_objects figures validates every property in Python (tens of ms per figure, holding
    the GIL the engine thread needs); these dicts cost well under a millisecond. gr.Plot accepts any object
    with `to_json()`; `to_plotly()` gives a real plotly Figure when wanted.
    """

    @classmethod
    def empty(cls, height: int) -> "Figure":
        """A blank white figure of a given height, axes hidden."""
        return cls(data=[], layout=dict(
            height=height, margin=dict(l=10, r=10, t=44, b=10), paper_bgcolor="white", plot_bgcolor="white",
            font=dict(size=14, color="#1f2937"), hoverlabel=dict(font=dict(size=14)), uirevision="keep",
            legend=dict(orientation="h", yanchor="top", y=0.0, x=0.0, font=dict(size=12)),
            xaxis=dict(visible=False), yaxis=dict(visible=False)))

    @property
    def traces(self) -> list[dict]:
        """The traces (plotly `data`)."""
        return self["data"]

    @property
    def layout(self) -> dict:
        """The plotly `layout`."""
        return self["layout"]

    def add(self, **trace: Any) -> "Figure":
        """Append a trace given as plotly attributes (type=..., x=..., ...)."""
        self["data"].append(trace)
        return self

    def title(self, text: str) -> "Figure":
        """Set the title."""
        self["layout"]["title"] = dict(text=text, x=0.01, font=dict(size=17))
        return self

    def note(self, text: str) -> "Figure":
        """Show a grey placeholder message in the middle."""
        self["layout"]["annotations"] = [dict(text=text, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper",
                                              font=dict(size=16, color=REJECTED_TEXT))]
        return self

    def to_json(self) -> str:
        """Compact JSON, as gr.Plot sends it to plotly.js."""
        return json.dumps(self, separators=(",", ":"))

    def to_plotly(self):
        """The same figure as a plotly.graph_objects.Figure (validated; slow, for notebooks and tests)."""
        import plotly.graph_objects as go

        return go.Figure(self)


# ------------------------------------------------------------------------------------ speed and text


@dataclass
class MeterView:
    """What the speedup meter shows; every number comes from engine-side timings (UI time excluded)."""

    state: str = "idle"  # idle | live (answering) | measuring | measured | noisy | off (not compared)
    tr_tps: float | None = None  # Token Recycling tokens/s
    plain_tps: float | None = None  # plain decoding tokens/s over the same tokens (measured, never estimated)
    mean_accepted: float | None = None  # tokens per step, bonus included
    ratio: float | None = None  # plain time / Token Recycling time (states measured and noisy)
    error: float | None = None  # one standard error of the ratio
    identical: bool | None = None  # both outputs token-identical (None = not compared)
    note: str = ""  # one line under the figures: where the numbers come from, or why there is no ratio


PARITY = 0.05  # ratios within 5% of 1 (or whose error bar crosses 1) are shown as parity, not as a speedup


def ratio_class(ratio: float, error: float = 0.0) -> str:
    """The meter's colour by meaning: 'up' (speedup), 'par' (no clear difference) or 'down' (slowdown)."""
    if ratio - error > 1.0 and ratio >= 1.0 + PARITY:
        return "up"
    if ratio + error < 1.0 and ratio <= 1.0 - PARITY:
        return "down"
    return "par"


def _ratio_parts(v: MeterView) -> tuple[str, str, str]:
    """(ratio text, its colour class, its label) for the meter's big line."""
    if v.state == "measured" and v.ratio is not None:
        err = f" ± {v.error:.2f}" if v.error is not None else ""
        verb = {"up": "faster than plain decoding", "down": "slower than plain decoding",
                "par": "about as fast as plain decoding"}[ratio_class(v.ratio, v.error or 0.0)]
        return f"{v.ratio:.2f}×{err}", ratio_class(v.ratio, v.error or 0.0), f"measured: {verb}"
    if v.state == "noisy":
        return "too noisy to measure", "none", "speedup not shown"
    if v.state in ("live", "measuring"):
        return "…", "none", "speedup: measured right after the answer" if v.state == "live" else "measuring speedup…"
    if v.state == "off":
        return "—", "none", "speedup not measured"
    return "—", "none", "speedup"


def meter_html(v: MeterView) -> str:
    """The speedup meter as HTML: the ratio with its uncertainty (or why none), both speeds, mean accepted."""
    def num(x: float | None, fmt: str = "{:.1f}") -> str:
        return fmt.format(x) if x is not None else "—"

    ratio_text, cls, label = _ratio_parts(v)
    if v.identical is None:
        flag = '<span class="tr-flag tr-flag-none">outputs not compared</span>'
    elif v.identical:
        flag = '<span class="tr-flag tr-flag-ok">✓ token-identical to plain decoding</span>'
    else:
        flag = '<span class="tr-flag tr-flag-bad">✗ outputs differ from plain decoding</span>'
    live = ' <span class="tr-live">live</span>' if v.state == "live" else ""
    note = f'<div class="tr-note">{html.escape(v.note)}</div>' if v.note else ""
    return (
        f'<div class="tr-meter tr-meter-{cls}" id="tr-meter">'
        f'<div class="tr-big"><span class="tr-ratio tr-ratio-{cls}" id="tr-ratio">{html.escape(ratio_text)}</span>'
        f'<span class="tr-biglabel">{html.escape(label)}{live}</span></div>'
        '<div class="tr-cells">'
        f'<div class="tr-cell"><span class="tr-val" id="tr-tps">{num(v.tr_tps)}</span><span class="tr-lab">Token Recycling tok/s</span></div>'
        f'<div class="tr-cell"><span class="tr-val" id="tr-plain">{num(v.plain_tps)}</span><span class="tr-lab">plain tok/s (same tokens)</span></div>'
        f'<div class="tr-cell"><span class="tr-val" id="tr-mat">{num(v.mean_accepted, "{:.2f}")}</span><span class="tr-lab">mean accepted tokens/step</span></div>'
        f'</div>{flag}{note}</div>'
    )


def _code_zones(text: str) -> list[tuple[int, int]]:
    """Character ranges of fenced code blocks (``` or ~~~) and inline code spans, where no HTML may go."""
    zones: list[tuple[int, int]] = []
    pos, n = 0, len(text)
    in_fence, fence_start, fence = False, 0, ""
    while pos < n:
        line_end = text.find("\n", pos)
        line_end = n if line_end < 0 else line_end + 1
        stripped = text[pos:line_end].lstrip()
        if in_fence:
            if stripped.startswith(fence):
                zones.append((fence_start, line_end))
                in_fence = False
        elif stripped.startswith("```") or stripped.startswith("~~~"):
            in_fence, fence_start, fence = True, pos, stripped[:3]
        else:
            i = pos
            while i < line_end:
                if text[i] == "`":
                    run = len(text[i:line_end]) - len(text[i:line_end].lstrip("`"))
                    close = text.find("`" * run, i + run, line_end)
                    end = close + run if close >= 0 else line_end
                    zones.append((i, end))
                    i = end
                else:
                    i += 1
        pos = line_end
    if in_fence:
        zones.append((fence_start, n))  # an open fence while streaming: keep it plain
    return zones


_BLOCK_MARKERS = ("#", "-", "*", "+", ">", "|", "=")


def safe_markdown(text: str) -> str:
    """Untrusted text (a message, a model's answer, a trace) as markdown that can hold no live HTML or images."""
    return coloured_markdown(text, [len(text)], colour=False)


def _inert(text: str) -> str:
    """Escape HTML and disarm markdown images/links (`![..](..)`, `[..](..)`) in text outside code."""
    return html.escape(text, quote=False).replace("[", "&#91;")


def coloured_markdown(text: str, boundaries: list[int], colour: bool = True) -> str:
    """Wrap each step's run of text in alternating soft-coloured spans, leaving markdown structure intact.

    `boundaries[i]` is the end offset of step i's text. Spans never enter code (fenced or inline), never
    cross a line break, and never cover a line's leading block marker, so lists, headings, tables and code
    render as they would without colour. Text outside spans keeps its markdown; '<', '&' and '[' are escaped,
    so the text can carry no live HTML and no images (it may come from a visitor, a model or a shared trace).
    colour=False: the same escaping, no spans.
    """
    zones = _code_zones(text)
    in_code = [False] * (len(text) + 1)
    for a, b in zones:
        for i in range(a, min(b, len(text))):
            in_code[i] = True
    out: list[str] = []
    start = 0
    for step, end in enumerate(boundaries):
        end = min(end, len(text))
        if end <= start:
            continue
        cls = RUN_CLASSES[step % 2]
        i = start
        while i < end:
            j = i
            plain = in_code[i]
            while j < end and in_code[j] == plain and text[j] != "\n":
                j += 1
            if j == i:  # a newline
                out.append(text[i])
                i += 1
                continue
            piece = text[i:j]
            if plain:
                out.append(piece)
            else:
                line_start = i == 0 or text[i - 1] == "\n"
                lead = ""
                if line_start:
                    stripped = piece.lstrip()
                    lead_len = len(piece) - len(stripped)
                    marker = ""
                    if stripped[:1] in _BLOCK_MARKERS:
                        head = stripped.split(" ", 1)[0]
                        if head == stripped[0] * len(head):  # a run of one marker character: '-', '##', '>', '==='
                            marker = head + (" " if " " in stripped else "")
                    elif stripped[:1].isdigit():
                        head = stripped.split(" ", 1)[0]
                        if head.rstrip(".)").isdigit() and head[-1:] in ".)":
                            marker = head + (" " if " " in stripped else "")
                    lead = piece[: lead_len + len(marker)]
                    piece = piece[lead_len + len(marker):]
                body = _inert(piece)
                out.append(lead + (f'<span class="{cls}">{body}</span>' if piece.strip() and colour else body))
            i = j
        start = end
    out.append(_inert(text[start:]) if start < len(text) else "")
    return "".join(out)
