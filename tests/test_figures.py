"""Figure builders and the trace format, on hand-made step events (no model needed)."""
from __future__ import annotations

import html
import json
import random
import re
from collections import Counter

import pytest

from tr_core.events import StepEvent, SummaryEvent
from present.figures import (ACCEPTED_COLOUR, BONUS_COLOUR, BONUS_NODE, REJECTED_COLOUR, MatrixTracker,
                                    MeterView, accepted_chart, boxes_overlap, coloured_markdown, display_token,
                                    heatmap_figure, label_boxes, meter_html, symbol_note, tree_figure, tree_frame,
                                    tree_layout, tree_legend_names, unique_labels)
from present.figures import FEW_LABELS, _path_segments, segment_crosses
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
    return {t["name"]: t for t in fig.traces if t["mode"] == "markers+text"}


def test_tree_figure_has_every_node_and_marks_the_accepted_path():
    ev = make_event()
    fig = tree_figure(ev, text_of)
    nodes = node_traces(fig)
    assert sum(len(t["x"]) for n, t in nodes.items() if not n.startswith("bonus")) == len(ev.tokens)
    accepted = nodes["accepted drafts"]
    assert accepted["customdata"] == [1, 3]
    assert accepted["marker"]["color"] == ACCEPTED_COLOUR
    assert nodes["rejected drafts"]["marker"]["color"] == REJECTED_COLOUR
    assert sorted(nodes["rejected drafts"]["customdata"]) == [2, 4, 5, 6]
    bonus = nodes["bonus token"]
    assert bonus["marker"]["color"] == BONUS_COLOUR and bonus["text"] == ["␣mat"]
    # the accepted edges (root->1, 1->3) are drawn in the accepted colour, thicker
    path_edges = [t for t in fig.traces if t["mode"] == "lines" and t["line"]["color"] == ACCEPTED_COLOUR]
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
    hover = " ".join(node_traces(fig)["rejected drafts"]["hovertext"])
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
    assert "rejected drafts" in node_traces(fig) and "bonus token" not in node_traces(fig)
    assert "accepted drafts" not in node_traces(fig) and "accepted drafts" not in legend_names(fig)  # none to show
    assert tree_legend_names(ev) == ["rejected drafts", "root (last committed token)"]
    ev.accepted = [0, 1]
    assert "rejected drafts" not in legend_names(tree_figure(ev, text_of))  # a lone accepted chain: no grey entry
    assert len(tree_figure(None, text_of).traces) == 0


def make_hybrid_event() -> StepEvent:
    """The 7-node tree of a hybrid step (k = 2): node 1 from both sources, 3, 5 and 6 copied from the context."""
    ev = make_event()
    ev.ranks, ev.template = [-1, 0, 1, 2, 1, 2, 2], "hybrid"
    ev.sources = ["root", "both", "matrix", "context", "matrix", "context", "context"]
    ev.origins = ["", "copied from the prompt, token 3 (after a 2-token match)", "",
                  "copied from the prompt, tokens 3-4 (after a 2-token match)", "",
                  'copied from <img src=x> "here" & there', "copied from the prompt, tokens 3-5 (after a 2-token match)"]
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
    assert nodes["accepted drafts"]["marker"]["color"] == ACCEPTED_COLOUR
    assert nodes["accepted drafts"]["customdata"] == [1, 3]
    assert nodes["rejected drafts"]["marker"]["color"] == REJECTED_COLOUR
    names = legend_names(fig)
    for name in ("from the matrix", "copied from the context", "matrix + context", "accepted drafts",
                 "rejected drafts", "root (last committed token)", "bonus token"):
        assert names.count(name) == 1, name
    keys = {t["name"]: t["marker"]["symbol"] for t in fig.traces if t.get("mode") == "markers"}
    # shape keys are outlines (not one more grey beside the rejected drafts'), colour keys strokes of no shape
    # (a reader took the green circle of "accepted drafts" for a shape the accepted squares lacked)
    assert keys["from the matrix"] == "circle-open" and keys["copied from the context"] == "square-open"
    assert keys["matrix + context"] == "diamond-open" and keys["root (last committed token)"] == "circle"
    strokes = {t["name"]: t["line"]["color"] for t in fig.traces if t.get("mode") == "lines" and "name" in t}
    assert strokes == {"accepted drafts": ACCEPTED_COLOUR, "rejected drafts": REJECTED_COLOUR}
    assert "from the matrix: candidate #1 after &#x27;&lt;root&gt;&#x27;" in hovers[2]  # parent text, escaped
    assert "from the matrix: candidate #1 after &#x27; the&#x27;" in hovers[4]
    assert "copied from the prompt, tokens 3-4 (after a 2-token match)" in hovers[3] and "rank" not in hovers[3]
    assert "copied from the prompt, token 3 (after a 2-token match)<br>and the matrix (candidate #0)" in hovers[1]
    assert "copied from &lt;img src=x&gt; &quot;here&quot; &amp; there" in hovers[5]
    assert not any("<img" in h for h in hovers.values())
    assert " · root" in hovers[0]
    fig.to_plotly()  # valid plotly: per-point symbols and the legend-only entries


