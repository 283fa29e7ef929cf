"""The guided tour (present/tour.py): seven screens of one idea each, a telling step by default, figures that
agree with the step, no small text, and a stranger's trace shown as text."""
from __future__ import annotations

import copy
import html
import re
from html.parser import HTMLParser

import pytest
from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

from present.tour import MAX_WORDS, matrix_kept, telling_step, tour_html, tour_screens
from studio.recording import record_live
from tr_core.events import StepEvent
from tr_core.trace import Trace

TAGS = {"div", "section", "h2", "p", "nav", "span", "button", "svg", "text", "rect", "circle", "line", "polygon"}


@pytest.fixture(scope="module")
def trace() -> Trace:
    """A trace recorded as the studio records one (provenance on), the paper's tree on a tiny Llama."""
    from tr_core import DecodeConfig, Engine

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    messages = [{"role": "user", "content": "tell me a story about a story about a story"}]
    trace = Trace(model="tiny llama", settings={"template": "2.2.2", "k": 8, "machine": "a test CPU, 2 threads"},
                  messages=messages)
    cfg = DecodeConfig(max_new_tokens=40, template="2.2.2", provenance=True)
    for _ in record_live(engine, engine.encode_chat(messages), cfg, trace, every_s=0.05):
        pass
    trace.record_texts(engine.token_text)
    return trace


def step(tokens, parents, accepted, emitted, sources=None, bonus=None) -> StepEvent:
    depths = [0] * len(tokens)
    for i in range(1, len(tokens)):
        depths[i] = depths[parents[i]] + 1
    return StepEvent(step=0, position=5, tokens=tokens, parents=parents, depths=depths,
                     ranks=[-1] + [0] * (len(tokens) - 1), accepted=accepted, emitted=emitted,
                     bonus=emitted[-1] if bonus is None else bonus, timings={"total": 10.0, "forward": 8.0},
                     sources=sources)


def test_the_tour_shows_by_default_a_step_whose_matrix_drafts_were_accepted():
    """A step that gained more tokens from copies alone loses to one whose drafts came from matrix rows; without
    any such step, the step that gained the most tokens."""
    copied = step([1, 2, 3, 4], [-1, 0, 1, 2], [0, 1, 2, 3], [2, 3, 4, 9], ["root", "context", "context", "context"])
    matrix = step([1, 5, 6], [-1, 0, 0], [0, 1], [5, 9], ["root", "matrix", "matrix"])
    both = step([1, 7, 8], [-1, 0, 1], [0, 1, 2], [7, 8, 9], ["root", "both", "matrix"])
    assert [matrix_kept(ev) for ev in (copied, matrix, both)] == [0, 1, 1]  # a copy a row agreed with: not counted
    assert telling_step(Trace(steps=[copied, matrix])) == 1
    # as many matrix drafts: one the model turned a draft down in (a verdict to show) before more tokens
    assert telling_step(Trace(steps=[copied, matrix, both])) == 1
    wider = step([1, 7, 8, 4], [-1, 0, 1, 0], [0, 1, 2], [7, 8, 9], ["root", "both", "matrix", "matrix"])
    assert telling_step(Trace(steps=[copied, matrix, wider])) == 2  # both turned one down: more tokens
    assert telling_step(Trace(steps=[matrix, copied])) == 0
    assert telling_step(Trace(steps=[copied, step([1], [-1], [0], [9], ["root"])])) == 0
    assert telling_step(Trace()) == 0 and tour_screens(Trace(), 0) == [] and tour_html(Trace(), 0) == ""


def test_seven_screens_of_one_idea_each_at_most_thirty_words_no_text_under_20px(trace):
    for i in range(len(trace.steps)):
        screens = tour_screens(trace, i)
        assert len(screens) == 7
        for s in screens:
            assert len(s.words.split()) <= MAX_WORDS and len(s.words) <= 150, s.words  # two lines at 28 px
            assert len(s.title.split()) <= 7, s.title
            assert s.picture.startswith("<svg") and 'width="1200"' in s.picture
            sizes = [int(x) for x in re.findall(r'font-size="(\d+)"', s.picture)]
            assert sizes and min(sizes) >= 20, (s.title, sizes)


