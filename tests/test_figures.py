"""Figure builders and the trace format, on hand-made step events (no model needed)."""
from __future__ import annotations

import html
import inspect
import json
import random
import re
from collections import Counter

import pytest

from tr_core.events import StepEvent, SummaryEvent
from present.chart import accepted_chart
from present.chat import coloured_markdown
from present.heatmap import MatrixTracker, heatmap_figure, unique_labels
from present.meter import MeterView, meter_html
from present.style import ACCEPTED_COLOUR, BONUS_COLOUR, CURRENT_COLOUR, REJECTED_COLOUR, ROOT_COLOUR, display_token, symbol_note
from present.tree import BONUS_NODE, SHAPE_LEGEND, SOURCE_NAMES, tree_figure, tree_legend_names
from present.tree_layout import tree_layout
from tr_core.trace import TextAssembler, Trace, TraceError, boundaries_from_texts

VOCAB = {0: "<root>", 1: " the", 2: " cat", 3: " sat", 4: " dog", 5: "the", 6: "\n", 7: " on", 8: " mat", 9: "!"}


def text_of(t: int) -> str:
    return VOCAB.get(t, f"<{t}>")


def make_event(step: int = 0) -> StepEvent:
    """A 7-node tree: root -> {1, 4}; 1 -> {2, 5}; 2 -> {3}; 4 -> {7}. Accepted root-1-2, bonus 8."""
    return StepEvent(
        step=step, position=10 + step, tokens=[0, 1, 4, 2, 5, 7, 3], parents=[-1, 0, 0, 1, 1, 2, 3],
        depths=[0, 1, 1, 2, 2, 2, 3], ranks=[-1, 0, 1, 0, 1, 0, 0], accepted=[0, 1, 3], emitted=[1, 2, 8], bonus=8,
        timings={"draft": 0.1, "forward": 10.0, "verify": 0.2, "commit": 0.1, "update": 0.3, "total": 10.7},
        matrix_rows=[0, 1, 2, 4], matrix_values=[[1, 4], [2, 5], [8, 3], [7, 9]],
        matrix_probs=[[0.7, 0.2], [0.6, 0.3], [0.9, 0.05], [0.5, 0.4]], template="tiny",
    )


def node_traces(fig):
    """The traces that draw the tree's nodes and the bonus star (by name): those with a hover text."""
    return {t["name"]: t for t in fig.traces if "hovertext" in t}


def test_tree_figure_has_every_node_and_marks_the_accepted_path():
    ev = make_event()
    fig = tree_figure(ev, text_of)
    nodes = node_traces(fig)
    assert sum(len(t["x"]) for n, t in nodes.items() if not n.startswith("bonus")) == len(ev.tokens)
    accepted = nodes["accepted"]
    assert accepted["customdata"] == [1, 3]
    assert accepted["marker"]["color"] == ACCEPTED_COLOUR
    assert nodes["rejected"]["marker"]["color"] == REJECTED_COLOUR
    assert sorted(nodes["rejected"]["customdata"]) == [2, 4, 5, 6]
    bonus = nodes["bonus token"]
    assert bonus["marker"]["color"] == BONUS_COLOUR and bonus["text"] == ["␣mat"]
    # the accepted edges (root->1, 1->3) are drawn in the accepted colour, thicker
    path_edges = [t for t in fig.traces if t["mode"] == "lines" and t["line"]["color"] == ACCEPTED_COLOUR
                  and t["x"] != [None]]  # not the legend's swatch
    assert len(path_edges) == 1 and len([v for v in path_edges[0]["x"] if v is None]) == 2
    assert "6 draft tokens → 2 accepted + 1 bonus" in fig.layout["title"]["text"]
    fig.to_plotly()  # valid plotly: every attribute name and value passes plotly's validation
    one = make_event()
    one.tokens, one.parents, one.depths, one.ranks, one.accepted, one.emitted = [0, 1], [-1, 0], [0, 1], [-1, 0], [0, 1], [1, 8]
    assert "Step 1: 1 draft token → 1 accepted + 1 bonus" in tree_figure(one, text_of).layout["title"]["text"]


def test_tree_figure_root_on_top_and_hover_has_id_depth_rank():
    ev = make_event()
    fig = tree_figure(ev, text_of)
    layout = tree_layout(tuple(ev.parents))
    assert layout.y[0] == 0 and all(layout.y[i] == -ev.depths[i] for i in range(len(ev.tokens)))
    hover = " ".join(node_traces(fig)["rejected"]["hovertext"])
    assert "id 4 · depth 1 · rank 1" in hover


def test_tree_layout_is_cached_per_shape_and_children_keep_parent_order():
    tree_layout.cache_clear()
    parents = (-1, 0, 0, 1, 1, 2, 3)
    a = tree_layout(parents)
    assert tree_layout(parents) is a
    assert tree_layout.cache_info().hits == 1
    # node 5 (child of 2) is right of nodes 3 and 4 (children of 1), since 2 is right of 1
    assert a.x[1] < a.x[2] and a.x[3] < a.x[4] < a.x[5]
    # a run alone at its depths hangs straight under where it starts (here under node 1, left of the middle)
    chain = tree_layout((-1, 0, 0, 1, 3, 4, 5))
    assert chain.x[1] < 0.5 and chain.x[3] == chain.x[4] == chain.x[5] == chain.x[6] == chain.x[1]
    # ... but a run under the last of 8 siblings (x = 0.94) steps in once, so its labels have room on both sides
    edge = tree_layout((-1, *[0] * 8, 8, 9, 10))
    assert edge.x[8] > 0.9 and edge.x[9] == edge.x[10] == edge.x[11] == 0.75
    # ... while a run under a node just past 0.75 hangs straight: a small bend left its labels no room
    near = tree_layout((-1, *[0] * 7, 6, 8, 9))
    assert 0.75 < near.x[6] < 0.82 and near.x[8] == near.x[9] == near.x[10] == near.x[6]


def test_tree_layout_puts_children_under_their_parent_a_slot_apart_without_crossings():
    """Each leaf owns an equal slot: a parent stands over its children's middle, nodes of a depth are a slot
    apart, and a depth's left-to-right order follows its parents' (no edges cross); on random trees."""
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(2, 80)
        parents = [-1] + [rng.randrange(i) if rng.random() < 0.7 else i - 1 for i in range(1, n)]
        ranks = [-1] + [rng.randint(0, 12) for _ in range(n - 1)]
        lay = tree_layout(tuple(parents), tuple(ranks))
        kids = {i: [c for c in range(n) if parents[c] == i] for i in range(n)}
        leaves = sum(1 for i in range(n) if not kids[i])
        by_depth: dict[float, list[int]] = {}
        for i in range(n):
            by_depth.setdefault(lay.y[i], []).append(i)
            def lone(j: int) -> bool:  # alone at its depth: under its parent, kept within LONE_X; then whole width
                return sum(lay.y[m] == lay.y[j] for m in range(n)) == 1

            if kids[i] and not lone(i) and not lone(kids[i][0]):
                xs = [lay.x[c] for c in kids[i]]
                assert min(xs) - 1e-9 <= lay.x[i] <= max(xs) + 1e-9  # over its children
        for depth, nodes in by_depth.items():
            if len(nodes) < 2 or depth == 0:
                continue
            xs = sorted(lay.x[i] for i in nodes)
            assert min(b - a for a, b in zip(xs, xs[1:])) >= 1 / leaves - 1e-9
            ordered = sorted(nodes, key=lambda i: lay.x[i])
            px = [lay.x[parents[i]] for i in ordered]
            assert px == sorted(px)  # edges from one depth to the next never cross


def test_tree_figure_handles_any_tree_shape_and_missing_event():
    ev = make_event()
    ev.tokens, ev.parents, ev.depths, ev.ranks, ev.accepted = [0, 1], [-1, 0], [0, 1], [-1, 0], [0]
    ev.bonus, ev.node_probs = None, [1.0, 0.4]
    fig = tree_figure(ev, text_of)
    assert "rejected" in node_traces(fig) and "bonus token" not in node_traces(fig)
    assert "accepted" not in node_traces(fig) and "accepted" not in legend_names(fig)  # none to show
    assert tree_legend_names(ev) == ["root (last committed token)", "rejected", "shape: from the matrix"]
    ev.accepted = [0, 1]
    assert "rejected" not in legend_names(tree_figure(ev, text_of))  # a lone accepted chain: no grey entry
    assert len(tree_figure(None, text_of).traces) == 0


def make_hybrid_event() -> StepEvent:
    """The 7-node tree of a hybrid step (k = 2): node 1 from both sources, 3, 5 and 6 copied from the context."""
    ev = make_event()
    ev.ranks, ev.template = [-1, 0, 1, 2, 1, 2, 2], "hybrid"
    ev.sources = ["root", "both", "matrix", "context", "matrix", "context", "context"]
    run = {"where": "prompt", "first": 2, "match": 2}  # a run of the prompt from its 3rd token
    ev.origins = [None, {**run, "last": 2}, None, {**run, "last": 3}, None,
                  {**run, "where": '<img src=x> "here"', "last": 8}, {**run, "last": 4}]  # node 5: not a place code
    return ev


