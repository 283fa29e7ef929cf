"""The paper's method beside the hybrid (studio/side_by_side.py): one question, three methods from one starting
matrix, taking turns; both Token Recycling answers are plain decoding's, and the panel says what each one bought."""
from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

from conftest import TINY_VOCAB, TinyTokenizer, tiny_model, unglossed

from studio import side_by_side as sbs
from studio.meter import SpeedEstimate
from tr_core import Engine
from tr_core.config import DecodeConfig
from tr_core.events import StepEvent
from tr_core.trace import Trace
from present.tour import step_figures, telling_index, tour_html


def tiny_session(asked: bool = True, tokens: int = 24) -> SimpleNamespace:
    """A session after one answer (`asked`): the engine as the answer began, its prompt and settings."""
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB), tune_kernels=False)
    ids = engine.encode_chat([{"role": "user", "content": "a b c d"}])
    start = (engine.fork(), ids, DecodeConfig(max_new_tokens=tokens, template="hybrid")) if asked else None
    return SimpleNamespace(engine=engine, answering=False, last_start=start, trace=None)


def estimate(ratio: float | None, error: float = 0.03, identical: bool | None = True) -> SpeedEstimate:
    return SpeedEstimate(ratio, error, None, None, None, 24, 8, ratio is not None, "" if ratio else "noisy",
                         identical=identical)


def test_every_method_is_timed_against_plain_decoding_in_turns_from_the_same_start():
    s = tiny_session()
    start, ids, cfg = s.last_start
    held, starts = [], []

    @contextlib.contextmanager
    def hold():
        held.append(1)
        yield

    def fork():
        starts.append(1)
        return start.fork()

    progress = list(sbs.run_methods(fork, ids, cfg, {}, hold=hold, max_s=30.0, chunk_ms=5.0))
    assert [p[:2] for p in progress] == [(1, 3), (2, 3), (3, 3)] and len(held) == 3 and len(starts) >= 3
    results = progress[-1][2]
    for template in (sbs.PAPER, sbs.SIZED, sbs.HYBRID):
        run = results[template]
        assert len(run.tokens) == 24 and run.est.identical is True and not run.own  # plain decoding's tokens
        assert run.est.pairs >= 2 and run.est.tokens > 0  # measured in alternating turns
        assert run.steps and all(ev.template == template for ev in run.steps)  # the first decode's steps


def test_the_answer_itself_is_its_trees_card_with_the_meters_figure():
    """A reader saw 1.73x on the hybrid's card beside 1.67x on the meter of the same answer: the card is now the
    answer, and only the other tree is decoded for the comparison."""
    s = tiny_session()
    start, ids, cfg = s.last_start
    s.trace = answered(s, 1.67)
    steps = s.trace.steps
    views = list(sbs.compare_methods(s, lambda: 0, contextlib.nullcontext, "Test CPU", chunk_ms=5.0))
    assert [v["status"] for v in views[:-1]] == ["Timing Paper's 80-node tree against plain decoding…",
                                                 "Timing Matrix only against plain decoding…"]
    shown = unglossed(views[-1]["sides"])
    assert ">1.67×<span" in shown and "your answer above, as its meter measured it" in shown
    assert "decoded now, from the same start" in shown and "up to 24 new tokens" in shown
    from present.tour import telling_index
    assert f"step {telling_index(steps) + 1} (most drafts from the matrix alone accepted)" in shown


def answered(s: SimpleNamespace, ratio: float) -> Trace:
    """The session's answer as the studio records it (the microscope's provenance on), measured at `ratio`."""
    start, ids, cfg = s.last_start
    trace = Trace(model="tiny", settings={**dataclasses.asdict(cfg), "k": 8, "machine": "Test CPU"},
                  messages=[{"role": "user", "content": "a b c d"}], speed=dataclasses.asdict(estimate(ratio)))
    for ev in start.fork().generate(ids, cfg.with_(provenance=True)):
        if isinstance(ev, StepEvent):
            trace.add_step(ev, s.engine.token_text)
    return trace