def test_the_screens_agree_with_the_step_and_the_meter(trace):
    i = telling_step(trace)
    ev = trace.steps[i]
    plain, rows, tree, verdict, path, written, bought = tour_screens(trace, i)
    assert f"{len(ev.tokens) - 1} drafts over {max(ev.depths)} levels: {len(ev.tokens) - 1} from matrix rows." in tree.words
    assert f"All {len(ev.tokens)} tokens go through the model in ONE forward" in verdict.words
    assert f"{len(ev.accepted) - 1} draft" in verdict.words
    kept = len(ev.emitted) - (ev.bonus is not None)
    assert f"{kept} draft{'s' if kept != 1 else ''} + 1 bonus = {len(ev.emitted)} tokens for one forward" in path.picture
    assert f"{len(ev.matrix_rows)} rows, one per distinct token of the {len(ev.tokens)}" in written.words
    assert len(ev.matrix_rows) == len(set(ev.tokens))
    assert f"This step read {len(ev.rows_read)} such rows" in rows.words
    assert verdict.picture.count("<rect") >= min(len(ev.tokens), 14) ** 2  # the tree attention mask, cell by cell
    assert "a test CPU, 2 threads" in words_of(bought.picture) and "speed was not measured" in words_of(bought.picture)
    measured = copy.copy(trace)
    measured.speed = {"trusted": True, "ratio": 1.62, "error": 0.05, "plain_tps": 40.0}
    bought = tour_screens(measured, i)[-1]
    assert "1.62× as fast as plain decoding" in words_of(bought.picture)  # the meter's ratio and its words
    assert f"{ev.timings['total'] / 25.0:.1f} plain steps: what this step cost, timed alone" in words_of(bought.picture)
    measured.speed["step_ms"] = [[len(ev.tokens), 60.0, 7], [1, 24.0, 3]]  # the meter's mean ms by step size
    chart = tour_screens(measured, i)[-1].picture  # the meter's cost curve: 60 ms / 25 ms, and this step's tokens
    assert "cost 2.4" in words_of(chart) and f"this step: {len(ev.emitted)} tokens" in words_of(chart)
    assert "1.62× as fast as plain decoding" in words_of(chart) and "a step&#x27;s time ÷ a plain step&#x27;s" in words_of(chart)
    other = len(ev.tokens) + 1  # a size the meter timed once: noise, left off the curve; this step's own stays
    measured.speed["step_ms"] = [[len(ev.tokens), 60.0, 1], [other, 90.0, 1], [other + 1, 75.0, 3]]
    chart = tour_screens(measured, i)[-1].picture
    points = re.findall(r'<circle[^>]*r="5" fill="#64748b"/>', chart)
    assert len(points) == 3  # plain decoding's own step (1, 1.0), this step's size and the size timed 3 times
    assert chart.count('stroke-dasharray="8 7"') == 2 and "dashed: not timed" in words_of(chart)  # gaps: 1 to N, N to N + 2


def words_of(picture: str) -> str:
    """The text a picture shows, its lines joined."""
    return " ".join(re.sub(r"<[^>]+>", " ", picture).split())


class Markup(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.handlers: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.handlers += [name for name, _ in attrs if name.startswith("on")]


def test_a_strangers_trace_is_text_in_the_tour(trace):
    bad = copy.deepcopy(trace)
    bad.token_texts = {t: f'<img src=x onerror="alert({t})"></text><script>1</script>' for t in bad.token_texts}
    markup = tour_html(bad, telling_step(bad))
    parsed = Markup()
    parsed.feed(markup)
    assert parsed.tags <= TAGS and parsed.handlers == [], (parsed.tags, parsed.handlers)
    assert "&lt;img" in markup and "<img" not in markup and "<script" not in markup


def test_a_long_copied_run_is_counted_at_the_end_of_the_drawn_levels():
    """A path 12 drafts deep: the pictures draw MAX_LEVELS levels and say how many more were accepted; every label
    stays at 20 px or more."""
    from present.tour_pictures import MAX_LEVELS

    n = 13
    deep = step(list(range(1, n + 1)), [-1] + list(range(n - 1)), list(range(n)), list(range(2, n + 2)),
                ["root"] + ["context"] * (n - 1))
    trace = Trace(steps=[deep], token_texts={t: f"w{t}" for t in range(n + 3)})
    tree, verdict = tour_screens(trace, 0)[2:4]
    assert f"+ {n - 1 - MAX_LEVELS} deeper drafts, not drawn" in words_of(tree.picture)
    assert f"+ {n - 1 - MAX_LEVELS} more accepted" in words_of(verdict.picture) and "★" not in verdict.picture
    assert "12 drafts over 12 levels: 12 copied." in tree.words
    assert min(int(x) for x in re.findall(r'font-size="(\d+)"', verdict.picture)) >= 20


def test_the_mask_numbers_the_rows_of_a_token_that_stands_on_several():
    # a cold reader met mask rows "↵, ↵, ```" with nothing to tell the two "↵" apart
    from present.tour_pictures import mask_labels

    assert mask_labels(["```", "\n", "python", "\n"]) == ["```", "↵·1", "python", "↵·2"]
    assert mask_labels([" a", " b"]) == ["␣a", "␣b"]


def test_the_mask_lists_its_rows_level_by_level_as_the_tree_draws_them():
    """A reader found the mask's rows in neither BFS nor the picture's order (node indices: a hybrid tree appends
    its copies after the matrix's candidates)."""
    from present.tour_pictures import mask_svg

    ev = StepEvent(step=0, position=5, tokens=[10, 11, 12, 13], parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2],
                   ranks=[-1, 1, 0, 0], accepted=[0, 1], emitted=[11, 9], bonus=9, timings={},
                   sources=["root", "matrix", "matrix", "matrix"])
    picture = mask_svg(ev, lambda t: f"t{t}", 0, 450)
    labels = re.findall(r">(t\d+)</text>", picture)
    assert labels == ["t10", "t12", "t11", "t13"]  # the root, then rank 0 (drawn above) before rank 1, then depth 2