def test_tree_figure_without_context_drafts_keeps_its_legend():
    ev = make_hybrid_event()
    ev.sources = ["root"] + ["matrix"] * 6
    ev.origins = [""] * 7
    fig = tree_figure(ev, text_of)
    symbols, hovers = node_markers(fig)
    assert set(symbols.values()) == {"circle"} and "from the matrix: candidate #2 after" in hovers[3]
    assert not any(n.startswith(("●", "■", "◆")) for n in legend_names(fig))
    assert not any("legendgroup" in t for t in fig.traces)
    plain = tree_figure(make_event(), text_of)  # no sources: as before, rank in the hover, one symbol per trace
    assert [t["marker"]["symbol"] for t in node_traces(plain).values()] == ["circle"] * 3 + ["star"]
    assert not any("from the matrix" in h for h in node_markers(plain)[1].values())
    assert len(plain.traces) == 7 and not any("legendgroup" in t for t in plain.traces)  # edges, nodes, bonus


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
        nodes = t.get("customdata", [BONUS_NODE])
        positions = t["textposition"] if isinstance(t["textposition"], list) else [t["textposition"]] * len(nodes)
        out.update({n: (text, pos) for n, text, pos in zip(nodes, t["text"], positions) if text})
    return out


@pytest.mark.parametrize("turns,bonus,width,hybrid", [((0, 1, 0), 17, 640, False), ((0, 0, 0, 0, 0, 0), 4, 640, False),
                                                      ((1, 0), 30, 640, False), ((), 8, 640, False),
                                                      ((0, 0, 1), None, 900, False), ((0, 1, 0), 17, 640, True)])
def test_paper_tree_labels_never_overlap_and_the_accepted_path_is_labelled(turns, bonus, width, hybrid):
    ev = paper_tree_event(turns, bonus)
    if hybrid:  # per-node marker symbols and a taller, grouped legend: less room under the plot
        ev.sources = ["root"] + ["matrix", "context", "both"] * 26 + ["matrix", "context"]
    assert len(ev.tokens) == 81 and Counter(ev.depths)[2] == 21 and Counter(ev.depths)[3] == 25
    boxes = label_boxes(ev, words_of, width=width)
    for i, a in enumerate(boxes):
        assert a.x0 < a.x1 and a.y0 < a.y1
        for b in boxes[i + 1:]:
            assert not boxes_overlap(a, b), (a, b)
    frame = tree_frame(ev, width)
    assert all(frame.inside(b) for b in boxes)
    path = _path_segments(ev, tree_layout(tuple(ev.parents), tuple(ev.ranks)), frame)
    assert not any(segment_crosses(b, seg) for b in boxes for seg in path)  # no label struck out by the green path
    labelled = {b.node for b in boxes}
    must = set(ev.accepted) | ({BONUS_NODE} if bonus is not None else set())
    assert must <= labelled
    assert 0 < len(labelled - must) <= FEW_LABELS  # a large tree: its likeliest few drafts only (more on hover)
    fig = tree_figure(ev, words_of, width=width)  # the figure draws exactly those labels, where they were placed
    assert drawn_labels(fig) == {b.node: (b.text, b.position) for b in boxes}
    if bonus is not None:
        assert drawn_labels(fig)[BONUS_NODE][0] == display_token(words_of(bonus))
    fig.to_plotly()