def test_each_card_opens_the_guided_tour_of_the_step_it_draws():
    """A cold reader asked for the paper's own 80-node step made legible at 1280x720: each card's button opens the
    seven-screen tour of the step its card draws, from that method's own decode (the rows its steps read recorded),
    with the method named and its measured cost; the hybrid's card tours the answer itself."""
    s = tiny_session()
    s.trace = answered(s, 1.67)
    views = list(sbs.compare_methods(s, lambda: 0, contextlib.nullcontext, "Test CPU", chunk_ms=5.0))
    shown = views[-1]["sides"]
    assert shown.count('class="tr-side-tour"') == 3 and shown.count('class="tr-tour"') == 3
    assert shown.count('class="tr-tour-screen"') == 3 * 7
    start, ids, cfg = s.last_start
    paper = list(sbs.run_methods(start.fork, ids, cfg, {sbs.SIZED: None, sbs.HYBRID: None}, chunk_ms=5.0))[-1][2]
    paper = paper[sbs.PAPER]
    assert any(ev.rows_read for ev in paper.steps)  # what its tour's second screen shows: the rows each step read
    tour = sbs.card_tour(paper, s.trace, s.engine.token_text)
    best = telling_index(paper.steps)
    assert f"Step {best + 1} of {len(paper.steps)}" in tour  # the step its card draws
    assert tour.split("</section>")[0] in shown  # the same step's screens (the panel's run was timed on its own)
    assert "Paper&#x27;s 80-node tree (the paper&#x27;s own)" in tour and "Matrix + context" not in tour
    if paper.steps[best].rows_read:
        assert "This step read no matrix row" not in tour
    own = sbs.card_tour(sbs.own_run(s.trace), s.trace, s.engine.token_text)
    assert own == tour_html(s.trace, telling_index(s.trace.steps)) and own in shown
    assert sbs.card_tour(paper, None, s.engine.token_text) == ""  # no answer: no tour


def test_the_panel_reads_as_the_meter_cards_and_bars_agree():
    s = tiny_session()
    start, ids, cfg = s.last_start
    results = list(sbs.run_methods(start.fork, ids, cfg, {}, chunk_ms=5.0))[-1][2]
    results[sbs.PAPER].est, results[sbs.HYBRID].est = estimate(0.63, 0.02), estimate(1.73)
    results[sbs.SIZED].est = estimate(1.31)
    shown = unglossed(sbs.side_by_side_html(results, "Test CPU, 2 threads", exact=False, tokens=24))
    assert "Paper&#x27;s 80-node tree: the paper&#x27;s method, the matrix alone" in shown and "Matrix + context, the hybrid: also copies" in shown
    assert "Matrix only: the paper&#x27;s drafting, its tree sized each step" in shown
    assert shown.count("✓ token-identical to plain decoding") == 3 and "✓ All 3 answers are plain decoding" in shown
    assert "up to 24 new tokens, on Test CPU, 2 threads" in shown and "24 tokens = " in shown  # drafts credited
    assert "alternating short turns, as the meter times an answer" in shown
    assert shown.count("<svg") == 4  # each method's telling step, and why each is as fast as it is
    assert ">0.63×<span" in shown and "± 0.02" in shown and ">1.73×<span" in shown
    for template, ratio in ((sbs.PAPER, 0.63), (sbs.SIZED, 1.31), (sbs.HYBRID, 1.73)):  # the bars: green ÷ grey is the card's speed
        run = results[template]
        tokens, cost = step_figures(run.per_step, ratio)  # readers divided the figures shown: they give it back
        assert f">{tokens}<" in shown and f">{cost}<" in shown
        assert round(float(tokens) / float(cost), 2) == ratio
        assert f">{ratio:.2f}×</text>" in shown
    results[sbs.HYBRID].est = estimate(None)  # too noisy: said, and no bar claims a speed
    shown = unglossed(sbs.side_by_side_html(results, "Test CPU", exact=False, tokens=24))
    assert "too noisy to measure" in shown and "The hybrid, sized here" not in shown


