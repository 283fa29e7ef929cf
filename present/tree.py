"""The draft tree of one step (paper Sec. 3.2): the accepted path green, the bonus token an amber star, the rejected
drafts muted; marker shapes say where a hybrid tree's drafts came from.

The root, the accepted path and the bonus token carry a label, beside their marker at a fixed side; a rejected
draft carries one where room allows (rejected_labels); every node's token shows on hover. One rule for the marks,
as in the tour: shape = where a draft came from, colour = the verdict (the legend: outlined shapes, colour
swatches). The figure is a pure function of the step's event and a `token_text(id)` lookup.
"""
from __future__ import annotations

import html

from tr_core.events import StepEvent
from .figure import Figure
from .nodes import draft_sources, node_group, node_groups, node_hover, node_source
from .reasons import no_draft_reason
from .style import (ACCEPTED_COLOUR, BONUS_COLOUR, EDGE_COLOUR, MIN_FONT, PAST_END_COLOUR, REJECTED_COLOUR,
                    REJECTED_TEXT, ROOT_COLOUR, TokenText, display_token, node_label, symbol_note, text_em)
from .tree_layout import TreeLayout, tree_layout

# Where a draft token came from (StepEvent.sources), shown as the marker's symbol; colour keeps accepted/rejected.
SOURCE_SYMBOLS = {"root": "circle", "matrix": "circle", "context": "square", "both": "diamond"}
SOURCE_NAMES = {"matrix": "shape: from the matrix", "context": "shape: copied from earlier text",
                "both": "shape: from the matrix and copied"}  # the legend draws each with its marker symbol in front
# ("shape:": a reader found no drawn node like the outlined key, whatever its colour); not
# "matrix + context", the name of the drafting setting whose trees hold all three
SHAPE_LEGEND = "#475569"  # the source legend's shapes: filled in slate, after "shape:" (a shape says where from,
# never the verdict: a reader took a light grey circle "from the matrix" for the tour's grey "rejected", and later
# readers found no drawn node like an outlined key)
LEGEND_GROUPS = ("root", "accepted", "past end", "rejected")  # the colour legend's order: a swatch each
NODE_GROUPS = {  # the tree's node traces, drawn in this order (accepted on top); size: marker px, font: label px
    "rejected": dict(color=REJECTED_COLOUR, size=12, font=MIN_FONT, text=REJECTED_TEXT, name="rejected"),
    "root": dict(color=ROOT_COLOUR, size=24, font=MIN_FONT, text=ROOT_COLOUR, name="root (last committed token)"),
    "accepted": dict(color=ACCEPTED_COLOUR, size=22, font=MIN_FONT, text="#14532d", name="accepted"),
    "past end": dict(color=PAST_END_COLOUR, size=22, font=MIN_FONT, text="#15803d",
                     name="accepted, past the answer's end (not kept)"),
    "bonus": dict(color=BONUS_COLOUR, size=24, font=MIN_FONT, text="#92400e", name="bonus token"),
}
LABEL_LEN = 8  # characters of a label shown before the cut '…' (X_RANGE leaves room for them at the edges)
BONUS_NODE = -1  # the bonus token's key among the labels (it is no tree node)
EDGE_STYLES = {"rejected": (EDGE_COLOUR, 1), "accepted": (ACCEPTED_COLOUR, 4), "past end": (PAST_END_COLOUR, 4)}

