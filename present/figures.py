"""Figures of the studio, built from plain-data step events: draft tree, adjacency-matrix window, charts.

Every builder is a pure function of events (plus a `token_text(id) -> str` lookup), so the live app, the
replay of a saved trace and the tests draw the same pictures from the same data.
"""
from __future__ import annotations

import html
import json
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Callable, NamedTuple

import networkx as nx

from tr_core.context import LIBRARY
from tr_core.events import StepEvent
from tr_core.token_text import BYTES_CLOSE, BYTES_OPEN

TokenText = Callable[[int], str]

# Colours chosen for a projector: strong for what was accepted, muted for what was rejected.
ROOT_COLOUR = "#1e3a8a"
ACCEPTED_COLOUR = "#16a34a"
BONUS_COLOUR = "#f59e0b"
REJECTED_COLOUR = "#cbd5e1"
PAST_END_COLOUR = "#86efac"  # accepted drafts the answer did not keep: its end (a stop token, the limit) came first
REJECTED_TEXT = "#64748b"
SHAPE_LEGEND = "#1e293b"  # the outlined shapes of the source legend (where a draft came from)
EDGE_COLOUR = "#cbd5e1"
# Candidate probability, light to dark blue (explicit: plotly.js and plotly.py disagree on "Blues").
PROB_SCALE = [[0.0, "#f7fbff"], [0.2, "#deebf7"], [0.4, "#9ecae1"], [0.6, "#4292c6"], [0.8, "#2171b5"], [1.0, "#08306b"]]
# Soft background colours that alternate between the accepted runs of consecutive steps in the chat.
RUN_CLASSES = ("tr-run-a", "tr-run-b")
CURRENT_RUN_CLASS = "tr-run-current"  # the run of the step shown by the replay (outlined in the chat)


def visible_token(text: str, max_len: int = 10) -> str:
    """A token string as a label shows it (not HTML-escaped yet): spaces '␣', newlines '↵', tabs '⇥', cut to max_len."""
    shown = text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "")
    if shown == "":
        shown = "∅"
    return shown if len(shown) <= max_len else shown[: max_len - 1] + "…"


def node_label(text: str, max_len: int) -> str:
    """A tree node's label (not HTML-escaped yet): visible_token, and a lone punctuation mark in curly quotes (a ','
    was a speck a lecture hall could not see, '_' read as the space sign; straight quotes would triple an
    apostrophe)."""
    shown = visible_token(text, max_len)
    return f"“{shown}”" if len(shown) == 1 and not shown.isalnum() and shown not in "␣↵⇥∅" else shown


def display_token(text: str, max_len: int = 10) -> str:
    """Make a token string visible in a label: spaces as '␣', newlines as '↵', tabs as '⇥', cut to max_len."""
    return html.escape(visible_token(text, max_len), quote=False)  # plotly renders a subset of HTML: show text


# --------------------------------------------------------------------------------------------- draft tree


@dataclass(frozen=True)
class TreeLayout:
    """Positions of a draft tree's nodes: root at the top (y = 0), depth d at y = -d, x in [0, 1]."""

    x: tuple[float, ...]
    y: tuple[float, ...]


LONE_X = (0.25, 0.75)  # a node alone at its depth stays near these x (a run under an edge node steps in once)
LONE_SLACK = 0.07  # ... within this much of them it hangs straight under its parent (a small bend crowds labels)


def _stepped_in(parent_x: float) -> float:
    """The x of a node alone at its depth: under its parent, or at LONE_X if its parent is far outside it."""
    if parent_x > LONE_X[1] + LONE_SLACK:
        return LONE_X[1]
    if parent_x < LONE_X[0] - LONE_SLACK:
        return LONE_X[0]
    return parent_x


@lru_cache(maxsize=64)
def tree_layout(parents: tuple[int, ...], ranks: tuple[int, ...] | None = None) -> TreeLayout:
    """Layered layout of a tree given by parent indices (root: -1), computed once per tree shape.

    Each leaf of the tree owns an equal slot of the width, so a subtree owns a band as wide as its leaves; children
    divide their parent's band in candidate-rank order (`ranks`, else node index: candidate #0 leftmost,
    context-only drafts of hybrid trees, rank >= k, after the matrix's candidates) and a node stands over the
    middle of its band. So a node's children sit under it, no two edges cross, and two nodes of one depth are at
    least a slot apart. A node alone at its depth stands under its parent (or steps toward LONE_X, where its label
    has room on either side, _stepped_in): a long copied run hangs straight down from where it starts. Every node
    under it is its descendant, so its band is the whole width again.
    """
    n = len(parents)
    graph = nx.DiGraph()
    graph.add_nodes_from(range(n))
    graph.add_edges_from((p, i) for i, p in enumerate(parents) if p >= 0)
    depth = nx.shortest_path_length(graph, 0)
    order = list(nx.bfs_tree(graph, 0))  # parents before children
    key = (lambda c: (ranks[c], c)) if ranks is not None else (lambda c: c)
    children = {i: sorted(graph.successors(i), key=key) for i in order}
    per_depth = Counter(depth.values())
    leaves = [0] * n
    for i in reversed(order):
        leaves[i] = leaves[i] or 1  # a leaf counts itself; an inner node, its subtree's leaves (added below)
        if parents[i] >= 0:
            leaves[parents[i]] += leaves[i]
    x, y = [0.5] * n, [0.0] * n
    bands = {0: (0.0, 1.0)}
    for i in order:
        a, b = bands[i]
        lone = i != 0 and per_depth[depth[i]] == 1
        x[i] = _stepped_in(x[parents[i]]) if lone else (a + b) / 2
        if lone:  # every deeper node is its descendant: they may have the whole width
            a, b = 0.0, 1.0
        y[i] = -float(depth[i])
        pos = a
        for c in children[i]:
            width = (b - a) * leaves[c] / leaves[i]
            bands[c], pos = (pos, pos + width), pos + width
    return TreeLayout(tuple(x), tuple(y))


# Where a draft token came from (StepEvent.sources), shown as the marker's symbol; colour keeps accepted/rejected.
SOURCE_SYMBOLS = {"root": "circle", "matrix": "circle", "context": "square", "both": "diamond"}
SOURCE_NAMES = {"matrix": "from the matrix", "context": "copied from the context",
                "both": "matrix + context"}  # the
# legend draws each with its marker symbol (SOURCE_SYMBOLS) in front
MIN_FONT = 16  # px: no text in the tree or the heatmap is smaller, so a lecture hall's back row can read it
NODE_GROUPS = {  # the tree's node traces, drawn in this order (accepted on top); size: marker px, font: label px
    "rejected": dict(color=REJECTED_COLOUR, size=12, font=MIN_FONT, text=REJECTED_TEXT, name="rejected drafts"),
    "root": dict(color=ROOT_COLOUR, size=24, font=MIN_FONT, text=ROOT_COLOUR, name="root (last committed token)"),
    "accepted": dict(color=ACCEPTED_COLOUR, size=22, font=MIN_FONT, text="#14532d", name="accepted drafts"),
    "past end": dict(color=PAST_END_COLOUR, size=22, font=MIN_FONT, text="#15803d",
                     name="accepted, past the answer's end (not kept)"),
    "bonus": dict(color=BONUS_COLOUR, size=24, font=MIN_FONT, text="#92400e", name="bonus token"),
}
LABEL_LEN = {"rejected": 6, "root": 8, "accepted": 8, "past end": 8, "bonus": 10}  # characters shown before the cut '…'
LABEL_POSITIONS = {  # where a node's label may go around its marker (plotly textposition), preferred first
    "rejected": ("bottom center",),
    "root": ("middle left", "middle right", "top center"),
    "accepted": ("middle left", "middle right", "top center", "bottom center"),
    "past end": ("middle left", "middle right", "top center", "bottom center"),
    "bonus": ("middle right", "middle left", "bottom center"),
}
LARGE_TREE = 24  # nodes: a tree larger than this labels only its accepted path, the bonus and FEW_LABELS drafts
FEW_LABELS = 8  # rejected drafts labelled in a large tree (the likeliest first); the others show on hover
BONUS_NODE = -1  # LabelBox.node of the bonus token's label (the bonus is no tree node)
SYMBOL_NOTES = {"␣": "␣ = space", "↵": "↵ = new line", "⇥": "⇥ = tab", "∅": "∅ = empty token",  # a note explains
                BYTES_OPEN: f"{BYTES_OPEN}e4{BYTES_CLOSE} = a byte of a split character"}  # those shown