def test_the_mask_colours_a_row_by_its_nodes_verdict_as_the_tree_does():
    """A cold reader found the rejected rows of the mask dark, the root's colour, beside a tree whose rejected drafts
    are light grey: a row's filled cells are green on the accepted path, the tree's grey elsewhere."""
    from present.style import ACCEPTED_COLOUR, REJECTED_COLOUR
    from present.tour_pictures import DRAFT, mask_svg

    ev = StepEvent(step=0, position=5, tokens=[10, 11, 12, 13], parents=[-1, 0, 0, 1], depths=[0, 1, 1, 2],
                   ranks=[-1, 1, 0, 0], accepted=[0, 1], emitted=[11, 9], bonus=9, timings={},
                   sources=["root", "matrix", "matrix", "matrix"])
    fills = re.findall(r'<rect [^>]*fill="([^"]+)"', mask_svg(ev, lambda t: f"t{t}", 0, 450))
    # rows t10 (root), t12 (rejected), t11 (accepted), t13 (rejected): itself and its ancestors filled
    assert fills.count(ACCEPTED_COLOUR) == 1 + 2 and fills.count(REJECTED_COLOUR) == 2 + 3
    assert DRAFT not in fills and "itself" in mask_svg(ev, lambda t: f"t{t}", 0, 450)


def test_the_first_screen_shows_the_roots_own_candidates_or_only_the_models_pick():
    """A row is written once per distinct token: when the root's token stands at another node too (". ↵↵ 3 ." with
    '.' at the root and at the end of the path), the row written for it may be that node's, so the first screen
    shows the model's pick alone rather than another node's candidates; a tour prefers a step without that doubt."""
    from present.tour import plain_screen, root_row_is_its_own

    text = lambda t: f"t{t}"  # noqa: E731
    own = step([1, 2, 3], [-1, 0, 1], [0, 1, 2], [2, 3, 9], ["root", "matrix", "matrix"])
    own.matrix_rows, own.matrix_values, own.matrix_probs = [1, 2, 3], [[2, 5, 6], [3], [9]], [[0.5, 0.2, 0.1], [1.0], [1.0]]
    twice = step([1, 2, 1], [-1, 0, 1], [0, 1, 2], [2, 1, 7], ["root", "matrix", "matrix"])
    twice.matrix_rows, twice.matrix_values, twice.matrix_probs = [1, 2], [[7, 8], [1]], [[0.6, 0.1], [1.0]]
    assert root_row_is_its_own(own) and not root_row_is_its_own(twice)
    assert "t5" in plain_screen(own, text).picture and "t6" in plain_screen(own, text).picture
    shown = plain_screen(twice, text)
    assert "t7" not in shown.picture and "t2" in shown.picture and "its top 1 here" in shown.words
    assert telling_step(Trace(steps=[twice, own])) == 1 and telling_step(Trace(steps=[own, twice])) == 0