def node_markers(fig) -> tuple[dict[int, str], dict[int, str]]:
    """Each node's marker symbol and hover text, from the tree figure's node traces."""
    symbols, hovers = {}, {}
    for t in node_traces(fig).values():
        if t["name"].startswith("bonus"):
            continue
        symbol = t["marker"]["symbol"]
        for j, node in enumerate(t["customdata"]):
            symbols[node] = symbol if isinstance(symbol, str) else symbol[j]
            hovers[node] = t["hovertext"][j]
    return symbols, hovers


def legend_names(fig) -> list[str]:
    return [t["name"] for t in fig.traces if t.get("showlegend", True) and "name" in t]


def test_tree_figure_shows_where_each_draft_token_came_from():
    ev = make_hybrid_event()
    fig = tree_figure(ev, text_of)
    symbols, hovers = node_markers(fig)
    assert symbols == {0: "circle", 1: "diamond", 2: "circle", 3: "square", 4: "circle", 5: "square", 6: "square"}
    nodes = node_traces(fig)  # colour still says accepted or rejected
    assert nodes["accepted"]["marker"]["color"] == ACCEPTED_COLOUR
    assert nodes["accepted"]["customdata"] == [1, 3]
    assert nodes["rejected"]["marker"]["color"] == REJECTED_COLOUR
    names = legend_names(fig)
    for name in ("shape: from the matrix", "shape: copied from earlier text", "shape: from the matrix and copied", "accepted",
                 "rejected", "root (last committed token)", "bonus token"):
        assert names.count(name) == 1, name
    keys = {t["name"]: t["marker"]["symbol"] for t in fig.traces if t.get("mode") == "markers"}
    # one rule (a reader took the page's light grey "from the matrix" circle for the tour's grey "rejected"; later
    # ones found no drawn node like an outlined key): shape = where from, its key filled in one dark neutral colour
    # after "shape:"; colour = the verdict, its key a stroke of no shape; the bonus an amber star
    assert keys == {"shape: from the matrix": "circle", "shape: copied from earlier text": "square",
                    "shape: from the matrix and copied": "diamond", "bonus token": "star"}
    shapes = [t["marker"] for t in fig.traces if t.get("name") in SOURCE_NAMES.values()]
    assert {m["color"] for m in shapes} == {SHAPE_LEGEND} and SHAPE_LEGEND not in (REJECTED_COLOUR, ACCEPTED_COLOUR)
    strokes = {t["name"]: t["line"]["color"] for t in fig.traces if t.get("mode") == "lines" and "name" in t}
    assert strokes == {"accepted": ACCEPTED_COLOUR, "rejected": REJECTED_COLOUR,
                       "root (last committed token)": ROOT_COLOUR}
    assert "from the matrix: candidate #1 after &#x27;&lt;root&gt;&#x27;" in hovers[2]  # parent text, escaped
    assert "from the matrix: candidate #1 after &#x27; the&#x27;" in hovers[4]
    assert "copied from the prompt, its 4th token, in a run from its 3rd (after a 2-token match)" in hovers[3]
    assert "rank" not in hovers[3]
    assert "copied from the prompt, its 3rd token (after a 2-token match)<br>and the matrix (candidate #0)" in hovers[1]
    assert "copied from the context, its 9th token, in a run from its 3rd" in hovers[5]  # an unknown place: not echoed
    assert not any("<img" in h for h in hovers.values())
    assert " · root" in hovers[0]
    fig.to_plotly()  # valid plotly: per-point symbols and the legend-only entries


def test_tree_figure_without_context_drafts_keeps_its_legend():
    ev = make_hybrid_event()
    ev.sources = ["root"] + ["matrix"] * 6
    ev.origins = [None] * 7
    fig = tree_figure(ev, text_of)
    symbols, hovers = node_markers(fig)
    assert set(symbols.values()) == {"circle"} and "from the matrix: candidate #2 after" in hovers[3]
    assert not any(n.startswith(("●", "■", "◆")) for n in legend_names(fig))
    shapes = [t["marker"]["symbol"] for t in fig.traces if t.get("name") in SOURCE_NAMES.values()]
    assert shapes == ["circle"]  # the one shape drawn, explained: the same rule as a hybrid tree's
    plain = tree_figure(make_event(), text_of)  # no sources: as before, rank in the hover, one symbol per trace
    assert [t["marker"]["symbol"] for t in node_traces(plain).values()] == ["circle"] * 3 + ["star"]
    assert not any("from the matrix" in h for h in node_markers(plain)[1].values())
    assert len(plain.traces) == 12  # edges, nodes, the bonus's edge and star, the legend's 3 swatches, star, circle
    # each legend entry its own legend group: plotly.js then packs the legend's rows entry by entry
    groups = [t["legendgroup"] for t in plain.traces if t.get("showlegend", True) and "name" in t]
    assert len(groups) == len(set(groups)) == 5
    assert legend_names(plain) == tree_legend_names(make_event())


# ------------------------------------------------------------------------- labels of the 80-node tree

WORDS = [" the", " recycling", "ing", " of", " token", "s", ",", " and", "\n", " a", " model", " tree", " candidate",
         " to", ".", " is", " in", " decoding", " speculative", " it", "ed", " matrix", " we", " that", " draft",
         " accepted", " ", "\n\n", " The", " Luo", " (", " 2", "0", "Hello", " adjacency", " paper", "<b>"]


def words_of(t: int) -> str:
    """Token texts of varied length, with spaces, newlines and text that must be escaped."""
    return WORDS[t % len(WORDS)]


def children_by_rank(parents: list[int], ranks: list[int], node: int) -> list[int]:
    return sorted((i for i, p in enumerate(parents) if p == node), key=lambda i: ranks[i])


def paper_tree_event(turns: tuple[int, ...] = (0, 1, 0), bonus: int | None = 17) -> StepEvent:
    """A step on the paper's 80-node "2.2.2" tree: the accepted path takes candidate turns[d] at depth d + 1."""
    from tr_core.tree import TEMPLATES, build_tree

    tree = build_tree("2.2.2", TEMPLATES["2.2.2"], "cpu")
    parents, depths, ranks = list(tree.parents_list), list(tree.depths_list), list(tree.ranks_list)
    path = [0]
    for turn in turns:
        path.append(children_by_rank(parents, ranks, path[-1])[turn])
    tokens = [(7 * i + 3) % 1000 for i in range(tree.size)]
    return StepEvent(step=11, position=100, tokens=tokens, parents=parents, depths=depths, ranks=ranks, accepted=path,
                     emitted=[tokens[i] for i in path[1:]] + ([bonus] if bonus is not None else []), bonus=bonus,
                     timings={}, template="2.2.2")


def drawn_labels(fig) -> dict[int, tuple[str, str]]:
    """Node -> (text, textposition) of every non-empty label in the tree figure (the bonus as BONUS_NODE)."""
    out = {}
    for t in node_traces(fig).values():
        if "text" not in t:
            continue
        nodes = t.get("customdata", [BONUS_NODE])
        positions = t["textposition"] if isinstance(t["textposition"], list) else [t["textposition"]] * len(nodes)
        out.update({n: (text, pos) for n, text, pos in zip(nodes, t["text"], positions) if text})
    return out


def labelled_nodes(ev: StepEvent) -> set[int]:
    """The nodes the tree labels: the root, the accepted path (past the answer's end too) and the bonus."""
    return {0, *ev.accepted} | ({BONUS_NODE} if ev.bonus is not None else set())


@pytest.mark.parametrize("turns,bonus,hybrid", [((0, 1, 0), 17, False), ((0, 0, 0, 0, 0, 0), 4, False),
                                                ((1, 0), 30, False), ((), 8, False), ((0, 0, 1), None, False),
                                                ((0, 1, 0), 17, True)])
def test_the_80_node_tree_labels_its_root_accepted_path_and_bonus_and_every_node_hovers(turns, bonus, hybrid):
    ev = paper_tree_event(turns, bonus)
    if hybrid:  # per-node marker symbols and a grouped legend
        ev.sources = ["root"] + ["matrix", "context", "both"] * 26 + ["matrix", "context"]
    assert len(ev.tokens) == 81 and Counter(ev.depths)[2] == 21 and Counter(ev.depths)[3] == 25
    fig = tree_figure(ev, words_of)
    labels = drawn_labels(fig)
    assert set(labels) == labelled_nodes(ev)
    for node, (text, position) in labels.items():
        shown = display_token(words_of(bonus if node == BONUS_NODE else ev.tokens[node]), 8)
        assert text in (shown, f"“{shown}”")  # a lone punctuation mark in quotes
        assert position in (("top center",) if node == 0 else ("middle left", "middle right"))
    _, hovers = node_markers(fig)
    assert sorted(hovers) == list(range(81))  # every node's token on hover, labelled or not
    for i, hover in hovers.items():
        assert f"<b>{html.escape(repr(words_of(ev.tokens[i])))}</b>" in hover
    rejected = node_traces(fig)["rejected"]
    assert not any(rejected["text"]) and len(rejected["text"]) == 81 - len(ev.accepted)  # hover only
    fig.to_plotly()