def test_a_long_copied_run_is_labelled_on_alternate_sides_without_covering_its_own_markers():
    # a recorded hybrid step (Chinese text: every label a split character's bytes): the accepted path zig-zags over
    # the matrix's candidates, then runs 10 tokens copied from the context down one column, whose levels are closer
    # than a label is tall. Each of those labels took 'bottom center', over the next two markers of the path, rather
    # than be crossed by the path once at the column's top (11 overlaps with accepted markers); now none covers one.
    from present.figures import _marker_boxes

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
    boxes = label_boxes(ev, text)
    markers = _marker_boxes(ev, tree_layout(tuple(ev.parents), tuple(ev.ranks)), tree_frame(ev))
    must = {*accepted, BONUS_NODE}
    assert must <= {b.node for b in boxes}
    covered = [(b.node, n) for b in boxes for m, n in markers if n != b.node and n in must and boxes_overlap(b, m)]
    assert covered == []
    assert {b.position for b in boxes if b.node in accepted[5:]} == {"middle left", "middle right"}


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
def test_a_deep_copied_run_takes_the_legends_room_and_its_star_and_labels_cover_nothing(depth):
    # The README's first screenshot: 16 copied tokens accepted in one step left 13 px a level under a two-row
    # legend; the markers merged into one green bar and the bonus star covered the last node.
    from present.figures import MIN_MARKER, _marker_boxes

    ev = deep_run_event(depth)
    frame, layout = tree_frame(ev), tree_layout(tuple(ev.parents), tuple(ev.ranks))
    assert frame.legend == "left" and frame.legend_box is not None  # the run hangs right: the left corner is free
    assert frame.level_px > tree_frame(deep_run_event(depth, second_run=True)).level_px  # more room than below
    markers = dict((n, m) for m, n in _marker_boxes(ev, layout, frame))
    assert not boxes_overlap(markers[BONUS_NODE], markers[ev.accepted[-1]])
    run = ev.accepted[2:]
    assert all(not boxes_overlap(markers[a], markers[b]) for a, b in zip(run, run[1:]))  # beads, not one bar
    assert MIN_MARKER <= frame.marker_size("accepted") <= 22 and (depth < 16 or frame.marker_size("accepted") < 22)
    boxes = label_boxes(ev, words_of)
    assert {*ev.accepted, BONUS_NODE} <= {b.node for b in boxes}
    for i, a in enumerate(boxes):
        assert frame.inside(a) and not boxes_overlap(a, frame.legend_box)
        assert all(not boxes_overlap(a, b) for b in boxes[i + 1:]), a
        assert all(not boxes_overlap(a, m) for n, m in markers.items() if n != a.node), a
    assert not any(boxes_overlap(frame.legend_box, m) for m in markers.values())
    fig = tree_figure(ev, words_of)
    assert fig.layout["legend"]["orientation"] == "v" and fig.layout["legend"]["xanchor"] == "left"
    assert {t["marker"]["size"] for t in node_traces(fig).values()} <= {frame.marker_size(g) for g in
                                                                         ("root", "accepted", "rejected", "bonus")}
    fig.to_plotly()


def test_a_tree_keeps_its_legend_below_when_its_levels_have_room_or_no_corner_is_free():
    assert tree_frame(paper_tree_event()).legend == "below"  # the paper's tree: 6 levels
    assert tree_frame(deep_run_event(6)).legend == "below"
    both = deep_run_event(16, second_run=True)  # runs down both sides
    frame = tree_frame(both)
    assert frame.legend == "below" and frame.legend_box is None
    assert "orientation" not in tree_figure(both, words_of).layout["legend"] or \
        tree_figure(both, words_of).layout["legend"]["orientation"] == "h"


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
    from present.figures import PAST_END_COLOUR, node_groups

    ev = make_event()
    path = ev.accepted[1:]
    ev.emitted, ev.bonus = [ev.tokens[path[0]]], None  # the answer ended after the first accepted draft
    groups = node_groups(ev)
    assert groups["accepted"] == path[:1] and groups["past end"] == path[1:]
    fig = tree_figure(ev, text_of)
    nodes = {t["name"]: t for t in fig.traces if t.get("mode") == "markers+text"}
    past = nodes["accepted, past the answer's end (not kept)"]
    assert past["marker"]["color"] == PAST_END_COLOUR and past["customdata"] == path[1:]
    assert all(text for text in past["text"])  # labelled, as the kept path is
    assert nodes["accepted drafts"]["customdata"] == path[:1]
    edges = [t for t in fig.traces if t.get("mode") == "lines" and t["line"]["color"] == PAST_END_COLOUR]
    assert len(edges) == 1 and edges[0]["x"].count(None) == len(path) - 1  # the edge into each dropped draft
    assert "accepted, past the answer's end (not kept)" in tree_legend_names(ev)
    ev.emitted, ev.bonus = [ev.tokens[i] for i in path] + [9], 9  # nothing cut: no such group, edge or entry
    assert node_groups(ev)["past end"] == [] and not any(
        t["line"]["color"] == PAST_END_COLOUR for t in tree_figure(ev, text_of).traces if t.get("mode") == "lines")