# Label boxes are estimated, not measured: plotly.js lays text out in the browser.
CHAR_EM = 0.6  # width of a character in font sizes (sans-serif average); capitals 0.72, '␣' 0.7, WIDE_SYMBOLS 1
WIDE_SYMBOLS = "↵⇥∅…●■◆"
LINE_EM = 1.2  # height of a one-line label in font sizes
DESCENT_EM = 0.22  # of which below the baseline
LABEL_GAP_PX = 2.0  # clearance between labels, markers and the plot area's edges, for the estimate's error
LEGEND_ROW_PX = 25  # height of a row of the horizontal legend (font MIN_FONT; plotly.js: 1.3 lines + 3 px)
STACKED_ROW_PX = 25  # ... and of an entry of the legend stacked in a corner of a deep tree's plot
LEGEND_PAD_PX = 4  # the legend box's border padding
ROOMY_LEVEL_PX = 26  # px between depths from which a tree keeps its legend under the plot
MIN_MARKER = 9  # px: the smallest marker of a deep tree's nodes
BEAD_GAP_PX = 8  # px left between the markers of two levels, where the edge joining them shows
STAR_GAP_PX = 6  # px between the bonus star and the last accepted node, where the dotted edge shows
LEGEND_CHAR_EM = 0.5  # width of a legend character in font sizes (its lowercase text: measured 0.44 in Chromium)
TREE_HEIGHT = 400  # px of the tree's figure (the presentation view gives it a 400 px cell of a 720 px screen)
TREE_WIDTH = 640  # assumed width of the tree's plot in px (the studio lets it fill its column; wider is safe)


class LabelBox(NamedTuple):
    """A label the tree figure draws: its box in px from the figure's top-left corner, node, position, text."""

    x0: float
    y0: float
    x1: float
    y1: float
    node: int  # tree node index, or BONUS_NODE
    position: str  # plotly textposition around the node's marker
    text: str  # the label as drawn (HTML-escaped)


@dataclass(frozen=True)
class PlotFrame:
    """Where plotly draws the tree: figure size, margins (left, right, top, bottom) and axis ranges, in px/data."""

    width: int
    height: int
    margin: tuple[int, int, int, int]
    x_range: tuple[float, float]
    y_range: tuple[float, float]
    legend: str = "below"  # where the legend goes: under the plot, or inside it in its "left" or "right" corner
    legend_box: tuple[float, ...] | None = None  # px box of a legend inside the plot (kept free of labels)

    @property
    def level_px(self) -> float:
        """Px between two depths of the tree (one y unit)."""
        return (self.height - self.margin[2] - self.margin[3]) / (self.y_range[1] - self.y_range[0])

    def marker_size(self, group: str) -> float:
        """A node group's marker px in this frame (marker_px)."""
        return marker_px(group, self.level_px)

    def px(self, x: float, y: float) -> tuple[float, float]:
        """Data coordinates -> px from the figure's top-left corner (y grows downward)."""
        left, right, top, bottom = self.margin
        (x0, x1), (y0, y1) = self.x_range, self.y_range
        return (left + (x - x0) / (x1 - x0) * (self.width - left - right),
                top + (y1 - y) / (y1 - y0) * (self.height - top - bottom))

    def inside(self, box: tuple[float, ...]) -> bool:
        """Whether a box lies in the plot area (plotly clips text outside it)."""
        left, right, top, bottom = self.margin
        return box[0] >= left and box[1] >= top and box[2] <= self.width - right and box[3] <= self.height - bottom


def marker_px(group: str, level_px: float) -> float:
    """A node group's marker px: NODE_GROUPS' size, smaller where levels are `level_px` apart and closer than that
    (a deep tree), so that a long run reads as a chain of beads rather than one bar; never under MIN_MARKER."""
    return min(NODE_GROUPS[group]["size"], max(MIN_MARKER, level_px - BEAD_GAP_PX))


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


def tree_legend_names(ev: StepEvent) -> list[str]:
    """The legend entries tree_figure shows for a step, in order (their rows set the figure's bottom margin)."""
    names = [NODE_GROUPS[g]["name"] for g, nodes in node_groups(ev).items() if nodes]  # none for a kind not shown
    if _has_retrieved(ev):
        names += [name for source, name in SOURCE_NAMES.items() if source in set(ev.sources[1:])]
    return names + ([NODE_GROUPS["bonus"]["name"]] if ev.bonus is not None else [])


def tree_frame(ev: StepEvent, width: int = TREE_WIDTH, height: int = TREE_HEIGHT) -> PlotFrame:
    """The tree figure's geometry: margins that hold the title and the legend, ranges that hold every node.

    The legend goes under the plot; a deep tree (levels closer than ROOMY_LEVEL_PX) takes that room for its levels
    when the legend, stacked, fits in a bottom corner of the plot that no node or edge reaches (a long copied run
    hangs down one side, leaving the other corner empty)."""
    names = tree_legend_names(ev)
    depth = max(ev.depths) if ev.depths else 0
    x_range = (-0.08, 1.03)
    bottom = 14 + legend_height(names, width - 20, grouped=_has_retrieved(ev))
    below = PlotFrame(width, height, (10, 10, 44, bottom), x_range, _y_range(depth, height - 44 - bottom))
    if below.level_px >= ROOMY_LEVEL_PX or not ev.tokens:
        return below
    inside = PlotFrame(width, height, (10, 10, 44, 14), x_range, _y_range(depth, height - 44 - 14))
    layout = tree_layout(tuple(ev.parents), tuple(ev.ranks))
    markers = [m for m, _ in _marker_boxes(ev, layout, inside)]  # the bonus star's too
    edges = [(*inside.px(layout.x[p], layout.y[p]), *inside.px(layout.x[i], layout.y[i]))
             for i, p in enumerate(ev.parents) if p >= 0]
    for corner in ("left", "right"):  # a corner no marker and no edge comes into
        box = stacked_legend_box(names, inside, corner)
        if not any(boxes_overlap(box, m, LABEL_GAP_PX) for m in markers) and \
                not any(segment_crosses(box, seg) for seg in edges):
            return replace(inside, legend=corner, legend_box=box)
    return below


def _y_range(depth: int, plot_px: float) -> tuple[float, float]:
    """The y axis range of a tree `depth` levels deep in a plot `plot_px` tall: 0.6 levels over the root and 0.9
    under the deepest level, or more where levels are close, so that the root's label and a bonus label beside a
    star under the deepest node (bonus_drop) stay inside the plot."""
    # a middle label's top, 0.73 of a font size above its marker's centre (_label_box), as a share of the plot
    half = ((LINE_EM - DESCENT_EM - 0.25) * MIN_FONT + LABEL_GAP_PX) / max(plot_px, 1.0)
    top, under = 0.6, 0.9
    for _ in range(8):  # a fixed point: the pads grow with the levels they make closer (half << 1: it converges)
        levels = top + depth + under
        top, under = max(0.6, half * levels), max(0.9, bonus_drop(plot_px / levels) + half * levels)
    return -depth - under, top


def stacked_legend_box(names: list[str], frame: PlotFrame, corner: str) -> tuple[float, ...]:
    """The px box of the legend stacked one entry a row (font MIN_FONT) in a bottom corner of the plot area."""
    left, right, top, bottom = frame.margin
    w = 40 + LEGEND_CHAR_EM * MIN_FONT * max(len(name) for name in names) + 2 * LEGEND_PAD_PX
    h = len(names) * STACKED_ROW_PX + 2 * LEGEND_PAD_PX
    x0 = left if corner == "left" else frame.width - right - w
    return x0, frame.height - bottom - h, x0 + w, frame.height - bottom