def test_the_tile_works_out_a_speedup_above_tokens_a_step_from_the_two_measured_figures(trace):
    """A reader asked how 1.83× can exceed 1.80 tokens a step: the tile divides the measured tokens a step by a
    step's time in plain steps (derived: tokens a step ÷ the measured speedup), and says so only when measured."""
    from present.tour import step_cost

    i = telling_step(trace)
    per_step = sum(len(e.emitted) for e in trace.steps) / len(trace.steps)
    measured = copy.copy(trace)
    measured.speed = {"trusted": True, "ratio": 1.83, "error": 0.04, "plain_tps": 40.0}
    shown = html.unescape(words_of(tour_screens(measured, i)[-1].picture))
    cost = step_cost(per_step, 1.83)
    assert f"{per_step:.2f} tokens a step ÷ {cost} = 1.83×" in shown, shown
    assert f"a step took on average {cost} of a plain step's time" in shown, shown
    assert round(round(per_step, 2) / float(cost), 2) == 1.83  # the arithmetic as shown checks out
    assert step_cost(1.80, 1.83) == "0.984" and step_cost(1.49, 1.51) == "0.99"  # 1.80 ÷ 0.98 would give 1.84
    assert "÷" not in words_of(tour_screens(trace, i)[-1].picture)  # not measured: no arithmetic
    noisy = copy.copy(trace)
    noisy.speed = {"trusted": False, "ratio": 1.83, "plain_tps": 40.0}
    assert "÷" not in words_of(tour_screens(noisy, i)[-1].picture)


def test_every_screen_names_the_drafting_and_whether_it_is_the_papers(trace):
    paper = html.unescape(tour_html(trace, telling_step(trace)))
    assert paper.count("Paper's 80-node tree (the paper's own)") == 7 and "not in the paper" not in paper
    sized = copy.copy(trace)
    sized.settings = {**trace.settings, "template": "adaptive"}
    assert html.unescape(tour_html(sized, 0)).count("Matrix only (the paper's)") == 7
    hybrid = copy.copy(trace)
    hybrid.settings = {**trace.settings, "template": "hybrid"}
    assert html.unescape(tour_html(hybrid, 0)).count("Matrix + context (not in the paper)") == 7
    unknown = copy.copy(trace)
    unknown.settings = {}
    assert "paper" not in re.sub(r"<svg.*?</svg>", "", tour_html(unknown, 0))


def test_the_tree_legends_keep_one_rule_shape_is_where_from_colour_is_the_verdict():
    """A reader found a light grey circle "from the matrix" on the page and a grey circle "rejected" in the tour;
    later ones found no drawn node like an outlined key: the legend's colours are swatches of no shape, its shapes
    after "shape:", filled in the slate the drafts are drawn in before the verdict, in the tour as on the page."""
    ev = step([1, 2, 3, 4, 5], [-1, 0, 0, 1, 0], [0, 1, 3], [2, 4, 9], ["root", "matrix", "context", "both", "matrix"])
    trace = Trace(steps=[ev], token_texts={t: f"w{t}" for t in range(10)}, settings={"template": "hybrid"})
    tree, verdict = tour_screens(trace, 0)[2:4]
    for picture, words in ((tree, ("root", "not checked yet")), (verdict, ("root", "accepted", "rejected", "bonus"))):
        legend = re.findall(r'<(circle|rect|polygon)([^>]*(?:cy="445"|y="439"|y="435"|,445 )[^>]*)/>', picture.picture)
        shapes = [attrs for tag, attrs in legend if 'width="26"' not in attrs]  # the swatches are 26 px strokes
        assert len(shapes) == 3 and all('fill="#334155"' in attrs for attrs in shapes), legend
        assert "shape:" in words_of(picture.picture)
        assert sum('width="26"' in attrs for _, attrs in legend) == len(words) - ("bonus" in words), legend
        shown = words_of(picture.picture)
        for w in (*words, "from the matrix", "copied", "both"):
            assert w in shown, (w, shown)


def test_the_cost_chart_explains_a_cost_under_1_only_where_one_is_drawn_visibly_under_it():
    """A reader met 'under 1: a step of a few tokens took less time…' beside a curve at 0.99, nowhere visibly under
    1; the note stands where a cost is drawn visibly under one plain step."""
    from present.cost_chart import cost_chart_svg

    tile = ("1.50×", "as fast as plain decoding")
    near = cost_chart_svg([(1, 1.0), (2, 1.18), (6, 0.99), (8, 1.11)], (8, 3), tile, "")
    under = cost_chart_svg([(1, 1.0), (4, 0.85), (8, 1.11)], (8, 3), tile, "")
    assert "under 1:" not in near and "under 1:" in under