def test_dropped_labels_stay_on_hover_and_labels_are_escaped():
    ev = paper_tree_event()
    fig = tree_figure(ev, words_of)
    labelled = drawn_labels(fig)
    _, hovers = node_markers(fig)
    dropped = [i for i in range(len(ev.tokens)) if i not in labelled]
    assert dropped
    for i in dropped:
        assert html.escape(repr(words_of(ev.tokens[i]))) in hovers[i]
    texts = [text for text, _ in labelled.values()]
    assert any("&lt;b&gt;" in t for t in texts) and not any("<b>" in t for t in texts)
    assert all(h.count("<b>") == 1 for h in hovers.values())  # the token in bold, escaped


def test_rejected_labels_keep_clear_of_markers():
    from present.figures import _marker_boxes

    ev = paper_tree_event()
    frame = tree_frame(ev)
    markers = _marker_boxes(ev, tree_layout(tuple(ev.parents), tuple(ev.ranks)), frame)
    for box in label_boxes(ev, words_of):
        if box.node not in ev.accepted and box.node != BONUS_NODE:
            assert not any(boxes_overlap(box, m) for m, node in markers if node != box.node), box


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


def test_a_small_tree_labels_every_node():
    from tr_core.tree import TEMPLATES, build_tree

    tree = build_tree("chain-4", TEMPLATES["chain-4"], "cpu")
    ev = make_event()
    ev.tokens, ev.accepted, ev.bonus = [1, 2, 3, 4, 5], [0, 1, 2], 6
    ev.parents, ev.depths, ev.ranks = list(tree.parents_list), list(tree.depths_list), list(tree.ranks_list)
    boxes = label_boxes(ev, text_of)
    assert {b.node for b in boxes} == {0, 1, 2, 3, 4, BONUS_NODE}
    assert set(drawn_labels(tree_figure(ev, text_of))) == {0, 1, 2, 3, 4, BONUS_NODE}


def test_a_lone_punctuation_mark_is_labelled_in_quotes_so_it_can_be_seen():
    from present.figures import node_label

    assert [node_label(t, 8) for t in (",", "_", "'", "(", ".")] == ["“,”", "“_”", "“'”", "“(”", "“.”"]
    assert [node_label(t, 8) for t in ("a", "7", " ", "\n", "", " the", ",,")] == ["a", "7", "␣", "↵", "∅", "␣the", ",,"]
    ev = make_event()
    texts = {b.node: b.text for b in label_boxes(ev, lambda t: "," if t == ev.tokens[1] else text_of(t))}
    assert texts[1] == "“,”"


def test_a_rejected_draft_with_room_shows_its_token_as_long_as_an_accepted_one():
    # a cold reader saw 'rever…' alone at the tree's edge with room for 'reverse'
    ev = deep_run_event(3, siblings=3)  # root -> 3 candidates, the last one accepted and its copied run below
    rejected = [i for i in range(1, len(ev.tokens)) if i not in ev.accepted]
    long_text = lambda t: "␣reverse_string" if t in rejected else f"w{t}"  # noqa: E731  (token ids = nodes here)
    shown = {b.node: b.text for b in label_boxes(ev, long_text)}
    assert all(shown[i] == "␣revers…" for i in rejected), shown  # 8 characters, as accepted labels
    crowded = deep_run_event(3, siblings=7)  # seven siblings across the width: no room for 8 characters each
    rejected = [i for i in range(1, len(crowded.tokens)) if i not in crowded.accepted]
    long_text = lambda t: "␣reverse_string" if t in rejected else f"w{t}"  # noqa: E731
    shown = {b.node: b.text for b in label_boxes(crowded, long_text) if b.node in rejected}
    assert shown and set(shown.values()) <= {"␣revers…", "␣reve…"} and "␣reve…" in shown.values(), shown