def test_the_handler_needs_an_answer_and_a_quiet_page_and_ends_with_the_panel():
    free = contextlib.nullcontext
    assert list(sbs.compare_methods(tiny_session(False), lambda: 0, free, "")) == [{"status": sbs.NEED_QUESTION}]
    assert list(sbs.compare_methods(tiny_session(), lambda: 3, free, "")) == [{"status": sbs.BUSY_NOW}]
    views = list(sbs.compare_methods(tiny_session(tokens=12), lambda: 0, free, "Test CPU", chunk_ms=5.0))
    assert all("Timing" in v["status"] for v in views[:-1]) and len(views) == 1 + len(sbs.METHODS)  # one a method
    assert 'class="tr-sides tr-sides-open"' in views[-1]["sides"] and views[-1]["status"].startswith(f"✓ {sbs.TITLE}")
    assert "up to 12 new tokens" in views[-1]["sides"]
    views = list(sbs.compare_methods(tiny_session(tokens=900), lambda: 3 if False else 0, free, "", chunk_ms=5.0))
    assert f"up to {sbs.MOST_TOKENS} new tokens" in views[-1]["sides"]


def test_on_zerogpu_the_comparison_says_why_it_does_not_run(monkeypatch):
    from studio import zerogpu

    monkeypatch.setattr(zerogpu, "installed", lambda: True)
    assert list(sbs.compare_methods(tiny_session(), lambda: 0, contextlib.nullcontext, "")) == [
        {"status": sbs.ON_ZEROGPU}]


def test_a_crowd_arriving_stops_the_comparison_between_runs():
    calls = iter([0, 0, 5])
    views = list(sbs.compare_methods(tiny_session(), lambda: next(calls, 5), contextlib.nullcontext, ""))
    assert views[-1] == {"status": sbs.BUSY_NOW} and "sides" not in views[-1]


def test_hostile_names_and_machines_are_escaped():
    start, ids, cfg = tiny_session(tokens=4).last_start
    results = list(sbs.run_methods(start.fork, ids, cfg, {}, chunk_ms=5.0))[-1][2]
    shown = sbs.side_by_side_html(results, "<img src=x onerror=alert(1)>", exact=True, tokens=4)
    assert "<img" not in shown and "&lt;img" in shown


def test_the_comparison_names_the_machine_it_runs_on_not_a_loaded_traces(monkeypatch):
    """A visitor may have loaded a trace recorded elsewhere: the side-by-side runs here, and says so."""
    from studio import page
    from studio.handlers import precision

    s = tiny_session()
    s.trace = SimpleNamespace(settings={"machine": "Somebody's GPU"})
    seen = []
    monkeypatch.setattr(sbs, "compare_methods", lambda s, crowd, slot, machine, *_: seen.append(machine) or iter(()))
    registry = SimpleNamespace(get=lambda state, request: s,
                               studio=SimpleNamespace(config=SimpleNamespace(measure_max_s=30.0, measure_chunk_ms=250.0)))
    list(page._sides_fn(registry, {"state": "state"})(None, None))
    assert seen == [precision(s.engine)["machine"]] and "Somebody" not in seen[0]