def test_the_accepted_path_shows_whole_tokens_where_the_line_has_room():
    """tour_pictures.chip_labels: a chip grows to its token (a reader met '␣situati…' in a tile with room to
    spare); only a line too wide for the picture cuts every label, with '…'."""
    from present.tour_pictures import W, chip_labels

    labels, widths = chip_labels([" situation", " is", "<|im_end|>"], gap=18)
    assert labels == ["␣situation", "␣is", "‹end›"] and widths[0] > widths[1] == 150
    labels, widths = chip_labels([" understanding"] * 7, gap=18)
    assert all(label.endswith("…") for label in labels) and sum(widths) + 6 * 18 <= W


def test_the_bonus_star_stands_clear_of_the_drafts_drawn_where_it_would_go():
    """tour_pictures.star_y: level with the path's end, unless a drafted node of the next level stands there (a
    reader found the star hidden under one); then the nearest height clear of every such node."""
    from present.tour_pictures import STAR_CLEAR, star_y

    ev = StepEvent(step=0, position=5, tokens=[1, 2, 3, 4], parents=[-1, 0, 1, 2], depths=[0, 1, 2, 3],
                   ranks=[-1, 0, 0, 0], accepted=[0, 1, 2], emitted=[2, 3, 9], bonus=9, timings={})
    xy = {0: (60, 200), 1: (200, 200), 2: (340, 200), 3: (480, 200)}  # node 3, rejected, where the star would go
    y = star_y(ev, 2, xy)
    assert abs(y - 200) >= STAR_CLEAR and 20 <= y <= 400
    assert star_y(ev, 2, {**xy, 3: (480, 100)}) == 200  # the spot is free: level with the path's end