def test_a_label_stands_away_from_the_edge_into_its_node_and_the_root_is_labelled_above(monkeypatch):
    """The rule before a label moves off a marker it would cover (test_a_path_label_moves_off_a_sibling_marker...)."""
    import present.tree as tree
    from present.tree import UNDER_X, X_RANGE

    monkeypatch.setattr(tree, "clear_of_markers", lambda ev, layout, level, labels: labels)
    for turns in ((0, 1, 0), (1, 0), (7,), (0, 0, 1)):
        ev = paper_tree_event(turns, 17)
        layout = tree_layout(tuple(ev.parents), tuple(ev.ranks))
        labels = drawn_labels(tree_figure(ev, words_of))
        assert labels[0][1] == "top center"
        for node in ev.accepted[1:]:
            dx = layout.x[node] - layout.x[ev.parents[node]]
            if abs(dx) >= UNDER_X:  # the edge comes in from the other side: it crosses no label
                assert labels[node][1] == ("middle right" if dx > 0 else "middle left"), (turns, node)
    right = paper_tree_event((7,), 3)  # the root's last candidate, at the right edge: its label goes right...
    node = right.accepted[1]
    assert drawn_labels(tree_figure(right, words_of))[node][1] == "middle right"
    assert X_RANGE[1] - tree_layout(tuple(right.parents), tuple(right.ranks)).x[node] >= 0.15  # ... with room


def test_a_long_copied_run_is_labelled_on_alternate_sides():
    # a recorded hybrid step (Chinese text: every label a split character's bytes): the accepted path zig-zags over
    # the matrix's candidates, then runs 10 tokens copied from the context down one column, whose levels are closer
    # than a label is tall: labels on one side would run into each other
    parents = [-1, 0, 0, 2, 2, 2, 2, 4, 5, 2, 2, 8, 8, 5, 13, *range(14, 24)]
    depths = [0, 1, 1, 2, 2, 2, 2, 3, 3, 2, 2, 4, 4, 3, 4, *range(5, 15)]
    ranks = [-1, 0, 1, 2, 3, 0, 1, 0, 0, 4, 5, 0, 1, 1, 0, 0, *[8] * 9]
    accepted = [0, 2, 5, 13, *range(14, 25)]
    sources = ["root", "matrix", "both", "matrix", "matrix", "both", *["matrix"] * 7, "both", "both", "both",
               *["context"] * 9]
    tokens = list(range(100, 125))
    ev = StepEvent(step=33, position=200, tokens=tokens, parents=parents, depths=depths, ranks=ranks,
                   accepted=accepted, emitted=[tokens[i] for i in accepted[1:]] + [7], bonus=7, timings={},
                   template="hybrid", sources=sources)
    text = lambda t: f"‹{t % 256:02x}›"  # noqa: E731  (as a split character's bytes read)
    fig = tree_figure(ev, text)
    labels = drawn_labels(fig)
    assert set(labels) == labelled_nodes(ev)
    layout = tree_layout(tuple(ev.parents), tuple(ev.ranks))
    run = [i for i in accepted[1:] if layout.x[i] == layout.x[ev.parents[i]]]  # hanging straight under the last
    assert len(run) >= 9
    for node in run:
        assert {labels[node][1], labels[ev.parents[node]][1]} == {"middle left", "middle right"}, node
    assert labels[BONUS_NODE][1] != labels[accepted[-1]][1]  # the star under the run's end takes the other side
    roomy = paper_tree_event((0, 0, 0, 0, 0, 0), 4)  # a chain where levels have room: no need to alternate
    sides = {drawn_labels(tree_figure(roomy, words_of))[i][1] for i in roomy.accepted[1:]}
    assert len(sides) == 1


def deep_run_event(depth: int, siblings: int = 7, second_run: bool = False) -> StepEvent:
    """A hybrid step whose accepted path takes the root's last matrix candidate, then a run copied from the context
    down to `depth` (the README's screenshot: 16 tokens in one step). `second_run`: the first candidate starts a
    rejected copied run as deep, so both bottom corners of the plot hold nodes."""
    parents, depths, ranks = [-1] + [0] * siblings, [0] + [1] * siblings, [-1] + list(range(siblings))
    sources = ["root"] + ["matrix"] * siblings
    accepted = [0, siblings]
    starts = [(siblings, True)] + ([(1, False)] if second_run else [])
    for start, keep in starts:
        node = start
        for d in range(2, depth + 1):
            parents.append(node), depths.append(d), ranks.append(8), sources.append("context")
            node = len(parents) - 1
            if keep:
                accepted.append(node)
    tokens = list(range(len(parents)))
    return StepEvent(step=68, position=300, tokens=tokens, parents=parents, depths=depths, ranks=ranks,
                     accepted=accepted, emitted=[tokens[i] for i in accepted[1:]] + [99], bonus=99, timings={},
                     template="hybrid", sources=sources)


@pytest.mark.parametrize("depth", [12, 16, 18, 22])
def test_a_deep_copied_run_draws_beads_and_its_star_clear_of_the_last_node(depth):
    # The README's first screenshot: 16 copied tokens accepted in one step; the markers merged into one green bar
    # and the bonus star covered the last node.
    from present.tree import MIN_MARKER, marker_px, star_clear_px

    ev = deep_run_event(depth)
    fig = tree_figure(ev, words_of)
    margin, (bottom, top) = fig.layout["margin"], fig.layout["yaxis"]["range"]
    level = (fig.layout["height"] - margin["t"] - margin["b"]) / (top - bottom)  # px between depths, as drawn
    sizes = {t["name"]: t["marker"]["size"] for t in node_traces(fig).values()}
    assert MIN_MARKER <= sizes["accepted"] <= level  # beads, not one bar: two levels' markers do not overlap
    assert depth < 16 or sizes["accepted"] < 22
    star = node_traces(fig)["bonus token"]
    last = ev.accepted[-1]
    drop_px = (-ev.depths[last] - star["y"][0]) * level
    assert drop_px + 1e-9 >= star_clear_px(level) >= (marker_px("bonus", level) + sizes["accepted"]) / 2
    assert bottom <= star["y"][0] - 0.3 and top > 0  # the star and the root's label inside the y range
    labels = drawn_labels(fig)
    assert set(labels) == labelled_nodes(ev)
    run = ev.accepted[2:]
    assert all(labels[a][1] != labels[b][1] for a, b in zip(run, run[1:]))  # alternate sides down the run
    assert fig.layout["legend"]["orientation"] == "h"  # the legend under the plot, placed by plotly
    fig.to_plotly()


def test_a_deep_rejected_run_under_a_short_path_is_cut_and_counted():
    # The README's screenshot: 2 drafts accepted, a rejected copied run 18 levels deep squeezed every level into
    # 10 px and the accepted path's labels into each other
    from present.tree import DRAWN_LEVELS

    ev = deep_run_event(18)
    ev.accepted = ev.accepted[:3]  # the run's first copied token accepted, the rest rejected
    ev.emitted = [ev.tokens[i] for i in ev.accepted[1:]] + [99]
    fig = tree_figure(ev, words_of)
    drawn = [y for t in node_traces(fig).values() for y in t["y"] if y is not None]
    assert min(drawn) == -DRAWN_LEVELS and set(drawn_labels(fig)) == labelled_nodes(ev)
    cut = [t for t in fig.traces if t.get("mode") == "text"]
    assert len(cut) == 1 and cut[0]["text"] == [f"⋮ +{18 - DRAWN_LEVELS} deeper"]
    assert cut[0]["x"] == [tree_layout(tuple(ev.parents), tuple(ev.ranks)).x[ev.accepted[-1]]]
    edges = [y for t in fig.traces if t.get("mode") == "lines" for y in t["y"] if y is not None]
    assert min(edges) == -DRAWN_LEVELS
    whole = deep_run_event(18)  # accepted all the way down: every level drawn, nothing counted
    assert not [t for t in tree_figure(whole, words_of).traces if t.get("mode") == "text"]


def test_the_bonus_star_keeps_off_the_drafts_under_the_paths_end_and_labels_away_from_it():
    ev = paper_tree_event((0, 1, 0), 17)  # the path ends above more drafts, levels too close to drop the star
    fig = tree_figure(ev, words_of)
    layout, last = tree_layout(tuple(ev.parents), tuple(ev.ranks)), ev.accepted[-1]
    star, labels = node_traces(fig)["bonus token"], drawn_labels(fig)
    assert any(d == ev.depths[last] + 1 for d in ev.depths)
    assert star["x"][0] != layout.x[last] and layout.y[last] - 1 < star["y"][0] < layout.y[last]  # aside, between rows
    assert labels[BONUS_NODE][1] == ("middle right" if star["x"][0] > layout.x[last] else "middle left")  # its way
    assert labels[BONUS_NODE][1] != labels[last][1]  # the node's label on the other side of the node
    small = make_event()  # levels with room: straight under the path's end, its label on the same side
    star, labels = node_traces(tree_figure(small, text_of))["bonus token"], drawn_labels(tree_figure(small, text_of))
    assert star["x"][0] == tree_layout(tuple(small.parents), tuple(small.ranks)).x[small.accepted[-1]]
    assert labels[BONUS_NODE][1] == labels[small.accepted[-1]][1]