def test_tree_explains_its_symbols_only_when_a_label_shows_them():
    fig = tree_figure(make_event(), text_of)  # labels " the" as "␣the"
    assert [a["text"] for a in fig.layout["annotations"]] == ["␣ = space"]
    fig = tree_figure(make_event(), lambda t: "\n" if t == 4 else text_of(t))  # and node 2 as "↵"
    assert [a["text"] for a in fig.layout["annotations"]] == ["␣ = space · ↵ = new line"]
    plain = tree_figure(make_event(), lambda t: f"w{t}")
    assert not plain.layout.get("annotations")
    assert symbol_note(["a", "b"]) == "" and symbol_note(["x\u2423", "∅"]) == "␣ = space · ∅ = empty token"
    hybrid = make_hybrid_event()  # the margin under the plot is sized for the legend the figure shows
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
    assert labels[0] == "● &lt;root&gt;" and labels[1] == "● ␣the"  # accepted path rows first: root, " the", " cat"
    assert heat["z"][::-1][0] == [0.7, 0.2]
    assert unique_labels([1, 5, 1], lambda t: "x") == ["x #1", "x #5", "x #1"]
    assert tracker.hits[0] == 1 and tracker.hits[1] == 1  # root row's rank-0 candidate and " the" row's accepted


def test_heatmap_keeps_most_hit_rows_from_earlier_steps():
    tracker, _, later = _second_step_rewrites_row_9(accepted=[0])
    rows = tracker.window(later, max_rows=4)
    assert rows[0] == 9 and set(rows[1:]) <= {0, 1, 2, 4}


def test_accepted_chart_and_meter():
    events = [make_event(i) for i in range(3)]
    fig = accepted_chart(events, current=1)
    assert fig.traces[0]["y"] == [3, 3, 3] and fig.traces[0]["marker"]["color"][1] == BONUS_COLOUR
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
    assert "✗" in meter_html(MeterView(state="measured", ratio=1.0, error=0.01, identical=False))