def test_where_the_papers_tree_loses_the_foot_says_why_from_the_measured_figures():
    """Readers saw 0.70x for the paper's method with the reason only in a closed panel."""
    from tr_core.events import StepEvent

    def run(template: str, n_steps: int, nodes: int, ratio: float | None) -> sbs.MethodRun:
        step = StepEvent(step=0, position=1, tokens=list(range(nodes)), parents=[-1] + [0] * (nodes - 1),
                         depths=[0] + [1] * (nodes - 1), ranks=[-1] + list(range(nodes - 1)), accepted=[0, 1],
                         emitted=[5, 6], bonus=6, timings={})
        return sbs.MethodRun(template, template, [step] * n_steps, estimate(ratio))

    results = {sbs.PAPER: run(sbs.PAPER, 21, 81, 0.6), sbs.SIZED: run(sbs.SIZED, 21, 7, 1.3),
               sbs.HYBRID: run(sbs.HYBRID, 21, 9, 1.5)}
    foot = unglossed(sbs.side_by_side_html(results, "a CPU", exact=False, tokens=42))
    assert "checks up to 81 tokens in one forward: 3.33 plain steps here" in foot  # 2 tokens a step / 0.6
    assert "(not measured here)" in foot and ">3.33<" in foot.split("checks up to")[0]  # the bars show that cost
    for ratio in (1.2, None):  # faster than plain decoding, or not measured: nothing to explain
        results[sbs.PAPER] = run(sbs.PAPER, 21, 81, ratio)
        assert "checks up to" not in unglossed(sbs.side_by_side_html(results, "a GPU", exact=False, tokens=42))


def test_the_pictures_draw_green_over_grey_and_every_node_of_the_best_step():
    """The bars' speed is tokens per step over a step's cost, red where under plain decoding; each card's tree is
    the step with the most accepted drafts, every node drawn, the path green and the bonus a star."""
    from present import sides
    from present.style import ACCEPTED_COLOUR
    from tr_core.events import StepEvent

    svg = sides.pays_svg([("Plain decoding", 1.0, 1.0, 1.0), ("paper", 2.21, 2.94, 0.75), ("hybrid", 1.56, 0.89, 1.75)])
    assert ">1.00×<" in svg and ">0.75×<" in svg and ">1.75×<" in svg and sides.LOSS_COLOUR in svg
    assert "under 1" in svg and "under 1" not in sides.pays_svg([("a", 2.0, 1.5, 1.33)])

    def step(accepted: list[int], n: int, bonus: int | None = 1) -> StepEvent:
        return StepEvent(step=0, position=1, tokens=list(range(n)), parents=[-1] + list(range(n - 1)),
                         depths=list(range(n)), ranks=[-1] + [0] * (n - 1), accepted=accepted,
                         emitted=[1] * (len(accepted) - 1 + (bonus is not None)), bonus=bonus, timings={})

    best = sides.best_step([step([0], 5), step([0, 1, 2], 5), step([0, 1, 2, 3], 5), step([0, 1], 6)])
    assert best.accepted == [0, 1, 2, 3]  # the page's rule: the most matrix drafts accepted
    drawn = sides.silhouette_svg(best)
    assert drawn.count("<circle") == 5 and drawn.count("<polygon") == 1  # four drafts and the root; the star
    assert drawn.count(f'stroke="{ACCEPTED_COLOUR}"') == 3  # the three accepted edges


def test_a_card_the_time_cap_stopped_says_how_far_it_got():
    """A reader divided a whole answer by the steps of a run the 30 s cap had stopped: such a card says over how many
    of the answer's tokens and steps it was timed; a whole run's card does not."""
    s = tiny_session()
    start, ids, cfg = s.last_start
    results = list(sbs.run_methods(start.fork, ids, cfg, {}, chunk_ms=5.0))[-1][2]
    paper = results[sbs.PAPER]
    cut = dataclasses.replace(paper, steps=paper.steps[:2])
    longest = max(len(run.tokens) for run in results.values())
    assert len(cut.tokens) < longest
    shown = sbs.side_by_side_html({**results, sbs.PAPER: cut}, "Test CPU", None, cfg.max_new_tokens)
    note = f"timed over its first {len(cut.tokens)} of {longest} tokens in 2 steps (time cap)"
    assert shown.count("(time cap)") == 1 and note in shown
    assert "(time cap)" not in sbs.side_by_side_html(results, "Test CPU", None, cfg.max_new_tokens)