def test_the_tree_title_counts_the_tokens_the_step_emitted():
    ev = make_event()
    assert "2 accepted + 1 bonus" in tree_figure(ev, text_of).to_plotly()["layout"]["title"]["text"]
    ev.emitted, ev.bonus = [1], None  # an end-of-turn token cut the accepted path after its first token
    # the model accepted both drafts; the answer kept one: the title says both, as the story and microscope do
    assert "6 draft tokens → 2 accepted, 1 kept (the answer ended)" in tree_figure(ev, text_of).layout["title"]["text"]
    ev.emitted = [1, 2]  # the length limit right at the path's end: all kept, no bonus
    assert "2 accepted + 0 bonus" in tree_figure(ev, text_of).layout["title"]["text"]


def test_accepted_drafts_past_the_answers_end_are_drawn_apart_from_those_it_kept():
    """A cold reader saw the dropped draft with the same green as the kept ones ("16 accepted, 15 kept")."""
    from present.nodes import node_groups
    from present.style import PAST_END_COLOUR

    ev = make_event()
    path = ev.accepted[1:]
    ev.emitted, ev.bonus = [ev.tokens[path[0]]], None  # the answer ended after the first accepted draft
    groups = node_groups(ev)
    assert groups["accepted"] == path[:1] and groups["past end"] == path[1:]
    fig = tree_figure(ev, text_of)
    nodes = node_traces(fig)
    past = nodes["accepted, past the answer's end (not kept)"]
    assert past["marker"]["color"] == PAST_END_COLOUR and past["customdata"] == path[1:]
    assert all(text for text in past["text"])  # labelled, as the kept path is
    assert nodes["accepted"]["customdata"] == path[:1]
    edges = [t for t in fig.traces if t.get("mode") == "lines" and t["line"]["color"] == PAST_END_COLOUR
             and t["x"] != [None]]
    assert len(edges) == 1 and edges[0]["x"].count(None) == len(path) - 1  # the edge into each dropped draft
    assert "accepted, past the answer's end (not kept)" in tree_legend_names(ev)
    ev.emitted, ev.bonus = [ev.tokens[i] for i in path] + [9], 9  # nothing cut: no such group, edge or entry
    assert node_groups(ev)["past end"] == [] and not any(
        t["line"]["color"] == PAST_END_COLOUR for t in tree_figure(ev, text_of).traces if t.get("mode") == "lines")


def test_hostile_token_text_is_escaped_in_labels_and_hovers():
    ev = paper_tree_event()
    hostile = {ev.tokens[i] for i in ev.accepted} | {ev.bonus, ev.tokens[5]}  # node 5 is rejected
    text = lambda t: "<b>x" if t in hostile else words_of(t)  # noqa: E731
    fig = tree_figure(ev, text)
    labels = drawn_labels(fig)
    assert all(labels[n][0] == "&lt;b&gt;x" for n in labelled_nodes(ev))
    assert not any("<" in label for label, _ in labels.values())
    _, hovers = node_markers(fig)
    assert "&lt;b&gt;x" in hovers[5] and all(h.count("<b>") == 1 for h in hovers.values())  # the token in bold
    assert "<b>x" not in json.dumps(fig) and "&lt;b&gt;x" in node_traces(fig)["bonus token"]["hovertext"][0]


def test_siblings_are_laid_out_in_candidate_rank_order():
    ev = paper_tree_event()
    layout = tree_layout(tuple(ev.parents), tuple(ev.ranks))
    parents_with_kids = {p for p in ev.parents if p >= 0}
    assert len(parents_with_kids) > 20
    for p in parents_with_kids:
        xs = [layout.x[i] for i in children_by_rank(ev.parents, ev.ranks, p)]
        assert xs == sorted(xs) and len(set(xs)) == len(xs)
    # a grown tree whose node order is not rank order (k = 2: ranks 2 and 3 are context-only drafts)
    parents, ranks = (-1, 0, 0, 0, 0, 1, 1), (-1, 2, 0, 3, 1, 1, 0)
    mixed = tree_layout(parents, ranks)
    assert mixed.x[2] < mixed.x[4] < mixed.x[1] < mixed.x[3]  # ranks 0, 1, then the context's 2, 3
    assert mixed.x[6] < mixed.x[5]
    assert tree_layout(parents).x[1] < tree_layout(parents).x[2]  # without ranks: node order, as before


def test_a_small_tree_labels_its_path_too_and_its_drafts_on_hover():
    from tr_core.tree import TEMPLATES, build_tree

    tree = build_tree("chain-4", TEMPLATES["chain-4"], "cpu")
    ev = make_event()
    ev.tokens, ev.accepted, ev.bonus = [1, 2, 3, 4, 5], [0, 1, 2], 6
    ev.parents, ev.depths, ev.ranks = list(tree.parents_list), list(tree.depths_list), list(tree.ranks_list)
    fig = tree_figure(ev, text_of)
    assert set(drawn_labels(fig)) == {0, 1, 2, 3, 4, BONUS_NODE}  # a chain has room for its rejected drafts' too
    _, hovers = node_markers(fig)
    assert html.escape(repr(text_of(4))) in hovers[3] and html.escape(repr(text_of(5))) in hovers[4]


def test_a_lone_punctuation_mark_is_labelled_in_quotes_so_it_can_be_seen():
    from present.style import node_label

    assert [node_label(t, 8) for t in (",", "_", "'", "(", ".")] == ["“,”", "“_”", "“'”", "“(”", "“.”"]
    assert [node_label(t, 8) for t in ("a", "7", " ", "\n", "", " the", ",,")] == ["a", "7", "␣", "↵", "∅", "␣the", ",,"]
    ev = make_event()
    labels = drawn_labels(tree_figure(ev, lambda t: "," if t == ev.tokens[1] else text_of(t)))
    assert labels[1][0] == "“,”"


def test_tree_explains_its_symbols_only_when_a_label_shows_them():
    def note(fig) -> str:
        return fig.layout["legend"].get("title", {}).get("text", "").strip()

    fig = tree_figure(make_event(), text_of)  # labels " the" as "␣the": the legend starts with its meaning
    assert note(fig) == "␣ = space" and not fig.layout.get("annotations")
    assert fig.layout["legend"]["title"]["font"]["size"] >= 16
    fig = tree_figure(make_event(), lambda t: "\n" if t == 2 else text_of(t))  # and node 3 as "↵"
    assert note(fig) == "␣ = space · ↵ = new line"
    rejected = tree_figure(make_event(), lambda t: "\n" if t == 4 else text_of(t))  # 4: rejected, labelled (room)
    assert note(rejected) == "␣ = space · ↵ = new line" and "↵" in node_traces(rejected)["rejected"]["text"]
    assert note(tree_figure(make_event(), lambda t: f"w{t}")) == ""
    assert symbol_note(["a", "b"]) == "" and symbol_note(["x\u2423", "∅"]) == "␣ = space · ∅ = empty token"
    hybrid = make_hybrid_event()
    for ev in (make_event(), hybrid, paper_tree_event()):
        assert tree_legend_names(ev) == legend_names(tree_figure(ev, text_of))


def _second_step_rewrites_row_9(accepted: list[int] | None = None):
    """A tracker after two steps, the second rewriting only row 9 (and accepting `accepted`, if given)."""
    tracker = MatrixTracker()
    first = make_event(0)
    tracker.update(first)
    later = make_event(1)
    later.matrix_rows, later.matrix_values, later.matrix_probs = [9], [[1, 2]], [[0.5, 0.5]]
    if accepted is not None:
        later.accepted = accepted
    tracker.update(later)
    return tracker, first, later


def test_heatmap_says_it_shows_the_matrix_after_the_step_and_why_these_rows():
    tracker, first, later = _second_step_rewrites_row_9()
    title = heatmap_figure(tracker, later, text_of).layout["title"]["text"]
    assert "Adjacency matrix after step 2" in title
    assert "● rows this step rewrote (accepted path first)" in title and "others: most hits so far" in title
    fig = heatmap_figure(tracker, first, text_of)
    assert "after step 1" in fig.layout["title"]["text"] and "␣ = space" in fig.layout["xaxis"]["title"]["text"]
    none = make_event(2)
    none.matrix_rows, none.matrix_values, none.matrix_probs = [], [], []
    assert "rewrote none of these rows" in heatmap_figure(tracker, none, text_of).layout["title"]["text"]
    fig.to_plotly()
    many = make_event(3)  # more rows rewritten than the window holds: the line says how many it shows
    many.matrix_rows = list(range(20, 28))
    many.matrix_values, many.matrix_probs = [[1, 2]] * 8, [[0.5, 0.5]] * 8
    tracker.update(many)
    assert "● 6 of the 8 rows this step rewrote" in heatmap_figure(tracker, many, text_of).layout["title"]["text"]