def test_the_papers_80_node_tree_keeps_its_labels_apart_and_its_whole_path_named():
    """A cold reader could not read the paper's own 80-node step at 1280x720 (labels over labels, markers over
    markers): in each level no two labels closer than LABEL_GAP, the accepted path written out whole where its
    columns are too narrow to name it, markers shrunk to their level's spacing (the path's full size)."""
    from test_figures import paper_tree_event

    from present.tour_pictures import LABEL_GAP, tree_svg

    ev = paper_tree_event((0, 1, 0, 0, 0))
    names = {i: f"w{i}" for i in range(len(ev.tokens))}
    token_text = lambda t: names[ev.tokens.index(t)] if t in ev.tokens else "bonus"  # noqa: E731
    for verdict in (False, True):
        drawn = tree_svg(ev, token_text, verdict=verdict, mask=verdict)
        labels = re.findall(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*>(w\d+)</text>', drawn)
        by_x: dict[str, list[float]] = {}
        for x, y, _ in labels:
            by_x.setdefault(x, []).append(float(y))
        for ys in by_x.values():
            ys.sort()
            assert all(b - a >= LABEL_GAP - 1 for a, b in zip(ys, ys[1:])), ys  # drawn at whole pixels
        if not verdict:  # a reader found 5 of the root's 8 candidates unnamed: a small subtree got too thin a band
            named = {name for _, _, name in labels}
            first = [i for i in range(len(ev.tokens)) if ev.depths[i] == 1]
            assert len(first) == 8 and {f"w{i}" for i in first} <= named, sorted(named)
        if verdict:  # beside the mask the columns are a few letters wide: the path written out above the tree
            strip = " ".join(re.findall(r'fill="#16a34a"[^>]*font-weight="700"[^>]*>([^<]*)</text>', drawn))
            path = "  ".join(f"w{i}" for i in ev.accepted[1:])
            assert f"accepted: {path}  + ★ {token_text(ev.bonus)}" in strip, strip
        radii = [float(r) for r in re.findall(r'<circle [^>]*r="([\d.]+)"', drawn)]
        assert min(radii) >= 4 and (max(radii) == 15)  # the root's 11 + 4
        assert sorted(radii).count(11.0) >= (len(ev.accepted) - 1 if verdict else 0)


def test_the_papers_tree_folds_its_deep_levels_into_counts_beside_their_branches():
    """Readers found the paper's levels 3 to 6 merged into bars of markers: a tree of more than FOLD_OVER nodes
    draws its first FOLD_DEPTH levels (and, after the verdict, its path), every other draft counted as "+n" where
    its branch goes on; the counts add up to the drafts not drawn, and the columns widen to the levels drawn."""
    from test_figures import paper_tree_event

    from present.tour_pictures import FOLD_DEPTH, tree_svg

    ev = paper_tree_event((0, 1, 0, 0, 0))
    names = {i: f"w{i}" for i in range(len(ev.tokens))}
    token_text = lambda t: names[ev.tokens.index(t)] if t in ev.tokens else "bonus"  # noqa: E731
    for verdict in (False, True):
        drawn = tree_svg(ev, token_text, verdict=verdict, mask=verdict)
        counts = [int(n) for n in re.findall(r'>\+ ?(\d+)(?: more drafts, not drawn)?</text>', drawn)]
        kept = [i for i in range(len(ev.tokens)) if ev.depths[i] <= FOLD_DEPTH or (verdict and i in ev.accepted)]
        assert sum(counts) == len(ev.tokens) - len(kept) > 0, (verdict, counts)
        markers = re.findall(r'<circle ', drawn)
        assert len(markers) == len(kept) + 1, (verdict, len(markers), len(kept))  # and the legend's "from the matrix"
        if not verdict:  # three columns (two levels and the counts) across the picture: labels of 12 letters
            assert re.search(r'>w\d+</text>', drawn) and "+n" in drawn and "deeper drafts, not drawn" in drawn
        else:  # beside the path, one total: a branch's count split along the path read as two counts of one branch
            assert len(counts) == 1 and "+n" not in drawn


def test_the_cost_chart_ticks_the_largest_size_it_timed():
    """A reader read the paper's 81-token step plotted at the tick "80": the largest size gets its own tick, in place
    of a round one too close to it; no tick twice."""
    from present.cost_chart import size_ticks

    assert size_ticks(81) == [1, 20, 40, 60, 81] and size_ticks(8) == [1, 2, 4, 6, 8]
    assert size_ticks(33) == [1, 10, 20, 33] and size_ticks(2) == [1, 2]


def test_the_figures_shown_divide_to_the_speedup_shown():
    """Readers divided the shown figures with a calculator: 1.58 ÷ 1.035 gave 1.53 and 2.20 ÷ 3.354 gave 0.66, against
    1.52 and 0.65 shown. Tokens a step and a step's cost take the fewest digits that give the speedup back."""
    from present.tour import step_figures

    for tokens, ratio in ((112 / 71, 1.524), (112 / 51, 0.6549), (1.6, 1.6), (2.0, 0.6), (1.0, 1.0), (1.49, 1.51)):
        shown_tokens, shown_cost = step_figures(tokens, ratio)
        assert round(float(shown_tokens) / float(shown_cost), 2) == round(ratio, 2), (tokens, ratio)
    assert step_figures(112 / 71, 1.524) == ("1.58", "1.04") and step_figures(2.0, 0.6) == ("2.00", "3.33")
    assert step_figures(112 / 51, 0.6549)[0] == "2.196"  # two digits of tokens give no cost back


def test_a_steps_cost_label_sits_where_a_rising_curve_and_the_step_label_are_not():
    """'cost 2.98' beside its point: above left (a rising curve runs below left and above right), below right where
    the y axis leaves no room on the left, and never over the step's own label."""
    from present.cost_chart import CHART, cost_label, step_box

    def spot(x, y, box):
        m = re.search(r'x="(\d+)" y="(\d+)"', cost_label(x, y, 2.98, box))
        return int(m[1]), int(m[2])

    far = step_box(400, 60, room_right=True)  # the step's label high above, to the right
    x0, y0 = spot(400, 250, far)
    assert x0 < 400 - 14 - 100 and y0 < 250  # above left, the whole label before the point
    x0, y0 = spot(CHART[0] + 30, 250, far)  # beside the y axis: below right
    assert x0 > CHART[0] + 30 and y0 > 250
    near = step_box(400, 235, room_right=False)  # the step's label on the left, at the point's height
    x0, y0 = spot(400, 250, near)
    assert x0 > 400 and y0 > 250  # below right, clear of it
    assert not (near[0] <= x0 <= near[2] and near[1] <= y0 <= near[3])


def test_the_tour_buttons_status_says_what_was_done_not_keys_that_stop_working_when_it_closes(trace):
    """The tour covers the status line while open; after it closes the line stays (a reader found its key hints under
    the microscope), so it says which step was toured, the keys only as what they do inside the tour."""
    from studio.session import Session
    from studio.traces import tour

    s = Session(model="m", k=8)
    assert tour(s, 1) == {"status": "No answer to tour yet: send a message or load a trace.", "tour": ""}
    s.trace = trace
    shown = tour(s, 2)
    assert shown["status"].startswith(f"Toured step 2 of {len(trace.steps)} (in the tour,")
    assert 'class="tr-tour' in shown["tour"]