def legend_height(names: list[str], plot_width: float, grouped: bool = False) -> int:
    """Estimated px height of a horizontal legend (font MIN_FONT) under a plot, laid out as plotly.js does
    (legend/draw.js): entries in one row if they fit, else a grid of the widest entry; with legend groups, rows
    that wrap entry by entry, 10 px apart. Plotly widens the margin if the legend needs more: labels would move."""
    widths = [40 + text_width(name, MIN_FONT) for name in names]  # symbol and gap, then the text
    if not widths:
        return 0
    if grouped:
        rows, used = 1, 0.0
        for w in widths:
            rows, used = (rows + 1, w + 5) if used and used + w + 5 > plot_width else (rows, used + w + 5)
        return rows * LEGEND_ROW_PX + (rows - 1) * 10 + 10
    if sum(widths) + 5 * (len(widths) - 1) < plot_width:
        return LEGEND_ROW_PX + 10
    per_row = max(1, int((plot_width + 5) // max(widths)))
    return -(-len(widths) // per_row) * LEGEND_ROW_PX + 10


def text_width(text: str, size: float) -> float:
    """Estimated width in px of one line of text at a font size (px)."""
    def em(c: str) -> float:
        if c in WIDE_SYMBOLS or unicodedata.east_asian_width(c) in "WF":
            return 1.0
        return 0.72 if c.isupper() else 0.7 if c == "␣" else CHAR_EM

    return size * sum(em(c) for c in text)


BONUS_DROP = 0.55  # levels from the end of the accepted path down to the bonus star


def star_clear_px(level_px: float) -> float:
    """Px between the bonus star's centre and the last accepted node's that keep STAR_GAP_PX between their markers
    (both sized for levels `level_px` apart, marker_px)."""
    return (marker_px("bonus", level_px) + marker_px("accepted", level_px)) / 2 + STAR_GAP_PX


def bonus_drop(level_px: float) -> float:
    """Levels from the end of the accepted path down to the bonus star: BONUS_DROP, or as far as keeps the star
    clear of that node's marker where the levels are close (a deep tree's smaller markers, PlotFrame.marker_size)."""
    return max(BONUS_DROP, star_clear_px(level_px) / max(level_px, 1.0))


def _bonus_xy(ev: StepEvent, layout: TreeLayout, frame: PlotFrame) -> tuple[float, float]:
    """Where the bonus star sits: under the end of the accepted path, clear of its marker (bonus_drop). Where that
    node is not the deepest and the levels are close, the star goes BONUS_DROP down and aside toward the middle
    instead, rather than onto a draft below."""
    last = ev.accepted[-1] if ev.accepted else 0
    x, y, drop = layout.x[last], layout.y[last], bonus_drop(frame.level_px)
    if drop == BONUS_DROP or ev.depths[last] == max(ev.depths):
        return x, y - drop
    clear = star_clear_px(frame.level_px)
    x_per_px = (frame.x_range[1] - frame.x_range[0]) / (frame.width - frame.margin[0] - frame.margin[1])
    return x + (1 if x <= 0.5 else -1) * clear * x_per_px, y - BONUS_DROP


def _label_wishes(ev: StepEvent, layout: TreeLayout, token_text: TokenText,
                  frame: PlotFrame) -> list[tuple[int, str, float, float, str]]:
    """Every label the tree could show as (node, group, x, y, visible text), most important first: the root,
    the accepted path, the bonus; then the rejected drafts, likeliest first (by the probability of reaching the
    node where the step has one, else by depth and candidate rank)."""
    def wish(i: int, group: str, length: str | None = None) -> tuple[int, str, float, float, str]:
        return i, group, layout.x[i], layout.y[i], node_label(token_text(ev.tokens[i]), LABEL_LEN[length or group])

    accepted, groups = set(ev.accepted), node_group(ev)
    wishes = [wish(0, "root")] + [wish(i, groups[i]) for i in ev.accepted if i != 0]
    if ev.bonus is not None:
        bonus = node_label(token_text(ev.bonus), LABEL_LEN["bonus"])
        wishes.append((BONUS_NODE, "bonus", *_bonus_xy(ev, layout, frame), bonus))
    probs = ev.node_probs if ev.node_probs and len(ev.node_probs) == len(ev.tokens) else None
    rest = sorted((i for i in range(1, len(ev.tokens)) if i not in accepted),
                  key=lambda i: (-probs[i] if probs else 0.0, ev.depths[i], ev.ranks[i], i))
    # a rejected draft's label as long as an accepted one's where it has room (_place_labels cuts it if not)
    return wishes + [wish(i, "rejected", length="accepted") for i in rest]


def _label_box(frame: PlotFrame, x: float, y: float, text: str, group: str, position: str) -> tuple[float, ...]:
    """The px box of a label at a plotly textposition around its marker. As plotly.js does it
    (Drawing.textPointPosition): text starts r = marker size / 2 / 0.8 + 1 px from the marker's centre, and its
    baseline sits 0.75 font sizes below the anchor, less half a line when centred and a line when on top."""
    cx, cy = frame.px(x, y)
    size = NODE_GROUPS[group]["font"]
    w, r = text_width(text, size), frame.marker_size(group) / 2 / 0.8 + 1
    side = -1 if position.startswith("top") else 1 if position.startswith("bottom") else 0
    baseline = cy + 0.75 * size + side * r + (side - 1) * size / 2
    y0, y1 = baseline - (LINE_EM - DESCENT_EM) * size, baseline + DESCENT_EM * size
    if position == "middle left":
        return cx - r - w, y0, cx - r, y1
    if position == "middle right":
        return cx + r, y0, cx + r + w, y1
    return cx - w / 2, y0, cx + w / 2, y1  # top or bottom center


def _marker_boxes(ev: StepEvent, layout: TreeLayout, frame: PlotFrame) -> list[tuple[tuple[float, ...], int]]:
    """The px box of every marker (the bonus star's too) with its node, for labels to keep clear of."""
    groups = node_group(ev)
    spots = [(layout.x[i], layout.y[i], groups[i], i) for i in range(len(ev.tokens))]
    if ev.bonus is not None:
        spots.append((*_bonus_xy(ev, layout, frame), "bonus", BONUS_NODE))
    boxes = []
    for x, y, group, node in spots:
        (cx, cy), half = frame.px(x, y), frame.marker_size(group) / 2
        boxes.append(((cx - half, cy - half, cx + half, cy + half), node))
    return boxes


def boxes_overlap(a: tuple[float, ...], b: tuple[float, ...], gap: float = 0.0) -> bool:
    """Whether two boxes (x0, y0, x1, y1) come closer than `gap` px in both directions."""
    return a[0] < b[2] + gap and b[0] < a[2] + gap and a[1] < b[3] + gap and b[1] < a[3] + gap


def _path_segments(ev: StepEvent, layout: TreeLayout, frame: PlotFrame) -> list[tuple[float, ...]]:
    """The px segments (x0, y0, x1, y1) of the accepted path's edges, drawn thick over everything near them."""
    return [(*frame.px(layout.x[ev.parents[i]], layout.y[ev.parents[i]]), *frame.px(layout.x[i], layout.y[i]))
            for i in ev.accepted if i != 0]


def segment_crosses(box: tuple[float, ...], seg: tuple[float, ...]) -> bool:
    """Whether a line segment passes through a box (x0, y0, x1, y1): the segment clipped to the box (Liang-Barsky)
    keeps some part."""
    x0, y0, x1, y1 = seg
    if max(x0, x1) < box[0] or min(x0, x1) > box[2] or max(y0, y1) < box[1] or min(y0, y1) > box[3]:
        return False  # most label boxes lie nowhere near the path
    lo, hi = 0.0, 1.0
    for delta, start, low, high in ((x1 - x0, x0, box[0], box[2]), (y1 - y0, y0, box[1], box[3])):
        if delta == 0:
            continue  # parallel to these sides, and within them (the bounding boxes overlap)
        t0, t1 = sorted(((low - start) / delta, (high - start) / delta))
        lo, hi = max(lo, t0), min(hi, t1)
    return lo <= hi


NOTE_CORNERS = ("top right", "top left", "bottom right", "bottom left")  # where the symbol legend may go, in order


def _symbol_note_box(frame: PlotFrame, note: str, corner: str = NOTE_CORNERS[0]) -> tuple[float, ...]:
    """The px box of the symbol legend ('␣ = space') in a corner of the plot area (kept free of labels)."""
    left, right, top, bottom = frame.margin
    w, h = text_width(note, MIN_FONT) + 4, LINE_EM * MIN_FONT + 4
    x1 = frame.width - right if corner.endswith("right") else left + w
    y0 = top if corner.startswith("top") else frame.height - bottom - h
    return x1 - w, y0, x1, y0 + h


def symbol_note(texts: list[str]) -> str:
    """'␣ = space · ↵ = new line' for the symbols that occur in some of the texts ('' if none)."""
    return " · ".join(note for s, note in SYMBOL_NOTES.items() if any(s in t for t in texts))


class LabelScene(NamedTuple):
    """What label placement reads, whichever corner the symbol legend takes: computed once per figure."""

    wishes: list[tuple[int, str, float, float, str]]  # _label_wishes
    markers: list[tuple[tuple[float, ...], int]]  # _marker_boxes
    path: list[tuple[float, ...]]  # _path_segments
    note: str  # the symbol legend ('␣ = space'), '' when no wished label needs it


def _label_scene(ev: StepEvent, layout: TreeLayout, token_text: TokenText, frame: PlotFrame) -> LabelScene:
    """The labels wished, the markers and the accepted path's segments of a step's tree, and its symbol legend."""
    wishes = _label_wishes(ev, layout, token_text, frame)
    return LabelScene(wishes, _marker_boxes(ev, layout, frame), _path_segments(ev, layout, frame),
                      symbol_note([w[4] for w in wishes]))


def _place_labels(ev: StepEvent, token_text: TokenText, frame: PlotFrame, scene: LabelScene,
                  corner: str = NOTE_CORNERS[0]) -> tuple[list[LabelBox], int]:
    """(the labels, how many of the root's, the accepted path's and the bonus's had to cover a marker, cross the
    path or crowd another box), the symbol legend reserved in `corner`.

    Greedy label placement in priority order (see _label_wishes): each label takes the first of its positions
    that stays in the plot area clear of kept labels and of every marker. The root, the accepted path and the bonus
    are always labelled, at their least crowded position; after that a crossing of the accepted path and a covered
    marker of it weigh the same (preferring the crossing had a long copied run's labels cover the run's own
    markers, each pushing the next off its side). A rejected draft's label is as long as an accepted one's where
    it has room, else cut shorter; without room for that either, its text shows on hover only."""
    markers, path = scene.markers, scene.path
    must = {*ev.accepted, BONUS_NODE}  # markers always labelled: covering them costs more than a rejected one
    # reserved: the legend of ␣ and ↵ goes there
    taken = [_symbol_note_box(frame, scene.note, corner)] if scene.note else []
    if frame.legend_box is not None:
        taken.append(frame.legend_box)  # ... and the legend, in a deep tree's empty corner
    kept: list[LabelBox] = []
    forced = 0  # must-labels placed at a cost
    rejected_left = FEW_LABELS if len(ev.tokens) > LARGE_TREE else len(ev.tokens)
    def best(node: int, group: str, x: float, y: float, text: str) -> tuple[tuple, str, tuple[float, ...]]:
        """(cost, position, box) of the label's least crowded position (ties: the preferred one)."""
        options = []
        for position in LABEL_POSITIONS[group]:
            box = _label_box(frame, x, y, text, group, position)
            hits = [n in must for m, n in markers if n != node and boxes_overlap(box, m, LABEL_GAP_PX)]
            crowded = sum(boxes_overlap(box, b, LABEL_GAP_PX) for b in taken)
            crossed = sum(segment_crosses(box, seg) for seg in path)  # the thick green line would strike it out
            options.append(((crowded, not frame.inside(box), crossed + sum(hits), len(hits)), position, box))
        return min(options, key=lambda o: o[0])

    for node, group, x, y, text in scene.wishes:
        if group == "rejected" and rejected_left <= 0:
            break  # a large tree labels its accepted path and its likeliest few drafts: read from the back of a hall
        cost, position, box = best(node, group, x, y, text)
        if group == "rejected" and any(cost):  # no room: try it cut shorter, else it keeps its text on hover
            text = node_label(token_text(ev.tokens[node]), LABEL_LEN["rejected"])
            cost, position, box = best(node, group, x, y, text)
            if any(cost):
                continue
        kept.append(LabelBox(*box, node, position, html.escape(text, quote=False)))
        rejected_left -= group == "rejected"
        forced += group != "rejected" and any(cost)
        taken.append(box)
    return kept, forced


def placed_labels(ev: StepEvent, layout: TreeLayout, token_text: TokenText,
                  frame: PlotFrame) -> tuple[list[LabelBox], str]:
    """(the labels, the corner of the symbol legend): its first corner (NOTE_CORNERS) clear of every marker, the
    accepted path and the stacked legend where the root's, the accepted path's and the bonus's labels all find a
    free place; else the corner where fewest of them cannot (top right when no other is clear). A deep run's first
    label once covered the next node because its only free side held the legend of ␣."""
    scene = _label_scene(ev, layout, token_text, frame)
    if not scene.note:
        return _place_labels(ev, token_text, frame, scene)[0], NOTE_CORNERS[0]
    best: tuple[int, list[LabelBox], str] | None = None
    for corner in NOTE_CORNERS:
        box = _symbol_note_box(frame, scene.note, corner)
        clear = (frame.inside(box) and not any(boxes_overlap(box, m, LABEL_GAP_PX) for m, _ in scene.markers)
                 and not any(segment_crosses(box, seg) for seg in scene.path)
                 and (frame.legend_box is None or not boxes_overlap(box, frame.legend_box, LABEL_GAP_PX)))
        if not clear and corner != NOTE_CORNERS[0]:
            continue
        labels, forced = _place_labels(ev, token_text, frame, scene, corner)
        if forced == 0 and clear:
            return labels, corner
        if best is None or forced < best[0]:
            best = (forced, labels, corner)
    return best[1], best[2]


def label_boxes(ev: StepEvent, token_text: TokenText, width: int = TREE_WIDTH, height: int = TREE_HEIGHT) -> list[LabelBox]:
    """The labels tree_figure(ev, token_text, height, width) draws, with their estimated px boxes (no two overlap
    where the tree has room for its accepted path; the nodes left out show their token on hover only)."""
    return placed_labels(ev, tree_layout(tuple(ev.parents), tuple(ev.ranks)), token_text, tree_frame(ev, width, height))[0]


def tree_figure(ev: StepEvent | None, token_text: TokenText, height: int = TREE_HEIGHT, width: int = TREE_WIDTH) -> Figure:
    """The draft tree of one step: accepted path green, bonus token amber star, rejected nodes muted.

    Hover shows token id, depth and candidate rank, or (hybrid trees) where the token came from: the adjacency
    matrix (circle), the context (square) or both (diamond). The layout depends only on the tree's shape. Labels
    are placed for a plot `width` px wide (label_boxes): they do not overlap at that width or wider.
    """
    fig = Figure.empty(height)
    if ev is None or not ev.tokens:
        return fig.note("The draft tree of each step appears here")
    if len(ev.tokens) <= 1 and unverified_tree(ev) is not None:
        return unverified_figure(ev, token_text, height)
    layout = tree_layout(tuple(ev.parents), tuple(ev.ranks))
    frame = tree_frame(ev, width, height)
    placed, corner = placed_labels(ev, layout, token_text, frame)
    labels = {box.node: box for box in placed}
    _add_edges(fig, ev, layout)
    retrieved = _has_retrieved(ev)
    for group, nodes in node_groups(ev).items():
        if nodes:  # a group without nodes has no legend entry either (tree_legend_names)
            _add_nodes(fig, ev, layout, frame, token_text, group, nodes, labels, legend_only_by_source=retrieved)
    if retrieved:
        _add_source_legend(fig, ev)
    if ev.bonus is not None:
        _add_bonus(fig, ev, layout, frame, token_text, labels[BONUS_NODE], legend_proxy=retrieved)
    _frame_tree(fig, frame, symbol_note([box.text for box in labels.values()]), corner)
    bonus = 1 if ev.bonus is not None else 0
    n_acc = len(ev.emitted) - bonus  # emitted: an end-of-turn token or the length limit can cut the accepted path
    drafts = len(ev.tokens) - 1
    verdict = f"{n_acc} accepted + {bonus} bonus"
    if len(ev.accepted) - 1 > n_acc:  # the model accepted more than the answer kept
        verdict = f"{len(ev.accepted) - 1} accepted, {n_acc} kept (the answer ended)"
    fig.title(f"Step {ev.step + 1}: {drafts} draft token{'' if drafts == 1 else 's'} → {verdict}")
    return fig


UNVERIFIED_COLOUR = "#94a3b8"
UNVERIFIED_LABELS = 6  # nodes of a tree that was never verified labelled with their token (the likeliest first)


def unverified_tree(ev: StepEvent) -> tuple[list[int], list[int]] | None:
    """(tokens, parents) of the tree a step would have drafted but did not verify (`StepEvent.unverified`, when the
    cost-sized tree chose to draft nothing), or None when the step has none or it is malformed (it may come from a
    file: every parent must precede its node)."""
    raw = getattr(ev, "unverified", None)
    if not isinstance(raw, dict):
        return None
    tokens, parents = raw.get("tokens"), raw.get("parents")
    if not (isinstance(tokens, list) and isinstance(parents, list) and 1 < len(tokens) == len(parents) <= 512):
        return None
    ok = all(isinstance(t, int) for t in tokens) and parents[0] == -1 and all(
        isinstance(p, int) and 0 <= p < i for i, p in enumerate(parents) if i)
    return (tokens, parents) if ok else None


def unverified_figure(ev: StepEvent, token_text: TokenText, height: int = TREE_HEIGHT) -> Figure:
    """A step that drafted nothing, with the tree it would have drafted drawn dashed and grey, labelled NOT verified:
    its tokens were never checked by the model, so nothing in it was accepted or rejected."""
    tokens, parents = unverified_tree(ev)
    layout = tree_layout(tuple(parents))
    fig = Figure.empty(height)
    ex: list[float | None] = []
    ey: list[float | None] = []
    for i in range(1, len(tokens)):
        ex += [layout.x[parents[i]], layout.x[i], None]
        ey += [layout.y[parents[i]], layout.y[i], None]
    fig.add(type="scatter", x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
            line=dict(color=UNVERIFIED_COLOUR, width=2, dash="dash"))
    shown = set(range(min(len(tokens), UNVERIFIED_LABELS)))  # BFS order from the drafter: root, then depth 1 first
    fig.add(type="scatter", x=list(layout.x), y=list(layout.y), mode="markers+text", name="not verified (the model never saw it)",
            text=[display_token(token_text(t), 6) if i in shown else "" for i, t in enumerate(tokens)],
            textposition="middle right", textfont=dict(size=MIN_FONT, color=REJECTED_TEXT),
            marker=dict(color="white", size=14, symbol="circle-open", line=dict(color=UNVERIFIED_COLOUR, width=2)),
            hovertext=[f"{html.escape(repr(token_text(t)))} · not verified" for t in tokens], hoverinfo="text")
    depth = max(layout.y) - min(layout.y)
    fig.layout["xaxis"]["range"] = [-0.05, 1.15]
    fig.layout["yaxis"]["range"] = [-depth - 0.6, 0.8]
    fig.layout["margin"] = dict(l=10, r=10, t=64, b=30)
    fig.layout["annotations"] = [dict(text="NOT VERIFIED: the tree it would have drafted", showarrow=False,
                                      xref="paper", yref="paper", x=0.99, y=0.02, xanchor="right", yanchor="bottom",
                                      font=dict(size=18, color=REJECTED_TEXT))]
    reason = getattr(ev, "no_draft_reason", None) or "the cost-sized tree chose no draft"
    fig.title(f"Step {ev.step + 1}: drafted nothing, one plain forward<br>"
              f'<span style="font-size:{MIN_FONT}px;color:{REJECTED_TEXT}">{html.escape(reason[:120])}</span>')
    return fig


def _frame_tree(fig: Figure, frame: PlotFrame, note: str, corner: str = NOTE_CORNERS[0]) -> None:
    """Margins and axis ranges as label placement assumed them; the legend of ␣/↵ in its corner (placed_labels)."""
    left, right, top, bottom = frame.margin
    fig.layout["margin"] = dict(l=left, r=right, t=top, b=bottom)
    fig.layout["xaxis"]["range"] = list(frame.x_range)
    fig.layout["yaxis"]["range"] = list(frame.y_range)
    if frame.legend != "below":  # stacked in the plot's empty bottom corner (tree_frame)
        fig.layout["legend"] = dict(orientation="v", x=0 if frame.legend == "left" else 1, xanchor=frame.legend,
                                    y=0, yanchor="bottom", tracegroupgap=0, borderwidth=0, font=dict(size=MIN_FONT),
                                    bgcolor="rgba(255,255,255,0.85)")
    if note:
        vertical, side = corner.split()
        fig.layout["annotations"] = [dict(text=note, showarrow=False, xref="paper", yref="paper",
                                          x=1 if side == "right" else 0, y=1 if vertical == "top" else 0,
                                          xanchor=side, yanchor=vertical, font=dict(size=MIN_FONT, color=REJECTED_TEXT))]


def row_is_empty(values: list[int], probs: list[float] | None) -> bool:
    """A row never written, as a step read it: every candidate token 0 with probability 0 (a written row holds k
    distinct tokens)."""
    return len(values) > 1 and not any(values) and not any(probs or [])


def node_source(ev: StepEvent, i: int) -> str | None:
    """Where node i's token came from ("root", "matrix", "context" or "both"); None when the step does not say."""
    return ev.sources[i] if ev.sources is not None and i < len(ev.sources) else None


def copy_place(ev: StepEvent, nodes) -> str:
    """Where these copied nodes were found, in words: "the conversation", "the warm-start answers" (a run of the
    answers the warm start was learned on, tr_core.warm) or both."""
    origins = ev.origins or []
    return place_of([origins[i] if i < len(origins) else "" for i in nodes])


def place_of(origins: list[str]) -> str:
    """`copy_place` from the copied nodes' origins (StepEvent.origins)."""
    shipped = [LIBRARY in origin for origin in origins]
    if not any(shipped):
        return "the conversation"
    return "the warm-start answers" if all(shipped) else "the conversation and the warm-start answers"


def _has_retrieved(ev: StepEvent) -> bool:
    """Whether some draft token of the step was retrieved from the context (alone or agreeing with the matrix)."""
    return ev.sources is not None and any(s in ("context", "both") for s in ev.sources)


EDGE_STYLES = {"rejected": (EDGE_COLOUR, 1), "accepted": (ACCEPTED_COLOUR, 4), "past end": (PAST_END_COLOUR, 4)}


def _add_edges(fig: Figure, ev: StepEvent, layout: TreeLayout) -> None:
    """Edges by the group of the node they lead to: muted, the accepted path, the path past the answer's end (one
    trace each, None separating segments; none for a group without edges)."""
    groups = node_group(ev)
    for group, (colour, width) in EDGE_STYLES.items():
        ex: list[float | None] = []
        ey: list[float | None] = []
        for i in range(1, len(ev.tokens)):
            if groups[i] == group:
                p = ev.parents[i]
                ex += [layout.x[p], layout.x[i], None]
                ey += [layout.y[p], layout.y[i], None]
        if ex or group != "past end":
            fig.add(type="scatter", x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
                    line=dict(color=colour, width=width))


def _add_nodes(fig: Figure, ev: StepEvent, layout: TreeLayout, frame: PlotFrame, token_text: TokenText, group: str,
               nodes: list[int], labels: dict[int, LabelBox], legend_only_by_source: bool = False) -> None:
    """One node trace (root, accepted or rejected): colour by the group, symbol by where each token came from.

    Text and its position per node come from the label placement (`labels`); a node without a label shows its
    token on hover only. With retrieved tokens the trace's own legend icon would take its first node's symbol, so
    a stroke of the group's colour stands in for it in the legend (a circle for the root; same legend group:
    clicking it still hides the nodes): colour says accepted or not, the source legend's shapes where from.
    """
    style = NODE_GROUPS[group]
    symbol: str | list[str] = "circle"
    if ev.sources is not None:
        symbol = [SOURCE_SYMBOLS.get(node_source(ev, i) or "matrix", "circle") for i in nodes]
    fig.add(type="scatter", x=[layout.x[i] for i in nodes], y=[layout.y[i] for i in nodes], mode="markers+text",
            name=style["name"], text=[labels[i].text if i in labels else "" for i in nodes],
            textposition=[labels[i].position if i in labels else LABEL_POSITIONS[group][0] for i in nodes],
            textfont=dict(size=style["font"], color=style["text"], shadow="auto"),
            marker=dict(color=style["color"], size=frame.marker_size(group), symbol=symbol,
                        line=dict(color="white", width=1.5)),
            hovertext=[_node_hover(ev, i, token_text) for i in nodes], hoverinfo="text", customdata=nodes)
    if legend_only_by_source:
        fig.traces[-1].update(legendgroup=group, showlegend=False)
        if group == "root":  # always a circle
            fig.add(type="scatter", x=[None], y=[None], mode="markers", name=style["name"], legendgroup=group,
                    hoverinfo="skip", marker=dict(color=style["color"], size=12, symbol="circle"))
        else:  # a stroke of the colour, no shape: the shapes below say where a draft came from
            fig.add(type="scatter", x=[None], y=[None], mode="lines", name=style["name"], legendgroup=group,
                    hoverinfo="skip", line=dict(color=style["color"], width=8))


def _node_hover(ev: StepEvent, i: int, token_text: TokenText) -> str:
    """A node's hover text: token, id, depth, and its rank or where it came from; all model text escaped."""
    head = f"<b>{html.escape(repr(token_text(ev.tokens[i])))}</b><br>id {ev.tokens[i]} · depth {ev.depths[i]}"
    source = node_source(ev, i)
    if ev.ranks[i] < 0:
        head += " · root"
    elif source is None and ev.written is None:
        head += f" · rank {ev.ranks[i]}"
    elif source is None:
        head += "<br>" + _source_text(ev, i, "matrix", token_text)
    else:
        head += "<br>" + _source_text(ev, i, source, token_text)
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


def _source_text(ev: StepEvent, i: int, source: str, token_text: TokenText) -> str:
    """Where a draft token came from: its matrix row and rank, or the place in the context it was copied from."""
    recycled = provenance_text(ev, i, token_text)
    if source not in ("context", "both"):
        if recycled is not None:
            return html.escape(recycled)
        after = html.escape(repr(token_text(ev.tokens[ev.parents[i]])))
        return f"from the matrix: candidate #{ev.ranks[i]} after {after}"
    origin = ev.origins[i] if ev.origins is not None and i < len(ev.origins) else ""
    text = html.escape(origin or "copied from the context")
    if source == "both":
        text += (f"<br>and the matrix (candidate #{ev.ranks[i]})" if recycled is None
                 else "<br>and the matrix: " + html.escape(recycled))
    return text


def _add_source_legend(fig: Figure, ev: StepEvent) -> None:
    """Legend entries for the marker symbols of the sources this step's draft tokens came from: outlines in dark
    slate, so that they read as shapes, not as one more colour beside the light grey of rejected drafts."""
    present = set(ev.sources[1:])
    for source, name in SOURCE_NAMES.items():
        if source in present:
            fig.add(type="scatter", x=[None], y=[None], mode="markers", name=name, hoverinfo="skip",
                    marker=dict(color=SHAPE_LEGEND, size=12, symbol=f"{SOURCE_SYMBOLS[source]}-open",
                                line=dict(color=SHAPE_LEGEND, width=2)))


def _add_bonus(fig: Figure, ev: StepEvent, layout: TreeLayout, frame: PlotFrame, token_text: TokenText,
               label: LabelBox, legend_proxy: bool = False) -> None:
    """The bonus token: an amber star under the end of the accepted path, joined by a dotted edge. With
    `legend_proxy` (a hybrid tree's grouped legend, _add_nodes) a star of fixed size stands for it in the legend:
    a deep tree's star is smaller."""
    last = ev.accepted[-1] if ev.accepted else 0
    (bx, by), style = _bonus_xy(ev, layout, frame), NODE_GROUPS["bonus"]
    fig.add(type="scatter", x=[layout.x[last], bx], y=[layout.y[last], by], mode="lines", hoverinfo="skip",
            showlegend=False, line=dict(color=BONUS_COLOUR, width=3, dash="dot"))
    fig.add(type="scatter", x=[bx], y=[by], mode="markers+text", name=style["name"], text=[label.text],
            showlegend=not legend_proxy, **({"legendgroup": "bonus"} if legend_proxy else {}),
            textposition=label.position, textfont=dict(size=style["font"], color=style["text"], shadow="auto"),
            marker=dict(color=style["color"], size=frame.marker_size("bonus"), symbol="star",
                        line=dict(color="white", width=1)),
            hovertext=[f"<b>bonus</b> {html.escape(repr(token_text(ev.bonus)))}<br>id {ev.bonus}"], hoverinfo="text")
    if legend_proxy:
        fig.add(type="scatter", x=[None], y=[None], mode="markers", name=style["name"], legendgroup="bonus",
                hoverinfo="skip", marker=dict(color=style["color"], size=16, symbol="star"))


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

    def update(self, ev: StepEvent) -> dict[int, list[int]]:
        """Fold one step into the tracker: its accepted rows' hits and the rows it rewrote. Returns the candidates
        the rewritten rows held before (rows seen earlier only), which the step story compares with."""
        before = {row: self.values[row] for row in ev.matrix_rows if row in self.values}
        for i in ev.accepted[1:]:
            if node_source(ev, i) != "context":  # a token copied from the context is no candidate of the row
                self.hits[ev.tokens[ev.parents[i]]] += 1
        for j, row in enumerate(ev.matrix_rows):
            self.values[row] = list(ev.matrix_values[j])
            if j < len(ev.matrix_probs):
                self.probs[row] = list(ev.matrix_probs[j])
            self.writes[row] += 1
        return before

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


HEAT_CELL_LEN = 6  # characters of a candidate shown in its cell: 8 columns of MIN_FONT text fit a 600 px plot


def heatmap_figure(tracker: MatrixTracker, ev: StepEvent | None, token_text: TokenText,
                   max_rows: int = 6, height: int = 270) -> Figure:
    """A window of the adjacency matrix: rows = tokens, columns = candidate rank, colour = candidate probability.

    It shows the matrix as it is after step `ev` (the tracker has folded in every step up to it): first the rows
    this step rewrote (the rows of its accepted path first), then the rows whose candidates were accepted most
    often so far; the title and the line under it say so.
    """
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
        text.append([display_token(token_text(v), HEAT_CELL_LEN) if v is not None else "" for v in vals])
        hover.append([
            (f"row {html.escape(repr(token_text(r)))} (id {r}) → rank {j}: {html.escape(repr(token_text(v)))} (id {v})"
             + (f"<br>p = {probs[j]:.3f}" if j < len(probs) else "")
             + f"<br>hits {tracker.hits[r]} (steps that accepted its candidate), rewrites {tracker.writes[r]}")
            if v is not None else "" for j, v in enumerate(vals)])
    # Reversed so that the first row is drawn at the top.
    fig.add(type="heatmap", z=z[::-1], x=[f"#{j}" for j in range(k)], y=labels[::-1], text=text[::-1],
            texttemplate="%{text}", textfont=dict(size=MIN_FONT), hovertext=hover[::-1], hoverinfo="text",
            colorscale=PROB_SCALE, zmin=0.0, zmax=1.0, xgap=2, ygap=2,
            colorbar=dict(title=dict(text="probability", side="right"), thickness=12, len=0.8))
    fig.layout["margin"] = dict(l=10, r=10, t=64, b=40)
    fig.layout["xaxis"] = dict(visible=True, showgrid=False, side="bottom", tickfont=dict(size=MIN_FONT), ticks="",
                               type="category", automargin=True,  # the title below the rank labels, never on them
                               title=dict(text="candidate rank", font=dict(size=MIN_FONT), standoff=8))
    fig.layout["yaxis"] = dict(visible=True, showgrid=False, tickfont=dict(size=MIN_FONT, family="monospace"),
                               automargin=True, ticks="", ticklabelstandoff=6)  # no tick: "␣tem-" read as a token
    _caption_heatmap(fig, ev, [r in touched for r in rows], labels + [t for line in text for t in line])
    return fig


def _caption_heatmap(fig: Figure, ev: StepEvent | None, rewritten: list[bool], texts: list[str]) -> None:
    """Title: which moment the window shows, and under it why these rows; the legend of ␣/↵ by the rank axis."""
    if ev is None:
        why = "rows with the most hits (candidates accepted)"
    elif any(rewritten):
        shown, total = sum(rewritten), len(ev.matrix_rows)
        part = f"{shown} of the {total} " if shown < total else ""  # "It wrote 16 rows" beside 6: say which
        why = f"● {part}rows this step rewrote (accepted path first)"
        why += " · others: most hits so far" if not all(rewritten) else ""
    else:
        why = "this step rewrote none of these rows · shown: most hits so far"
    title = "Adjacency matrix" + (f" after step {ev.step + 1}" if ev is not None else "")
    fig.title(f'{title}<br><span style="font-size:{MIN_FONT}px;color:{REJECTED_TEXT}">{why}</span>')
    note = symbol_note(texts)
    if note:
        fig.layout["xaxis"]["title"]["text"] += f"     ({note})"


# ------------------------------------------------------------------------------------------- charts


def tick_step(top: float, most: int = 6) -> int:
    """A whole tick step (1, 2, 5, 10, 20, ...) that puts at most `most` ticks above 0 on an axis up to `top`: the
    chart's 150 px axis holds no more labels without overlapping them."""
    step = 1
    while top / step > most:
        step = step * 5 // 2 if str(step)[0] == "2" else step * 2
    return step


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
    # the mean's label in the right margin, at the end of its line: over the bars it hid some of them
    fig.layout["annotations"] = [dict(text=f"mean<br>{mean:.2f}", xref="paper", x=1.0, y=mean, yanchor="middle",
                                      xanchor="left", xshift=4, showarrow=False, align="left",
                                      font=dict(size=13, color=ROOT_COLOUR))]
    fig.layout["xaxis"] = dict(visible=True, showgrid=False, title=dict(text="step", font=dict(size=12)))
    fig.layout["yaxis"] = dict(visible=True, showgrid=True, gridcolor="#eef2f7", rangemode="tozero",
                               dtick=tick_step(max(lengths)), title=dict(text="tokens", font=dict(size=12)))
    fig.layout["margin"] = dict(l=50, r=48, t=16, b=40)
    fig.layout["bargap"] = 0.15
    return fig


CREDIT_PX = 34  # the chart's two more caption lines under its axis: the answer's tokens credited (draft_credit)


def accepted_chart_explained(events: list[StepEvent], current: int | None = None, height: int = 240) -> Figure:
    """`accepted_chart` with a legend for its colours: green bars = tokens each step gained, amber = the step shown;
    under the axis, the answer's tokens credited to their sources on two lines (on one, it ran past the chart)."""
    fig = accepted_chart(events, current, height + CREDIT_PX if events else height)
    if not events:
        return fig
    entries = [(ACCEPTED_COLOUR, "tokens a step gained (the accepted drafts it kept + bonus)")]
    if current is not None and 0 <= current < len(events):
        entries.append((BONUS_COLOUR, f"step {current + 1}: the step shown in the tree"))
    for colour, name in entries:  # legend-only markers: the bars themselves stay one trace without a legend
        fig.add(type="scatter", mode="markers", x=[None], y=[None], name=name, showlegend=True, hoverinfo="skip",
                marker=dict(symbol="square", size=12, color=colour))
    fig.layout["showlegend"] = True
    fig.layout["legend"] = dict(orientation="h", x=0.0, xanchor="left", y=1.0, yanchor="bottom", font=dict(size=12))
    fig.layout["margin"]["t"] = 34
    fig.layout["xaxis"]["title"]["text"] = "step<br>" + draft_credit(events).replace(" + ", "<br>+ ", 1)
    fig.layout["margin"]["b"] += CREDIT_PX
    return fig


def draft_credit(events: list[StepEvent]) -> str:
    """The answer's tokens as accepted drafts plus bonus tokens, the drafts credited to where they came from:
    "128 tokens = 56 accepted drafts (6 from the matrix, 20 copied, 30 both) + 72 bonus" (hybrid trees), or
    "... (all from the matrix) + ..." (the others). A reader checks it against the bars: a step whose answer ended
    inside it has no bonus, and its path counts only the drafts the answer kept."""
    counts = {"matrix": 0, "context": 0, "both": 0}
    for ev in events:  # the drafts the step emitted: an end-of-turn token or the length limit can cut the path
        for i in ev.accepted[1:1 + len(ev.emitted) - (ev.bonus is not None)]:
            source = node_source(ev, i) or "matrix"
            counts[source if source in counts else "matrix"] += 1
    drafts, bonuses = sum(counts.values()), sum(ev.bonus is not None for ev in events)
    tokens = sum(len(ev.emitted) for ev in events)
    where = ("all from the matrix" if not counts["context"] and not counts["both"] else
             f"{counts['matrix']} from the matrix, {counts['context']} copied, {counts['both']} both")
    ended = len(events) - bonuses  # steps whose answer ended inside them (its last): no bonus token
    none = " (none where the answer ended)" if ended else ""
    return f"{tokens} tokens = {drafts} accepted drafts ({where}) + {bonuses} bonus{none}"


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
            font=dict(size=MIN_FONT, color="#1f2937"), hoverlabel=dict(font=dict(size=MIN_FONT)), uirevision="keep",
            legend=dict(orientation="h", yanchor="top", y=0.0, x=0.0, font=dict(size=MIN_FONT)),
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
        self["layout"]["title"] = dict(text=text, x=0.01, font=dict(size=18))
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

    # idle | live (answering; measured after it) | live-off (answering; not to be measured) | measuring | measured |
    # noisy | off (not compared)
    state: str = "idle"
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
        cls = ratio_class(v.ratio, v.error or 0.0)
        verb = {"up": "measured", "down": "measured: slower", "par": "measured: no clear difference"}[cls]
        # "1.30× as fast as plain decoding", not "1.30× faster" (read as 130% faster); one line in the presentation view
        return f"{v.ratio:.2f}×{err}", cls, f"as fast as plain decoding ({verb})"
    if v.state == "noisy":
        return "too noisy to measure", "none", "speedup not shown"
    if v.state in ("live", "measuring"):
        return "…", "none", "speedup: measured right after the answer" if v.state == "live" else "measuring speedup…"
    if v.state == "live-off":
        return "—", "none", "speedup: not measured (turned off in the decoding settings)"
    if v.state == "off":
        return "—", "none", "speedup not measured"
    return "—", "none", "speedup"


def speed_format(v: MeterView, plain: float | None) -> str:
    """The format of both tok/s figures: one decimal, or as many more (up to 3) as it takes for the shown speeds to
    divide to the shown ratio (31.43 / 21.30 = 1.4756 shows 1.48×, but 31.4 / 21.3 = 1.474 would read 1.47×)."""
    if v.state != "measured" or v.ratio is None or not v.tr_tps or not plain:
        return "{:.1f}"
    shown = round(v.ratio, 2)
    for decimals in (1, 2, 3):
        if round(round(v.tr_tps, decimals) / round(plain, decimals), 2) == shown:
            return f"{{:.{decimals}f}}"
    return "{:.1f}"


def meter_html(v: MeterView) -> str:
    """The speedup meter as HTML: the ratio with its uncertainty (or why none), both speeds, mean accepted."""
    def num(x: float | None, fmt: str = "{:.1f}") -> str:
        return fmt.format(x) if x is not None else "—"

    ratio_text, cls, label = _ratio_parts(v)
    plain = None if v.state == "noisy" else v.plain_tps  # beside Token Recycling's, it would imply the unshown ratio
    tps = speed_format(v, plain)
    if v.identical is None:
        flag = '<span class="tr-flag tr-flag-none">outputs not compared</span>'
    elif v.identical:
        flag = '<span class="tr-flag tr-flag-ok">✓ token-identical to plain decoding</span>'
    else:
        flag = '<span class="tr-flag tr-flag-bad">✗ outputs differ from plain decoding</span>'
    live = ' <span class="tr-live">live</span>' if v.state == "live" else ""
    note = f'<div class="tr-note" title="{html.escape(v.note)}">{html.escape(v.note)}</div>' if v.note else ""
    return (
        f'<div class="tr-meter tr-meter-{cls}" id="tr-meter" data-state="{html.escape(v.state)}">'
        f'<div class="tr-big"><span class="tr-ratio tr-ratio-{cls}" id="tr-ratio">{html.escape(ratio_text)}</span>'
        f'<span class="tr-biglabel">{html.escape(label)}{live}</span></div>'
        '<div class="tr-cells">'
        f'<div class="tr-cell"><span class="tr-val" id="tr-tps">{num(v.tr_tps, tps)}</span><span class="tr-lab">Token Recycling tok/s</span></div>'
        f'<div class="tr-cell"><span class="tr-val" id="tr-plain">{num(plain, tps)}</span><span class="tr-lab">plain tok/s, same tokens</span></div>'
        f'<div class="tr-cell"><span class="tr-val" id="tr-mat">{num(v.mean_accepted, "{:.2f}")}</span><span class="tr-lab">tokens per step</span></div>'
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


_AUTOLINK = re.compile(r"(?i)(://|www\.|@)")  # what a markdown renderer turns into a link of its own accord
_AUTOLINK_INERT = {"://": "&#58;//", "@": "&#64;"}


def _inert(text: str) -> str:
    """Escape HTML and disarm markdown images/links (`![..](..)`, `[..](..)`) in text outside code, and the
    addresses a renderer would link by itself (`http://..`, `www...`, `a@b.c`): written as character references,
    they show the same text but no longer match a link."""
    text = html.escape(text, quote=False).replace("[", "&#91;")
    return _AUTOLINK.sub(lambda m: _AUTOLINK_INERT.get(m.group(1), m.group(1)[:3] + "&#46;"), text)


def coloured_markdown(text: str, boundaries: list[int], colour: bool = True) -> str:
    """Wrap each step's run of text in alternating soft-coloured spans, leaving markdown structure intact.

    `boundaries[i]` is the end offset of step i's text. Spans never enter code (fenced or inline), never
    cross a line break, and never cover a line's leading block marker, so lists, headings, tables and code
    render as they would without colour. Text outside spans keeps its markdown; '<', '&' and '[' are escaped,
    so the text can carry no live HTML and no images (it may come from a visitor, a model or a shared trace).
    colour=False: the same escaping, no spans.
    """
    return marked_markdown(text, boundaries, None, colour)


def marked_markdown(text: str, boundaries: list[int], current: int | None, colour: bool = True) -> str:
    """`coloured_markdown` with step `current`'s run also marked (class "tr-run-current": the step shown in replay;
    None marks none)."""
    def span_class(step: int) -> str:
        cls = RUN_CLASSES[step % 2] if colour else ""
        return f"{cls} {CURRENT_RUN_CLASS}".strip() if step == current else cls

    return run_markdown(text, boundaries, span_class)


CODE_OPEN, CODE_CLOSE = '<pre class="tr-code"><code>', "</code></pre>"  # a fenced block that carries step colours


def _fence_parts(text: str, a: int, b: int) -> tuple[int, int] | None:
    """For the code zone text[a:b] when it is a fenced block opened at most 3 spaces in (so that an HTML block can
    stand in its place): (where its body starts, where its closing fence line starts; b while it is still open)."""
    nl = text.find("\n", a, b)
    body = b if nl < 0 else nl + 1
    line = text[a:body].rstrip("\n")
    stripped = line.lstrip(" ")
    if len(line) - len(stripped) > 3 or stripped[:3] not in ("```", "~~~"):
        return None
    last = text.rfind("\n", a, b - 1 if text[b - 1] == "\n" else b) + 1  # where the zone's last line starts
    closed = last > a and text[last:b].lstrip().startswith(stripped[:3])
    return body, (last if closed else b)


def _char_modes(text: str, pre: bool) -> list[str]:
    """Each character's part: "md" (markdown text), "code" (code left as markdown: inline, or every fence when not
    `pre`), and for a fenced block shown as coloured HTML, "open" (its opening fence line), "pre" (its body) and
    "close" (its closing fence line)."""
    modes = ["md"] * len(text)
    for a, b in _code_zones(text):
        parts = _fence_parts(text, a, b) if pre else None
        if parts is None:
            modes[a:b] = ["code"] * (b - a)
            continue
        body, close = parts
        modes[a:body] = ["open"] * (body - a)
        modes[body:close] = ["pre"] * (close - body)
        end = b - 1 if close < b and text[b - 1] == "\n" else b  # the closing line's newline stays
        modes[close:end] = ["close"] * (end - close)
    return modes


def _block_lead(piece: str) -> tuple[str, str]:
    """A markdown line's start split as (leading spaces and block marker, the rest): '- ', '## ', '1. ', '> '."""
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
    return piece[: lead_len + len(marker)], piece[lead_len + len(marker):]


def _run_piece(text: str, i: int, j: int, mode: str, cls: str) -> str:
    """text[i:j] (one part, no line break) as output in a step's span of class `cls` ("" = none)."""
    piece = text[i:j]
    if mode == "code":
        return piece
    if mode == "open":  # the fence line gives way to the HTML block, its indentation kept (a list item's)
        start = text.rfind("\n", 0, i) + 1
        fence = start + len(text[start:j]) - len(text[start:j].lstrip(" "))  # where the fence's first mark is
        return text[i:min(j, fence)] + (CODE_OPEN if i <= fence < j else "")
    if mode == "close":
        return CODE_CLOSE if text[i - 1] == "\n" else ""
    if mode == "pre":  # inside <pre>: HTML escaped, the indentation outside the span
        lead, body = piece[: len(piece) - len(piece.lstrip())], piece.lstrip()
        body = html.escape(body, quote=False)
        return lead + (f'<span class="{cls}">{body}</span>' if body and cls else body)
    lead = ""
    if i == 0 or text[i - 1] == "\n":
        lead, piece = _block_lead(piece)
    body = _inert(piece)
    return lead + (f'<span class="{cls}">{body}</span>' if piece.strip() and cls else body)


def run_markdown(text: str, boundaries: list[int], span_class: Callable[[int], str]) -> str:
    """Escaped markdown with step i's run in spans of class `span_class(i)` ("" = no span); see coloured_markdown.

    When some run has a class, a fenced code block is written as an HTML block (`<pre class="tr-code">`, its
    language dropped) so that its runs can carry their spans too; inline code stays as it is."""
    modes = _char_modes(text, pre=any(span_class(step) for step in range(len(boundaries))))
    out: list[str] = []
    start = 0
    for step, end in enumerate([*boundaries, len(text)]):
        end = min(end, len(text))
        if end <= start:
            continue
        cls = span_class(step) if step < len(boundaries) else ""
        i = start
        while i < end:
            if text[i] == "\n":
                out.append("" if modes[i] == "open" else "\n")
                i += 1
                continue
            j = i
            while j < end and modes[j] == modes[i] and text[j] != "\n":
                j += 1
            out.append(_run_piece(text, i, j, modes[i], cls))
            i = j
        start = end
    if modes and modes[-1] in ("open", "pre"):  # a fence still open while the answer streams
        out.append(CODE_CLOSE)
    return "".join(out)