def test_matrix_hits_leave_out_tokens_copied_from_the_context():
    tracker = MatrixTracker()
    tracker.update(make_hybrid_event())  # accepted: node 1 (both, row of token 0), node 3 (context only, row of 1)
    assert tracker.hits == {0: 1}
    tracker = MatrixTracker()
    tracker.update(make_event())
    assert tracker.hits == {0: 1, 1: 1}


def test_heatmap_labels_are_unique_and_rows_touched_this_step_come_first():
    tracker = MatrixTracker()
    ev = make_event()
    tracker.update(ev)
    fig = heatmap_figure(tracker, ev, text_of)
    heat = fig.traces[0]
    labels = heat["y"][::-1]
    fig.to_plotly()
    assert len(labels) == len(set(labels)) == 4
    assert labels[0] == "● ‹root›" and labels[1] == "● ␣the"  # accepted path rows first: root, " the", " cat"
    assert heat["z"][::-1][0] == [0.7, 0.2]
    assert unique_labels([1, 5, 1], lambda t: "x") == ["x #1", "x #5", "x #1"]
    assert tracker.hits[0] == 1 and tracker.hits[1] == 1  # root row's rank-0 candidate and " the" row's accepted


def test_heatmap_labels_fit_their_cells_and_hover_has_the_whole_token():
    """A cold reader met "<|im_...<|end..." running over two cells: a special token is its short sign, a long token
    is cut with '…' to its cell's width, in the cells and the row labels; hover has the whole token."""
    from present.heatmap import CELL_EM, ROW_EM
    from present.style import fit_token, short_special, text_em

    words = {0: "<|im_end|>", 1: " determined", 2: "<|im_start|>", 3: "\n\n\n\n\n", 4: " a", 5: "<b>"}
    ev = StepEvent(step=0, position=5, tokens=[0, 1], parents=[-1, 0], depths=[0, 1], ranks=[-1, 0], accepted=[0],
                   emitted=[2], bonus=2, timings={}, matrix_rows=[0, 1], matrix_values=[[2, 1, 3, 4], [0, 5, 4, 3]],
                   matrix_probs=[[0.4, 0.3, 0.2, 0.1]] * 2)
    tracker = MatrixTracker()
    tracker.update(ev)
    heat = heatmap_figure(tracker, ev, words.__getitem__).traces[0]
    cells = [html.unescape(t) for row in heat["text"] for t in row]
    assert "‹end›" in cells and "‹start›" not in cells and "‹sta…" in cells and "␣determined" not in cells
    assert all(text_em(t) <= CELL_EM for t in cells), cells
    assert not any("<|" in t for t in cells + heat["y"])
    assert "● ‹end›" in heat["y"] and "● ␣determined" in heat["y"]  # 11 monospaced characters: the label fits
    assert all(len(lab) - 2 <= ROW_EM / 0.6 for lab in heat["y"])
    hover = " ".join(h for row in heat["hovertext"] for h in row)
    assert "&#x27;&lt;|im_end|&gt;&#x27;" in hover or "'&lt;|im_end|&gt;'" in hover, hover
    assert short_special("</s>") == "‹/s›" and short_special("a<|b|>") == "a<|b|>" and fit_token(" a", 3) == "␣a"
    assert fit_token(" determined", 6.6, mono=True) == "␣determined" and fit_token(" determined!", 6.6, True) == "␣determine…"


def test_heatmap_keeps_most_hit_rows_from_earlier_steps():
    tracker, _, later = _second_step_rewrites_row_9(accepted=[0])
    rows = tracker.window(later, max_rows=4)
    assert rows[0] == 9 and set(rows[1:]) <= {0, 1, 2, 4}


def test_accepted_chart_and_meter():
    events = [make_event(i) for i in range(3)]
    fig = accepted_chart(events, current=1)
    assert fig.traces[0]["y"] == [3, 3, 3] and fig.traces[0]["marker"]["color"][1] == CURRENT_COLOUR
    (mean,) = fig.layout["annotations"]  # the mean's label: in the right margin, off the bars (a reader misread one)
    assert mean["text"] == "mean<br>3.00" and mean["x"] >= 1.0 and mean["xanchor"] == "left" and mean["y"] == 3.0
    assert fig.layout["margin"]["r"] >= 40
    fig.to_plotly()
    assert json.loads(fig.to_json())["data"][0]["type"] == "bar"
    html = meter_html(MeterView(state="measured", tr_tps=30.0, plain_tps=15.0, ratio=2.0, error=0.05,
                                mean_accepted=2.5, identical=True))
    assert "2.00× ± 0.05" in html and "token-identical" in html and "measured" in html and "tr-ratio-up" in html
    off = meter_html(MeterView(state="off", tr_tps=30.0))
    assert "not measured" in off and "not compared" in off and "×" not in off.split('id="tr-ratio">')[1][:5]
    assert "✗" in meter_html(MeterView(state="measured", ratio=1.0, error=0.01, identical=False, exact=True))
    # outside exact mode (or before it was recorded) a difference is rounding at a near tie, not a broken promise
    assert "≈ identical up to rounding" in meter_html(MeterView(state="measured", ratio=1.0, identical=False))


def test_the_chart_credits_the_answers_accepted_drafts_to_their_source():
    from present.chart import accepted_chart_explained, draft_credit

    events = [make_event(i) for i in range(3)]
    accepted = sum(len(e.accepted) - 1 for e in events)
    tokens = sum(len(e.emitted) for e in events)
    assert draft_credit(events) == f"{tokens} tokens = {accepted} accepted drafts (all from the matrix) + 3 bonus"
    hybrid = make_event(0)
    hybrid.sources = ["root"] + ["matrix"] * (len(hybrid.tokens) - 1)
    path = hybrid.accepted[1:]
    hybrid.sources[path[0]] = "context"
    if len(path) > 1:
        hybrid.sources[path[1]] = "both"
    text = draft_credit([hybrid])
    assert text == (f"{len(hybrid.emitted)} tokens = {len(path)} accepted drafts ({len(path) - min(len(path), 2)} "
                    f"from the matrix, 1 copied, {1 if len(path) > 1 else 0} both) + 1 bonus")
    chart = accepted_chart_explained([hybrid]).layout
    assert chart["xaxis"]["title"]["text"] == "step<br>" + text.replace(" + ", "<br>+ ")  # on two lines under the axis
    assert chart["margin"]["b"] >= 40 + 2 * 14 and chart["height"] == 240 + 34  # with room for them
    # the answer's last step accepted its whole path, but the end-of-turn token cut it after the first draft: the
    # credits count the drafts the answer holds (the chart's bars), as many as its tokens less one bonus a step
    cut = make_event(3)
    cut.emitted, cut.bonus = cut.emitted[:1], None
    steps = events + [cut]
    caption = draft_credit(steps)
    assert caption.endswith("+ 3 bonus (one a step, none in the last step, where the answer ended)")  # 4 steps, 3 bonuses: said why
    tokens, credited, bonuses = map(int, re.match(r"(\d+) tokens = (\d+) accepted drafts \(.*\) \+ (\d+) bonus",
                                                  caption).groups())
    assert credited == sum(len(e.emitted) - (e.bonus is not None) for e in steps) == accepted + 1
    assert tokens == credited + bonuses == sum(len(e.emitted) for e in steps) and bonuses == 3  # the cut step: none
    assert len(cut.accepted) - 1 > 1  # the path it accepted was longer than what it emitted


def test_the_meters_speeds_divide_to_its_ratio_as_shown():
    def shown(html, cell):
        return float(html.split(f'id="{cell}">')[1].split("<")[0])

    # the case a cold reader divided: 31.43 / 21.30 = 1.4756 (1.48×), but 31.4 / 21.3 = 1.474 (1.47×)
    view = MeterView(state="measured", tr_tps=31.43, plain_tps=31.43 / 1.4756, ratio=1.4756, error=0.08)
    html = meter_html(view)
    assert "1.48×" in html and round(shown(html, "tr-tps") / shown(html, "tr-plain"), 2) == 1.48
    assert shown(html, "tr-tps") == 31.43  # two decimals were needed here
    rng = random.Random(7)
    for _ in range(300):
        plain, ratio = rng.uniform(5, 60), rng.uniform(0.3, 3.5)
        if abs(ratio * 100 % 1 - 0.5) < 0.01:  # within 1e-4 of a rounding edge, 3 decimals may not settle it
            continue
        html = meter_html(MeterView(state="measured", tr_tps=plain * ratio, plain_tps=plain, ratio=ratio, error=0.1))
        figure = float(html.split('id="tr-ratio">')[1].split("×")[0])
        assert round(shown(html, "tr-tps") / shown(html, "tr-plain"), 2) == figure
    one = meter_html(MeterView(state="measured", tr_tps=30.0, plain_tps=15.0, ratio=2.0, error=0.05))
    assert shown(one, "tr-tps") == 30.0 and 'id="tr-tps">30.0<' in one  # one decimal when it agrees