def test_the_chart_credits_the_answers_accepted_drafts_to_their_source():
    from present.figures import accepted_chart_explained, draft_credit

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
    assert caption.endswith("+ 3 bonus (none where the answer ended)")  # 4 steps, 3 bonuses: said why
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
    from present.figures import safe_markdown

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
    from present.figures import CODE_CLOSE, CODE_OPEN

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
    from present.figures import CODE_CLOSE, CODE_OPEN

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
    from present.figures import marked_markdown, safe_markdown

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
    from present.figures import accepted_chart_explained

    events = [make_event(i) for i in range(3)]
    fig = accepted_chart_explained(events, current=1)
    legend = {t["name"]: t["marker"]["color"] for t in fig.traces if t.get("showlegend")}
    assert legend == {"tokens a step gained (the accepted drafts it kept + bonus)": ACCEPTED_COLOUR,
                      "step 2: the step shown in the tree": BONUS_COLOUR}
    assert fig.traces[0]["marker"]["color"] == accepted_chart(events, current=1).traces[0]["marker"]["color"]
    assert fig.layout["showlegend"] and fig.to_plotly()  # valid plotly
    live = accepted_chart_explained(events)  # while streaming no step is singled out: no amber entry
    assert [t["name"] for t in live.traces if t.get("showlegend")] == ["tokens a step gained (the accepted drafts it kept + bonus)"]
    assert accepted_chart_explained([]).traces == []


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

    (Its cost is measured, not asserted: tests/measure_live_overhead.py; timed tests fail on slow runners.)
    """
    from present.figures import tree_layout
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
    assert len(node_traces(tree_figure(ev, text_of))["rejected drafts"]["x"]) == n - 3


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
    from present.figures import provenance_text

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


def test_a_large_tree_labels_its_accepted_path_and_only_a_few_drafts_all_at_16_px_or_more():
    from present.figures import FEW_LABELS, MIN_FONT

    ev = paper_tree_event((0, 1, 0), 17)
    boxes = label_boxes(ev, words_of)
    labelled = {b.node for b in boxes}
    assert set(ev.accepted) | {BONUS_NODE} <= labelled
    assert 0 < len(labelled - set(ev.accepted) - {BONUS_NODE}) <= FEW_LABELS
    fig = tree_figure(ev, words_of)
    sizes = [t["textfont"]["size"] for t in fig.traces if "textfont" in t]
    sizes += [a["font"]["size"] for a in fig.layout.get("annotations", [])] + [fig.layout["legend"]["font"]["size"]]
    assert sizes and min(sizes) >= MIN_FONT
    small = make_event()  # a small tree still labels every draft that has room
    assert len(label_boxes(small, text_of)) > len(small.accepted) + 1


def test_a_step_that_drafted_nothing_shows_the_tree_it_would_have_drafted_as_not_verified():
    ev = StepEvent(step=4, position=9, tokens=[5], parents=[-1], depths=[0], ranks=[-1], accepted=[0], emitted=[6],
                   bonus=6, timings={"total": 10.0})
    ev.no_draft_reason = "a 3-token forward costs more here than the 1.2 tokens it would gain"
    ev.unverified = {"tokens": [5, 1, 2, 3], "parents": [-1, 0, 0, 1], "expected": 1.2}
    fig = tree_figure(ev, text_of)
    assert "drafted nothing" in fig.layout["title"]["text"] and "1.2 tokens it would gain" in fig.layout["title"]["text"]
    assert "NOT VERIFIED" in fig.layout["annotations"][0]["text"]
    lines = [t for t in fig.traces if t.get("mode") == "lines"]
    assert lines and all(t["line"]["dash"] == "dash" for t in lines)  # dashed: never verified
    assert all(t.get("marker", {}).get("color") != ACCEPTED_COLOUR for t in fig.traces)  # nothing accepted
    ev.unverified = {"tokens": [5, 1], "parents": [-1, 3]}  # malformed (from a file): the plain step's figure
    assert "NOT VERIFIED" not in json.dumps(tree_figure(ev, text_of))


def side_run_event(depth: int, left: int, right: int, grandchildren: int) -> StepEvent:
    """A root with `left` rejected candidates, then the accepted one with a copied run `depth` deep under it, then
    `right` more; `grandchildren` rejected under the first candidate (the README screenshot's step 60)."""
    siblings = left + 1 + right
    parents, depths, ranks = [-1] + [0] * siblings, [0] + [1] * siblings, [-1] + list(range(siblings))
    sources = ["root"] + ["matrix"] * siblings
    node, accepted = left + 1, [0, left + 1]
    for d in range(2, depth + 1):
        parents.append(node), depths.append(d), ranks.append(8), sources.append("context")
        node = len(parents) - 1
        accepted.append(node)
    for j in range(grandchildren):
        parents.append(1), depths.append(2), ranks.append(j), sources.append("matrix")
    tokens = list(range(len(parents)))
    return StepEvent(step=59, position=300, tokens=tokens, parents=parents, depths=depths, ranks=ranks,
                     accepted=accepted, emitted=[tokens[i] for i in accepted[1:]] + [99], bonus=99, timings={},
                     template="hybrid", sources=sources)


@pytest.mark.parametrize("shape", [(18, 5, 0, 3), (18, 9, 1, 0), (20, 3, 0, 3), (16, 7, 1, 3)])
def test_the_legend_of_spaces_moves_aside_rather_than_push_a_run_label_onto_its_next_node(shape):
    """The README screenshot's deep run: the first copied token's only free side held '␣ = space', so its label
    went under it, onto the next node. The legend now takes another free corner."""
    from present.figures import LABEL_GAP_PX, _marker_boxes, _symbol_note_box

    ev = side_run_event(*shape)
    words = lambda t: f" w{t}" if t % 3 else "_"  # noqa: E731 - labels with a space: the legend of ␣ is shown
    layout, frame = tree_layout(tuple(ev.parents), tuple(ev.ranks)), tree_frame(ev)
    markers = _marker_boxes(ev, layout, frame)
    path = set(ev.accepted)
    for label in label_boxes(ev, words):
        box = (label.x0, label.y0, label.x1, label.y1)
        assert not any(boxes_overlap(box, m) for m, n in markers if n in path and n != label.node), label
    note = tree_figure(ev, words).layout["annotations"][0]
    corner = f"{note['yanchor']} {note['xanchor']}"
    box = _symbol_note_box(frame, note["text"], corner)
    assert not any(boxes_overlap(box, m, LABEL_GAP_PX) for m, _ in markers), corner