TREE_HEIGHT = 400  # px of the tree's figure (the presentation view gives it a 400 px cell of a 720 px screen)
TREE_WIDTH = 640  # px: the narrowest the tree is drawn (the studio lets it fill its column), for X_RANGE's room
X_RANGE = (-0.16, 1.16)  # the layout's x in [0, 1], and room beside the nodes at its edges for a LABEL_LEN label
TITLE_PX = 44  # the top margin, for the title
LEGEND_ROW_PX = 34  # a row of the legend under the plot (plotly.js: MIN_FONT entries, each its own legend group)
LEGEND_PER_ROW = 3  # entries a row holds at TREE_WIDTH (plotly widens the margin if a narrower plot needs more rows)
NOTE_ROW_PX = 21  # the legend's title row: the note on ␣/↵
ROOT_LABEL_PX = 28  # room over the root's centre for its marker and its label (which may reach into the title's)
UNDER_LEVELS = 0.9  # room under the deepest level, in levels (the bonus star and its label; more where levels close)
STAR_LABEL_PX = 14  # room under the bonus star's centre for its label, which stands beside it
CLOSE_LEVEL_PX = 24  # levels closer than a line of label text: a straight run's labels alternate sides
UNDER_X = 0.06  # a path node this close to its parent's x (~28 px at TREE_WIDTH) hangs under it: labels side by side
MIN_MARKER = 9  # px: the smallest marker of a deep tree's nodes
BEAD_GAP_PX = 8  # px left between the markers of two levels, where the edge joining them shows
STAR_GAP_PX = 6  # px between the bonus star and the last accepted node, where the dotted edge shows
BONUS_DROP = 0.55  # levels from the end of the accepted path down to the bonus star
DRAWN_LEVELS = 8  # levels drawn at least; deeper ones only down to one under the accepted path (drawn_depth)
REJECTED_LABEL_LEN = 6  # characters of a rejected draft's label, which stands only where room allows
ROOT_LABEL_LEN = 12  # the root's label, centred over it: half of 12 characters fits X_RANGE's room at an edge
LABEL_GAP_PX = 4  # px between a marker and its label (plotly's), and kept clear between a label and its neighbours
TEXT_LINE_PX = 22  # a label's height: a rejected draft's label needs levels this far from a star's label


def marker_px(group: str, level_px: float) -> float:
    """A node group's marker px: NODE_GROUPS' size, smaller where levels are `level_px` apart and closer than that
    (a deep tree), so that a long run reads as a chain of beads rather than one bar; never under MIN_MARKER."""
    return min(NODE_GROUPS[group]["size"], max(MIN_MARKER, level_px - BEAD_GAP_PX))


def star_clear_px(level_px: float) -> float:
    """Px between the bonus star's centre and the last accepted node's that keep STAR_GAP_PX between their markers."""
    return (marker_px("bonus", level_px) + marker_px("accepted", level_px)) / 2 + STAR_GAP_PX


def bonus_drop(level_px: float) -> float:
    """Levels from the end of the accepted path down to the bonus star: BONUS_DROP, or as far as keeps the star
    clear of that node's marker where the levels are close (a deep tree's smaller markers)."""
    return max(BONUS_DROP, star_clear_px(level_px) / max(level_px, 1.0))