def test_meter_colour_follows_meaning_and_noise_says_noisy():
    slow = meter_html(MeterView(state="measured", ratio=0.22, error=0.01, mean_accepted=2.9))
    assert "tr-ratio-down" in slow and "tr-ratio-up" not in slow and "slower" in slow
    par = meter_html(MeterView(state="measured", ratio=1.03, error=0.04))
    assert "tr-ratio-par" in par
    unsure = meter_html(MeterView(state="measured", ratio=1.10, error=0.12))  # the error bar crosses 1
    assert "tr-ratio-par" in unsure
    noisy = meter_html(MeterView(state="noisy", tr_tps=10.0, plain_tps=2.0, note="the machine was busy"))
    ratio_text = noisy.split('id="tr-ratio">')[1].split("<")[0]
    assert ratio_text == "too noisy to measure" and "busy" in noisy


def test_untrusted_text_cannot_carry_html_or_images():
    from present.chat import safe_markdown

    out = safe_markdown('<img src="http://x/a.png"> ![t](http://x/b.png) [l](http://x) `<b>`')
    assert "<img" not in out and "![" not in out and "&#91;l]" in out and "`<b>`" in out
    coloured = coloured_markdown('<img src=x onerror=alert(1)>![a](http://x/c.png)', [5, 40])
    assert "<img" not in coloured and "![" not in coloured and "tr-run-a" in coloured
    assert "&lt;" in display_token("<b>") and "<" not in display_token("<b>")
    # addresses a markdown renderer links by itself show as the same text, but match no link (code stays as it is)
    linked = safe_markdown("www.example.com <http://x.org/a> a@b.org WWW.Y.ORG `http://code`")
    assert not re.search(r"(?i)www\.|://|@", linked.replace("`http://code`", ""))
    assert html.unescape(linked) == "www.example.com <http://x.org/a> a@b.org WWW.Y.ORG `http://code`"


def test_coloured_markdown_keeps_inline_code_and_block_markers_plain():
    text = "Here:\n```python\nprint('x')\n```\n- item `a<b`\n# Title"
    bounds = [3, 20, 35, len(text)]
    out = coloured_markdown(text, bounds)
    assert "`a<b`" in out  # inline code untouched, not escaped
    assert "\n- " in out and "\n# " in out  # block markers stay at line start
    assert 'class="tr-run-a"' in out and 'class="tr-run-b"' in out
    plain = coloured_markdown("1 < 2 & 3", [9])
    assert "&lt;" in plain and "&amp;" in plain
    assert "```python\nprint('x')\n```" in coloured_markdown(text, bounds, colour=False)  # no colour: a fence


def _text_of(out: str) -> str:
    """What a browser shows of coloured markdown's HTML parts: tags dropped, references resolved."""
    return html.unescape(re.sub(r"<[^>]+>", "", out))


def test_a_fenced_code_block_carries_its_steps_colours_as_escaped_html():
    from present.chat import CODE_CLOSE, CODE_OPEN

    body = "def f(x):\n    return x < 2 and [x] != '<b>'\n"
    text = f"Code:\n\n```python\n{body}```\n\nDone."
    bounds = [6, 22, 31, 45, 60, len(text)]
    out = coloured_markdown(text, bounds)
    block = out[out.index(CODE_OPEN): out.index(CODE_CLOSE) + len(CODE_CLOSE)]
    assert out.startswith('<span class="tr-run-a">Code:</span>\n\n' + CODE_OPEN)  # the fence line gives way
    assert "```" not in out and "python" not in out  # ... its language with it
    assert _text_of(block) == body  # the code's text, exactly (its last newline before the closing tag)
    assert "<b>" not in block and "&#91;" not in block  # HTML escaped; markdown is not read inside <pre>
    assert 'class="tr-run-b"' in block and 'class="tr-run-a"' in block
    assert "\n    <span" in block  # indentation outside the spans
    assert out.endswith(CODE_CLOSE + '\n\n<span class="tr-run-b">Done.</span>')
    # every run's span closes on its own line
    assert all(line.count("<span") == line.count("</span>") for line in out.split("\n"))


def test_a_code_block_still_streaming_is_closed_and_odd_fences_stay_markdown():
    from present.chat import CODE_CLOSE, CODE_OPEN

    streaming = coloured_markdown("Code:\n~~~\nx = 1\ny", [8, 15, 16])
    assert streaming.endswith(CODE_CLOSE) and streaming.count(CODE_OPEN) == 1
    assert _text_of(streaming) == "Code:\nx = 1\ny"
    just_opened = coloured_markdown("Code:\n```py", [6, 11])
    assert just_opened.endswith(CODE_OPEN + CODE_CLOSE)
    deep = "Text\n\n    ```\n    x < 1\n    ```\n"  # indented 4: an indented code block, left as it is
    assert "    ```\n    x < 1\n    ```" in coloured_markdown(deep, [3, len(deep)])
    listed = coloured_markdown("1. item\n   ```\n   x = 1\n   ```\n", [10, 30])
    assert listed.startswith('1. <span class="tr-run-a">item</span>\n   ' + CODE_OPEN)  # its indent kept


def test_marked_markdown_outlines_only_the_shown_steps_run():
    from present.chat import marked_markdown, safe_markdown

    text = "Here:\n```python\nprint('x')\n```\n- item `a<b`\n# Title <b>"
    bounds = [3, 20, 35, len(text)]
    assert marked_markdown(text, bounds, current=-1) == coloured_markdown(text, bounds)  # nothing marked: the same
    assert marked_markdown(text, bounds, current=-1, colour=False) == safe_markdown(text)
    out = marked_markdown(text, bounds, current=3)
    assert out.count("tr-run-current") == out.count('class="tr-run-b tr-run-current"') > 0  # step 3 alone
    assert out.replace(" tr-run-current", "") == coloured_markdown(text, bounds)  # same text, spans and escaping
    bare = marked_markdown(text, bounds, current=0, colour=False)
    assert bare.startswith('<span class="tr-run-current">Her</span>') and "tr-run-a" not in bare and "<b>" not in bare


def test_accepted_chart_explained_has_a_legend_for_each_colour():
    from present.chart import accepted_chart_explained

    events = [make_event(i) for i in range(3)]
    fig = accepted_chart_explained(events, current=1)
    legend = {t["name"]: t["marker"]["color"] for t in fig.traces if t.get("showlegend")}
    assert legend == {"tokens a step gained (the accepted drafts it kept + bonus)": ACCEPTED_COLOUR,
                      "step 2: the step shown in the tree": CURRENT_COLOUR}
    assert fig.traces[0]["marker"]["color"] == accepted_chart(events, current=1).traces[0]["marker"]["color"]
    assert fig.layout["showlegend"] and fig.to_plotly()  # valid plotly
    live = accepted_chart_explained(events)  # while streaming no step is singled out: no pink entry
    assert [t["name"] for t in live.traces if t.get("showlegend")] == ["tokens a step gained (the accepted drafts it kept + bonus)"]
    assert accepted_chart_explained([]).traces == []


def test_the_step_shown_has_one_colour_and_orange_is_the_bonus_alone():
    """The step shown is CURRENT_COLOUR in the chart, the chat's outline and the offline replay's; the bonus token's
    orange marks nothing else there (a reader counted four meanings of orange)."""
    from pathlib import Path

    from present import replay

    css = Path(__file__).resolve().parents[1].joinpath("assets", "studio.css").read_text()
    current_rule = next(line for line in css.splitlines() if line.startswith(".tr-run-current"))
    replay_rule = next(line for line in inspect.getsource(replay).splitlines() if ".run.current" in line)
    for rule in (current_rule, replay_rule):
        assert CURRENT_COLOUR in rule and BONUS_COLOUR not in rule
    bars = accepted_chart([make_event(i) for i in range(3)], current=2).traces[0]["marker"]["color"]
    assert bars[2] == CURRENT_COLOUR and BONUS_COLOUR not in bars


def test_display_token_shows_whitespace():
    assert display_token(" a\n") == "␣a↵" and display_token("") == "∅" and display_token("abcdefghijkl", 5) == "abcd…"


def test_trace_round_trip_and_errors(tmp_path):
    trace = Trace(model="tiny", settings={"template": "tiny"}, messages=[{"role": "user", "content": "hi"}])
    asm = TextAssembler(lambda ids: "".join(text_of(t) for t in ids))
    for i in range(2):
        ev = make_event(i)
        trace.add_step(ev, text_of)
        asm.push(ev.emitted)
    trace.step_texts = asm.step_texts()
    trace.summary = SummaryEvent(tokens=[1, 2, 8, 1, 2, 8], prompt_tokens=5, new_tokens=6, steps=2, mean_accepted=3.0,
                                 tokens_per_s=100.0, prefill_s=0.1, decode_s=0.06, wall_s=0.16, stop_reason="length",
                                 method="recycling", template="tiny", matrix_rows_filled=5, matrix_mb=0.1)
    path = trace.save(tmp_path / "t.json")
    back = Trace.load(path)
    assert back.steps == trace.steps and back.summary == trace.summary and back.token_text(8) == " mat"
    assert back.answer == " the cat mat the cat mat" and boundaries_from_texts(back.step_texts) == [12, 24]
    assert back.identical is None
    (tmp_path / "bad.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(TraceError):
        Trace.load(tmp_path / "bad.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(TraceError):
        Trace.load(tmp_path / "broken.json")
    data = trace.to_dict()
    data["steps"][0].pop("tokens")
    with pytest.raises(TraceError):
        Trace.from_dict(data)


def test_text_assembler_waits_for_complete_characters():
    pieces = {1: b"\xe2\x82", 2: b"\xac!", 3: b" ok"}
    asm = TextAssembler(lambda ids: b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace"))
    asm.push([1])
    asm.push([2])
    asm.push([3])
    assert asm.text == "€! ok" and asm.step_texts() == ["", "€!", " ok"]


def test_redrawing_an_80_node_step_reuses_the_layout():
    """The live view redraws while the engine decodes: the networkx layout is computed once per tree shape.

    (Its cost is measured, not asserted: scripts/measure_live_overhead.py; timed tests fail on slow runners.)
    """
    from tr_core.tree import TEMPLATES, build_tree

    tree = build_tree("2.2.2", TEMPLATES["2.2.2"])
    n = tree.size
    ev = make_event()
    ev.tokens = [(7 * i) % 500 for i in range(n)]
    ev.parents, ev.depths, ev.ranks = list(tree.parents_list), list(tree.depths_list), list(tree.ranks_list)
    ev.accepted = [0, 1, 9]
    ev.matrix_rows = ev.tokens
    ev.matrix_values = [[(t + j) % 500 for j in range(8)] for t in ev.tokens]
    ev.matrix_probs = [[0.5 / (j + 1) for j in range(8)] for _ in ev.tokens]
    tracker = MatrixTracker()
    events = [ev] * 100
    for e in events:
        tracker.update(e)
    tree_layout.cache_clear()
    for _ in range(10):
        for fig in (tree_figure(ev, text_of), heatmap_figure(tracker, ev, text_of), accepted_chart(events)):
            assert fig.to_json()
    info = tree_layout.cache_info()
    assert info.misses == 1 and info.hits == 9, info  # one layout for ten redraws of the same shape
    assert len(node_traces(tree_figure(ev, text_of))["rejected"]["x"]) == n - 3


class ScriptedEngine:
    """Yields fixed step events (then a summary), or raises after the first step."""

    def __init__(self, steps: int, fail_after: int | None = None):
        self.steps, self.fail_after = steps, fail_after

    def decode(self, ids):
        return "".join(text_of(i) for i in ids)

    def generate(self, ids, cfg, stop=None):
        for i in range(self.steps):
            if self.fail_after is not None and i == self.fail_after:
                raise RuntimeError("engine broke")
            yield make_event(i)
            if stop is not None and stop():
                break
        yield SummaryEvent(tokens=[1, 2, 8] * self.steps, prompt_tokens=3, new_tokens=3 * self.steps, steps=self.steps,
                           mean_accepted=3.0, tokens_per_s=10.0, prefill_s=0.0, decode_s=1.0, wall_s=1.0,
                           stop_reason="length", method="recycling", template="tiny", matrix_rows_filled=4, matrix_mb=0.0)


def test_record_live_folds_events_into_the_trace_and_throttles():
    from studio.recording import record_live

    trace = Trace()
    batches = list(record_live(ScriptedEngine(5), [0], None, trace, every_s=10.0))
    assert sum(len(b) for b in batches) == 5 and len(batches) <= 2  # throttled: not one yield per step
    assert len(trace.steps) == 5 and trace.summary.new_tokens == 15 and trace.answer == " the cat mat" * 5
    slow = Trace()
    assert [len(b) for b in record_live(ScriptedEngine(3), [0], None, slow, delay_s=0.01)] == [1, 1, 1]
    broken = Trace()
    with pytest.raises(RuntimeError, match="engine broke"):
        for _ in record_live(ScriptedEngine(5, fail_after=2), [0], None, broken, every_s=0.0):
            pass
    assert len(broken.steps) == 2 and broken.summary is None


def test_hover_says_which_step_each_draft_token_was_recycled_from():
    from present.nodes import provenance_text

    ev = make_hybrid_event()
    n = len(ev.tokens)
    ev.answer = 1
    ev.written = [[-1, -1]] + [[1, 11]] * (n - 1)
    ev.written[2] = [0, 4]  # written during the previous answer
    ev.written[4] = [1, -1]  # prompt seeding of this answer
    ev.candidate_probs = [0.0] + [0.18] * (n - 1)
    assert provenance_text(ev, 1, text_of) == (
        f"recycled from step 12, where it was candidate #{ev.ranks[1]} after {text_of(ev.tokens[0])!r} (p = 0.18)")
    assert provenance_text(ev, 2, text_of).startswith("recycled from step 5 of answer 1, where it was candidate #1")
    assert provenance_text(ev, 4, text_of).startswith("seeded from the prompt: it followed")
    assert provenance_text(ev, 0, text_of) is None
    _, hovers = node_markers(tree_figure(ev, text_of))
    assert "recycled from step 5 of answer 1, where it was candidate #1 after &#x27;&lt;root&gt;&#x27;" in hovers[2]
    assert "<br>and the matrix: recycled from step 12" in hovers[1]  # a shared node says both


def test_every_text_of_the_tree_is_16_px_or_more():
    from present.style import MIN_FONT

    for ev in (paper_tree_event((0, 1, 0), 17), make_hybrid_event(), deep_run_event(16)):
        fig = tree_figure(ev, words_of)
        sizes = [t["textfont"]["size"] for t in fig.traces if "textfont" in t]
        sizes += [fig.layout["legend"]["font"]["size"], fig.layout["legend"]["title"]["font"]["size"]]
        assert len(sizes) >= 4 and min(sizes) >= MIN_FONT


def test_a_step_that_drafted_nothing_shows_the_tree_it_would_have_drafted_as_not_verified():
    ev = StepEvent(step=4, position=9, tokens=[5], parents=[-1], depths=[0], ranks=[-1], accepted=[0], emitted=[6],
                   bonus=6, timings={"total": 10.0})
    ev.no_draft = {"why": "cost", "drafts": 3, "gain": 1.2, "cost_ratio": 2.5, "context": False}
    ev.unverified = {"tokens": [5, 1, 2, 3], "parents": [-1, 0, 0, 1], "expected": 1.2}
    fig = tree_figure(ev, text_of)
    assert "drafted nothing" in fig.layout["title"]["text"] and "would add 1.20 accepted" in fig.layout["title"]["text"]
    assert "NOT VERIFIED" in fig.layout["annotations"][0]["text"]
    lines = [t for t in fig.traces if t.get("mode") == "lines"]
    assert lines and all(t["line"]["dash"] == "dash" for t in lines)  # dashed: never verified
    assert all(t.get("marker", {}).get("color") != ACCEPTED_COLOUR for t in fig.traces)  # nothing accepted
    ev.unverified = {"tokens": [5, 1], "parents": [-1, 3]}  # malformed (from a file): the plain step's figure
    assert "NOT VERIFIED" not in json.dumps(tree_figure(ev, text_of))


def test_the_meter_names_the_drafting_model_and_machine_its_figures_belong_to():
    """Cold readers took the hybrid's figures for the paper's method's, and could not tell which model ran."""
    from present.meter import method_name

    shown = meter_html(MeterView(state="measured", tr_tps=20.0, plain_tps=13.0, ratio=1.5, error=0.02,
                                 method="Matrix + context", model="embedded (SmolLM2-135M-Instruct)",
                                 machine="Intel Xeon Processor, 2 threads"))
    assert 'data-tip="Tokens per second, measured on the machine serving this page' in shown  # why not the README's
    shown = re.sub(r"<[^>]+>", "", shown)  # the text, glossary marks aside
    assert "Matrix + context tok/s" in shown and "Token Recycling tok/s" not in shown
    assert "embedded (SmolLM2-135M-Instruct), timed on Intel Xeon Processor, 2 threads" in shown
    assert "Token Recycling tok/s" in re.sub(r"<[^>]+>", "", meter_html(MeterView(state="measured", tr_tps=20.0)))
    names = {t: method_name(Trace(settings={"template": t})) for t in ("hybrid", "adaptive", "2.2.2", "3-wide")}
    assert names == {"hybrid": "Matrix + context", "adaptive": "Matrix only", "2.2.2": "Paper's 80-node tree",
                     "3-wide": "Token Recycling"}


def _bench_run(machine: str, date: str, seconds: dict[str, dict[str, float]], kind: str = "dev") -> dict:
    """A benchmark result file's shape (tr_core.bench): per method, per task, seconds over 2 answers."""
    return {"machine": machine, "date": date, "threads": 2, "model": "tiny", "methods": {
        method: {"per_category": {task: {"seconds": s, "answers": 2} for task, s in by_task.items()}}
        for method, by_task in seconds.items()}}


def test_per_task_speedups_come_from_the_benchmark_files_of_this_machine(tmp_path):
    """The 'Why these numbers' panel: each task's speedup is plain decoding's seconds over the method's, summed
    over this machine's development and harder files; another machine's files, other kinds of result and broken
    files are left out; an unknown machine gets the newest machine's, and the caption names it."""
    from present.tasks import caption_of, task_runs, task_speedup_figure, task_speedups

    plain, hybrid, matrix = "vanilla", "recycling[hybrid]", "recycling[adaptive]"
    files = {
        "epyc-2t-dev.json": _bench_run("AMD EPYC, 2 cores", "2026-12-02", {plain: {"qa": 4.0, "code": 3.0},
                                                                         hybrid: {"qa": 2.0, "code": 3.0},
                                                                         matrix: {"qa": 4.0, "code": 2.0}}),
        "epyc-2t-harder.json": _bench_run("AMD EPYC, 2 cores", "2026-12-04", {plain: {"qa": 2.0},
                                                                            hybrid: {"qa": 2.0}, matrix: {"qa": 1.0}}),
        "xeon-2t-dev.json": _bench_run("Intel(R) Xeon(R) Processor, 2 cores", "2026-12-01",
                                       {plain: {"qa": 9.0}, hybrid: {"qa": 1.0}}),
        "epyc-2t-dev-80-nodes.json": _bench_run("AMD EPYC, 2 cores", "2026-12-05", {plain: {"qa": 99.0}, hybrid: {"qa": 1.0}}),
        "epyc-1t-dev.json": _bench_run("AMD EPYC, 2 cores", "2026-12-05", {plain: {"qa": 99.0}, hybrid: {"qa": 1.0}}),
    }
    for name, run in files.items():
        (tmp_path / name).write_text(json.dumps(run))
    (tmp_path / "broken-2t-dev.json").write_text("{not json")
    runs = task_runs(tmp_path, "AMD EPYC, 2 threads")
    assert len(runs) == 2
    speedups = task_speedups(runs)
    assert speedups["qa"][hybrid] == pytest.approx(6.0 / 4.0) and speedups["qa"][matrix] == pytest.approx(6.0 / 5.0)
    assert speedups["code"] == {hybrid: pytest.approx(1.0), matrix: pytest.approx(1.5)}
    assert "AMD EPYC, 2 cores, 2 threads, 3 answers a task, 2026-12-02 and 2026-12-04" in caption_of(runs)
    xeon = task_runs(tmp_path, "Intel Xeon Processor, 2 threads")
    assert [r["date"] for r in xeon] == ["2026-12-01"] and task_speedups(xeon)["qa"] == {hybrid: pytest.approx(9.0)}
    assert {r["date"] for r in task_runs(tmp_path, "Apple M2")} == {"2026-12-02", "2026-12-04"}  # newest machine
    fig = task_speedup_figure(speedups).to_plotly()
    assert [t.name for t in fig.data] == ["Matrix only (the paper's drafting)", "Matrix + context"]
    assert list(fig.data[1].x) == [pytest.approx(1.0), pytest.approx(1.5)]  # least first
    assert task_runs(tmp_path / "none", "AMD EPYC") == [] and caption_of([]) == ""
    assert "No benchmark results" in json.dumps(task_speedup_figure({}))


def test_rejected_drafts_are_labelled_where_room_allows_and_no_two_labels_of_a_level_meet():
    """The presentation view's tree left its rejected drafts unlabelled: they get their token, in grey, where the
    label clears the markers and labels of its level; a crowded level (the paper's 80-node tree) keeps hover only."""
    from present.style import REJECTED_TEXT, text_em
    from present.tree import TREE_WIDTH, X_RANGE

    ev = make_hybrid_event()
    fig = tree_figure(ev, text_of)
    labels = drawn_labels(fig)
    rejected = node_traces(fig)["rejected"]
    assert set(rejected["customdata"]) <= set(labels), labels  # a small tree: room for every one
    assert rejected["textfont"]["color"] == REJECTED_TEXT
    layout = tree_layout(tuple(ev.parents), tuple(ev.ranks))
    scale = (TREE_WIDTH - 20) / (X_RANGE[1] - X_RANGE[0])
    spans = {}
    for node, (text, side) in labels.items():
        if node in (0, BONUS_NODE):
            continue
        x, w = layout.x[node] * scale, text_em(html.unescape(text)) * 16
        span = (x, x + w + 10) if side == "middle right" else (x - w - 10, x)
        assert X_RANGE[0] * scale <= span[0] and span[1] <= X_RANGE[1] * scale, (node, span)
        for other in spans.get(ev.depths[node], []):
            assert span[1] <= other[0] or other[1] <= span[0], (node, span, other)
        spans.setdefault(ev.depths[node], []).append(span)
    crowded = paper_tree_event((0, 1, 0), 17)
    assert not any(node_traces(tree_figure(crowded, words_of))["rejected"]["text"])


def test_the_root_label_shows_a_longer_token_whole_and_path_labels_are_cut():
    """The root's label stands centred over it, with room for ROOT_LABEL_LEN characters (a reader met '␣situat…'
    with room to spare); the path's labels, beside their nodes, keep LABEL_LEN."""
    from present.tree import LABEL_LEN, ROOT_LABEL_LEN, tree_labels

    labels = tree_labels(make_event(), lambda t: " situation" if t == 0 else " understanding")
    assert labels[0] == "␣situation" and len(labels[1]) == LABEL_LEN and labels[1].endswith("…")
    assert len(tree_labels(make_event(), lambda t: "x" * 30)[0]) == ROOT_LABEL_LEN


def test_a_run_starts_at_its_first_word_not_at_the_space_before_it():
    """A reader saw an empty outlined box at a line's end: the step shown began with a space and wrapped right after
    it. The space before a run's first word stays outside its span; the text is unchanged."""
    from present.chat import marked_markdown

    out = marked_markdown("Blue light scatters more", [4, 10, 24], current=1)
    assert '<span class="tr-run-b tr-run-current"> light</span>' not in out
    assert ' <span class="tr-run-b tr-run-current">light</span>' in out
    assert re.sub(r"<[^>]+>", "", out) == "Blue light scatters more"


def test_a_path_label_moves_off_a_sibling_marker_it_would_cover():
    """A reader found '␣property' hidden under '␣aspect': a path label that would cover another marker of its level
    stands on its marker's other side where that is clear (the path's last keeps its side: the star steps from it)."""
    from present.tree import X_RANGE, TREE_WIDTH, marker_px, label_px

    # root -> A (rank 0, six children), B (rank 1, on the path, one child C), D (rank 2): B and D stand close
    parents = [-1, 0, 0, 0] + [1] * 6 + [2]
    ranks = [-1, 0, 1, 2] + list(range(6)) + [0]
    tokens = [0, 1, 4, 5, 10, 11, 12, 13, 14, 15, 2]
    depths = [0, 1, 1, 1] + [2] * 7
    ev = StepEvent(step=0, position=10, tokens=tokens, parents=parents, depths=depths, ranks=ranks,
                   accepted=[0, 2, 10], emitted=[4, 2, 8], bonus=8, timings={"total": 10.0}, template="tiny")
    words = {4: " aspect", 5: " property"}
    fig = tree_figure(ev, lambda t: words.get(t, text_of(t)))
    layout = tree_layout(tuple(parents), tuple(ranks))
    scale = (TREE_WIDTH - 20) / (X_RANGE[1] - X_RANGE[0])
    assert (layout.x[3] - layout.x[2]) * scale < label_px(" aspect") + marker_px("accepted", 80)  # it would cover
    assert layout.x[2] > layout.x[0]  # the edge comes in from the left: its label went right before
    assert drawn_labels(fig)[2][1] == "middle left"


def test_a_special_token_too_long_for_its_label_shows_its_sign_not_a_cut_name():
    """A cold reader met three names for the end token (‹end› in the heatmap, '<|im_…' in the tree, '<|im_e…'):
    cut, a tokenizer's marker becomes the heatmap's sign; whole where it fits; a visitor's short literal '<b>' and
    ordinary text stay as they are."""
    from present.style import visible_token

    assert visible_token("<|im_end|>", 7) == "‹end›" and visible_token("<|im_start|>", 8) == "‹start›"
    assert visible_token("<|im_end|>", 12) == "<|im_end|>"  # fits: the token's own text
    assert visible_token("<|im_start|>", 5) == "<|im…"  # not even the sign fits
    assert visible_token("<b>", 3) == "<b>" and visible_token(" a<b>long", 5) == "␣a<b…"