def legend_px(ev: StepEvent, note: str) -> int:
    """Px of the legend under the plot: rows of LEGEND_PER_ROW entries, under the note on ␣/↵ when there is one."""
    rows = -(-len(tree_legend_names(ev)) // LEGEND_PER_ROW)
    return rows * LEGEND_ROW_PX + (NOTE_ROW_PX if note else 0)


def tree_levels(depth: int, plot_px: float) -> tuple[float, tuple[float, float]]:
    """(px between two depths, the y axis range) of a tree `depth` levels deep in a plot `plot_px` tall: the root's
    label over it, and the bonus star and its label under the deepest level, stay inside the plot."""
    plot_px -= ROOT_LABEL_PX
    drop = bonus_drop(plot_px / (depth + UNDER_LEVELS))
    under = max(UNDER_LEVELS, drop + STAR_LABEL_PX * (depth + UNDER_LEVELS) / plot_px)
    level = plot_px / (depth + under)
    return level, (-depth - under, ROOT_LABEL_PX / level)


def bonus_xy(ev: StepEvent, layout: TreeLayout, level_px: float, last_side: str = "") -> tuple[float, float]:
    """Where the bonus star sits: under the end of the accepted path, clear of its marker (bonus_drop). Where that
    node is not the deepest and the levels are close, the star goes BONUS_DROP down and aside, away from the node's
    label (`last_side`), rather than onto a draft below."""
    last = ev.accepted[-1] if ev.accepted else 0
    x, y, drop = layout.x[last], layout.y[last], bonus_drop(level_px)
    if drop == BONUS_DROP or ev.depths[last] >= drawn_depth(ev):
        return x, y - drop
    aside = star_clear_px(level_px) * (X_RANGE[1] - X_RANGE[0]) / (TREE_WIDTH - 20)
    return x + (-aside if last_side == "middle right" else aside), y - BONUS_DROP


def _beside(side: str, dx: float, close: bool) -> str:
    """The side of a path label after the previous label's `side`, its marker `dx` right of its parent's: away from
    the parent; hanging under it (dx 0), that side, or the other one where levels are `close` (and after the root's)."""
    if dx:
        return "middle right" if dx > 0 else "middle left"
    if side in ("", "top center") or close:
        return "middle left" if side == "middle right" else "middle right"
    return side


def label_positions(ev: StepEvent, layout: TreeLayout, level_px: float) -> tuple[dict[int, str], tuple[float, float]]:
    """(where each label goes, as plotly textposition; where the bonus star sits). The root's label is above it; a
    node of the accepted path has its label beside its marker, on the side away from its parent (the edge that comes
    in stays clear of it). A node hanging under the previous one (within UNDER_X) keeps that one's side, or takes the
    other side where levels are closer than a line of text, so that a long copied run's labels alternate. The star
    (BONUS_NODE) and its label follow the same rule after the path's last node (a star stepped aside: that way)."""
    close = level_px < CLOSE_LEVEL_PX
    positions, side = {0: "top center"}, ""
    for i in ev.accepted[1:]:
        dx = layout.x[i] - layout.x[ev.parents[i]]
        side = positions[i] = _beside(side, dx if abs(dx) >= UNDER_X else 0.0, close)
    last = ev.accepted[-1] if ev.accepted else 0
    star = bonus_xy(ev, layout, level_px, side)
    if ev.bonus is not None:
        positions[BONUS_NODE] = _beside(side, star[0] - layout.x[last], close)
    return positions, star


def clear_of_markers(ev: StepEvent, layout: TreeLayout, level_px: float,
                     labels: dict[int, tuple[str, str]]) -> dict[int, tuple[str, str]]:
    """The path's labels, each moved to its marker's other side where it would cover another marker of its level
    and that side is clear (a reader found '␣property' hidden under '␣aspect'); the last one keeps its side, which
    the bonus star steps away from."""
    scale, groups, out = (TREE_WIDTH - 20) / (X_RANGE[1] - X_RANGE[0]), node_group(ev), dict(labels)
    for node in ev.accepted[1:-1]:
        text, side = labels[node]
        x, r = layout.x[node] * scale, marker_px(groups[node], level_px) / 2
        others = [(layout.x[i] * scale, marker_px(groups[i], level_px) / 2) for i in range(1, len(ev.tokens))
                  if i != node and ev.depths[i] == ev.depths[node]]

        def covers(where: str) -> bool:
            left, right = _label_span(x, r, label_px(text), where)
            return any(a - q < right and left < a + q for a, q in others)

        other = {"middle right": "middle left", "middle left": "middle right"}.get(side)
        if other and covers(side) and not covers(other):
            out[node] = (text, other)
    return out


def tree_labels(ev: StepEvent, token_text: TokenText) -> dict[int, str]:
    """Node -> its label (HTML-escaped) for the root, the accepted path and the bonus (BONUS_NODE): the nodes a
    lecture hall reads; every other node shows its token on hover only."""
    nodes = [0, *ev.accepted[1:]] + ([BONUS_NODE] if ev.bonus is not None else [])
    tokens = [ev.bonus if node == BONUS_NODE else ev.tokens[node] for node in nodes]
    return {node: html.escape(node_label(token_text(t), ROOT_LABEL_LEN if node == 0 else LABEL_LEN), quote=False)
            for node, t in zip(nodes, tokens)}


def label_px(text: str) -> float:
    """About how many px a label (HTML-escaped, as the figure holds it) takes in MIN_FONT type."""
    return text_em(html.unescape(text)) * MIN_FONT


def _label_span(x: float, r: float, width: float, side: str) -> tuple[float, float]:
    """(left, right) px of a label `width` px wide beside a marker of radius `r` at `x` px, on `side`."""
    if side == "middle right":
        return x + r + LABEL_GAP_PX, x + r + LABEL_GAP_PX + width
    if side == "middle left":
        return x - r - LABEL_GAP_PX - width, x - r - LABEL_GAP_PX
    return x - width / 2, x + width / 2


def _taken_spans(ev: StepEvent, layout: TreeLayout, level_px: float, depth: int, labels: dict[int, tuple[str, str]],
                 star: tuple[float, float], scale: float) -> dict[int, list[tuple[float, float, int]]]:
    """Per level: the px spans (left, right, node) of every drawn marker and of the path's labels; the star and its
    label on each level they stand within a line of text of."""
    groups, spans = node_group(ev), {}
    for i in range(len(ev.tokens)):
        if ev.depths[i] <= depth:
            r = marker_px(groups[i], level_px) / 2
            spans.setdefault(ev.depths[i], []).append((layout.x[i] * scale - r, layout.x[i] * scale + r, i))
    for node, (text, side) in labels.items():
        if node not in (0, BONUS_NODE):
            r = marker_px(groups[node], level_px) / 2
            left, right = _label_span(layout.x[node] * scale, r, label_px(text), side)
            spans[ev.depths[node]].append((left, right, node))
    if BONUS_NODE in labels:
        text, side = labels[BONUS_NODE]
        r = marker_px("bonus", level_px) / 2
        left, right = _label_span(star[0] * scale, r, label_px(text), side)
        for d in spans:
            if abs(star[1] + d) * level_px < TEXT_LINE_PX:
                spans[d] += [(min(left, star[0] * scale - r), max(right, star[0] * scale + r), BONUS_NODE)]
    return spans


def rejected_labels(ev: StepEvent, layout: TreeLayout, level_px: float, depth: int,
                    labels: dict[int, tuple[str, str]], star: tuple[float, float],
                    token_text: TokenText) -> dict[int, tuple[str, str]]:
    """Labels for the rejected drafts where room allows: beside the marker, right or else left, where the label
    clears every marker and label of its level and the plot's edges (at TREE_WIDTH, the narrowest the tree is drawn);
    none where levels are closer than two lines of text. Node -> (its label, HTML-escaped; plotly textposition)."""
    if level_px < 1.5 * CLOSE_LEVEL_PX:
        return {}
    scale = (TREE_WIDTH - 20) / (X_RANGE[1] - X_RANGE[0])  # px per unit of the layout's x
    spans, out = _taken_spans(ev, layout, level_px, depth, labels, star, scale), {}
    r = marker_px("rejected", level_px) / 2
    groups = node_group(ev)
    for i in sorted(range(1, len(ev.tokens)), key=lambda n: (ev.depths[n], layout.x[n])):
        if groups[i] != "rejected" or ev.depths[i] > depth:
            continue
        text = html.escape(node_label(token_text(ev.tokens[i]), REJECTED_LABEL_LEN), quote=False)
        for side in ("middle right", "middle left"):
            a, b = _label_span(layout.x[i] * scale, r, label_px(text), side)
            clear = all(b + LABEL_GAP_PX <= c or d + LABEL_GAP_PX <= a for c, d, n in spans[ev.depths[i]] if n != i)
            if clear and X_RANGE[0] * scale <= a and b <= X_RANGE[1] * scale:
                spans[ev.depths[i]].append((a, b, i))
                out[i] = (text, side)
                break
    return out


def tree_legend_names(ev: StepEvent) -> list[str]:
    """The legend entries tree_figure shows for a step, in order: the colours (the verdict), then the shapes (where
    the drafts came from)."""
    groups = node_groups(ev)
    names = [NODE_GROUPS[g]["name"] for g in LEGEND_GROUPS if groups[g]]  # none for a kind not shown
    names += [NODE_GROUPS["bonus"]["name"]] if ev.bonus is not None else []
    return names + [SOURCE_NAMES[source] for source in draft_sources(ev)]


def tree_figure(ev: StepEvent | None, token_text: TokenText, height: int = TREE_HEIGHT) -> Figure:
    """The draft tree of one step: accepted path green, bonus token amber star, rejected nodes muted.

    Hover shows every node's token, id, depth and candidate rank, or (hybrid trees) where the token came from: the
    adjacency matrix (circle), the context (square) or both (diamond). The layout depends only on the tree's shape.
    The root, the accepted path and the bonus are labelled (tree_labels, label_positions), rejected drafts where room
    allows (rejected_labels); plotly places the legend (_add_legend) under the plot, headed by '␣ = space' when a
    label shows a ␣.
    """
    fig = Figure.empty(height)
    if ev is None or not ev.tokens:
        return fig.note("The draft tree of each step appears here")
    if len(ev.tokens) <= 1 and unverified_tree(ev) is not None:
        return unverified_figure(ev, token_text, height)
    layout = tree_layout(tuple(ev.parents), tuple(ev.ranks))
    texts = tree_labels(ev, token_text)
    note = symbol_note(list(texts.values()) + [node_label(token_text(ev.tokens[i]), REJECTED_LABEL_LEN)  # labels
                                              for i in range(1, len(ev.tokens)) if i not in texts])  # that may show
    bottom = legend_px(ev, note)
    depth = drawn_depth(ev)
    level, y_range = tree_levels(depth, height - TITLE_PX - bottom)
    positions, star = label_positions(ev, layout, level)
    labels = clear_of_markers(ev, layout, level, {node: (texts[node], side) for node, side in positions.items()})
    labels.update(rejected_labels(ev, layout, level, depth, labels, star, token_text))
    _add_edges(fig, ev, layout, depth)
    for group, nodes in node_groups(ev).items():
        nodes = [i for i in nodes if ev.depths[i] <= depth]
        if nodes:
            _add_nodes(fig, ev, layout, level, token_text, group, nodes, labels)
    _add_cut_runs(fig, ev, layout, depth)
    if ev.bonus is not None:
        _add_bonus(fig, ev, layout, star, level, token_text, labels[BONUS_NODE])
    _add_legend(fig, ev)
    _frame_tree(fig, y_range, bottom, note)
    return fig.title(_tree_title(ev))


def drawn_depth(ev: StepEvent) -> int:
    """The deepest level drawn: every level down to DRAWN_LEVELS, or one under the accepted path's end where that
    is deeper; a long copied run past it is cut and counted (_add_cut_runs), so that its beads do not squeeze the
    levels that carry the labels."""
    path_end = ev.depths[ev.accepted[-1]] if ev.accepted else 0
    return min(max(ev.depths), max(DRAWN_LEVELS, path_end + 1))


def _add_cut_runs(fig: Figure, ev: StepEvent, layout: TreeLayout, depth: int) -> None:
    """Under each drawn node whose drafts go deeper than `depth`: '⋮ +k deeper', k the drafts not drawn."""
    hidden: dict[int, int] = {}
    for i in range(1, len(ev.tokens)):
        if ev.depths[i] > depth:
            top = i
            while ev.depths[top] > depth:
                top = ev.parents[top]
            hidden[top] = hidden.get(top, 0) + 1
    if hidden:
        fig.add(type="scatter", x=[layout.x[i] for i in hidden], y=[layout.y[i] - 0.5 for i in hidden],
                mode="text", text=[f"⋮ +{k} deeper" for k in hidden.values()], textposition="bottom center",
                cliponaxis=False, showlegend=False, hoverinfo="skip",
                textfont=dict(size=MIN_FONT, color=REJECTED_TEXT))


def _tree_title(ev: StepEvent) -> str:
    """'Step 3: 6 draft tokens → 2 accepted + 1 bonus' (or how many the answer kept, where it ended in the step)."""
    bonus = 1 if ev.bonus is not None else 0
    n_acc = len(ev.emitted) - bonus  # emitted: an end-of-turn token or the length limit can cut the accepted path
    drafts = len(ev.tokens) - 1
    verdict = f"{n_acc} accepted + {bonus} bonus"
    if len(ev.accepted) - 1 > n_acc:  # the model accepted more than the answer kept
        verdict = f"{len(ev.accepted) - 1} accepted, {n_acc} kept (the answer ended)"
    return f"Step {ev.step + 1}: {drafts} draft token{'' if drafts == 1 else 's'} → {verdict}"


def _frame_tree(fig: Figure, y_range: tuple[float, float], bottom: int, note: str) -> None:
    """Margins and axis ranges; the legend `bottom` px under the plot, headed by the note on ␣/↵ when a label shows
    one (placed by plotly: it sits on no node)."""
    fig.layout["margin"] = dict(l=10, r=10, t=TITLE_PX, b=bottom)
    fig.layout["xaxis"]["range"] = list(X_RANGE)
    fig.layout["yaxis"]["range"] = list(y_range)
    if note:
        fig.layout["legend"]["title"] = dict(text=note, side="top", font=dict(size=MIN_FONT, color=REJECTED_TEXT))


def _add_edges(fig: Figure, ev: StepEvent, layout: TreeLayout, depth: int) -> None:
    """Edges by the group of the node they lead to: muted, the accepted path, the path past the answer's end (one
    trace each, None separating segments; none for a group without edges), down to level `depth`."""
    groups = node_group(ev)
    for group, (colour, width) in EDGE_STYLES.items():
        ex: list[float | None] = []
        ey: list[float | None] = []
        for i in range(1, len(ev.tokens)):
            if groups[i] == group and ev.depths[i] <= depth:
                p = ev.parents[i]
                ex += [layout.x[p], layout.x[i], None]
                ey += [layout.y[p], layout.y[i], None]
        if ex or group != "past end":
            fig.add(type="scatter", x=ex, y=ey, mode="lines", hoverinfo="skip", showlegend=False,
                    line=dict(color=colour, width=width))


def _add_nodes(fig: Figure, ev: StepEvent, layout: TreeLayout, level_px: float, token_text: TokenText, group: str,
               nodes: list[int], labels: dict[int, tuple[str, str]]) -> None:
    """One node trace (rejected, root, accepted or past end): colour by the group, symbol by where each token came
    from; the labelled nodes' text beside them (tree_labels, rejected_labels), every node's token on hover. Its
    legend entry is _add_legend's swatch (same legend group: clicking it still hides the nodes)."""
    style = NODE_GROUPS[group]
    symbol: str | list[str] = "circle"
    if ev.sources is not None:
        symbol = [SOURCE_SYMBOLS.get(node_source(ev, i) or "matrix", "circle") for i in nodes]
    texts = [labels.get(i, ("", "middle right")) for i in nodes]  # a rejected draft without room: none
    fig.add(type="scatter", x=[layout.x[i] for i in nodes], y=[layout.y[i] for i in nodes], name=style["name"],
            mode="markers+text", text=[t for t, _ in texts], textposition=[p for _, p in texts], cliponaxis=False,
            textfont=dict(size=style["font"], color=style["text"], shadow="auto"), legendgroup=group, showlegend=False,
            marker=dict(color=style["color"], size=marker_px(group, level_px), symbol=symbol,
                        line=dict(color="white", width=1.5)),
            hovertext=[node_hover(ev, i, token_text) for i in nodes], hoverinfo="text", customdata=nodes)


def _add_legend(fig: Figure, ev: StepEvent) -> None:
    """The legend, one rule: colour = the verdict, a swatch (a stroke of no shape) for each group shown and the
    amber star for the bonus; shape = where a draft came from, outlined and unfilled, for each source present."""
    groups = node_groups(ev)
    for group in LEGEND_GROUPS:
        if groups[group]:
            fig.add(type="scatter", x=[None], y=[None], mode="lines", name=NODE_GROUPS[group]["name"],
                    legendgroup=group, hoverinfo="skip", line=dict(color=NODE_GROUPS[group]["color"], width=8))
    if ev.bonus is not None:
        fig.add(type="scatter", x=[None], y=[None], mode="markers", name=NODE_GROUPS["bonus"]["name"],
                legendgroup="bonus", hoverinfo="skip", marker=dict(color=BONUS_COLOUR, size=16, symbol="star"))
    for source in draft_sources(ev):
        fig.add(type="scatter", x=[None], y=[None], mode="markers", name=SOURCE_NAMES[source], hoverinfo="skip",
                legendgroup=source, marker=dict(color=SHAPE_LEGEND, size=12, symbol=SOURCE_SYMBOLS[source]))


def _add_bonus(fig: Figure, ev: StepEvent, layout: TreeLayout, star: tuple[float, float], level_px: float,
               token_text: TokenText, label: tuple[str, str]) -> None:
    """The bonus token: an amber star at `star` (bonus_xy) under the end of the accepted path, joined by a dotted
    edge, its label (text, textposition) beside it; its legend entry is _add_legend's star of fixed size (a deep
    tree's star is smaller)."""
    last = ev.accepted[-1] if ev.accepted else 0
    (bx, by), style = star, NODE_GROUPS["bonus"]
    fig.add(type="scatter", x=[layout.x[last], bx], y=[layout.y[last], by], mode="lines", hoverinfo="skip",
            showlegend=False, line=dict(color=BONUS_COLOUR, width=3, dash="dot"))
    fig.add(type="scatter", x=[bx], y=[by], mode="markers+text", name=style["name"], text=[label[0]],
            showlegend=False, legendgroup="bonus", cliponaxis=False,
            textposition=label[1], textfont=dict(size=style["font"], color=style["text"], shadow="auto"),
            marker=dict(color=style["color"], size=marker_px("bonus", level_px), symbol="star",
                        line=dict(color="white", width=1)),
            hovertext=[f"<b>bonus</b> {html.escape(repr(token_text(ev.bonus)))}<br>id {ev.bonus}"], hoverinfo="text")


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
    reason = no_draft_reason(ev, token_text) or "the cost-sized tree chose no draft"
    fig.title(f"Step {ev.step + 1}: drafted nothing, one plain forward<br>"
              f'<span style="font-size:{MIN_FONT}px;color:{REJECTED_TEXT}">{html.escape(reason[:120])}</span>')
    return fig
