"""The paper's method beside the hybrid (studio/side_by_side.py): one question, three methods from one starting
matrix, taking turns; both Token Recycling answers are plain decoding's, and the panel says what each one bought."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

from conftest import TINY_VOCAB, TinyTokenizer, tiny_model, unglossed

from studio import side_by_side as sbs
from tr_core import Engine


def tiny_session(history: list[dict] | None = None) -> SimpleNamespace:
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB), tune_kernels=False)
    return SimpleNamespace(engine=engine, warm_state=engine.snapshot(), answering=False,
                           history=history if history is not None else [{"role": "user", "content": "a b c d"}])


def test_every_method_answers_from_the_same_start_and_the_drafts_are_plain_decodings_tokens():
    s = tiny_session()
    ids = s.engine.encode_chat([{"role": "user", "content": "a b c d"}])
    held = []

    @contextlib.contextmanager
    def hold():
        held.append(1)
        yield

    progress = list(sbs.run_methods(lambda: s.engine.fork(), ids, tokens=24, rounds=2, hold=hold))
    assert [p[:2] for p in progress] == [(i, 6) for i in range(1, 7)] and len(held) == 6
    results = progress[-1][2]
    plain = results["plain"]
    assert len(plain.tokens) == 24 and plain.per_step == 1.0
    for template in (sbs.PAPER, sbs.HYBRID):
        assert results[template].tokens == plain.tokens and len(results[template].steps) <= len(plain.steps)
    shown = unglossed(sbs.side_by_side_html(results, "Test CPU, 2 threads", exact=False))
    assert "The paper&#x27;s method: the matrix alone, its 80-node tree" in shown and "The hybrid: matrix + context" in shown
    assert shown.count("✓ token-identical to plain decoding") == 2 and "✓ Both answers are plain decoding" in shown
    assert "on Test CPU, 2 threads" in shown and "24 tokens = " in shown and "Your last question, 24 tokens each" in shown  # the drafts' credit, as the chart's
    assert f"a step {plain.step_ms:.0f} ms" in shown  # why fewer steps need not be faster: the bars' yardstick
    assert shown.count("<svg") == 3  # each method's best step, and why each is as fast as it is
    for template in (sbs.PAPER, sbs.HYBRID):  # the picture's ratio is the card's: green over grey
        run = results[template]
        assert f"{run.per_step:.2f}" in shown and f"{sbs.step_cost(run, plain):.2f}" in shown
        assert shown.count(f">{sbs.speed(run, plain):.2f}×<") == 2  # the card's speed and the bars' agree


def test_the_handler_needs_a_question_and_a_quiet_page_and_ends_with_the_panel():
    free = contextlib.nullcontext
    assert list(sbs.compare_methods(tiny_session([]), lambda: 0, free, "")) == [{"status": sbs.NEED_QUESTION}]
    assert list(sbs.compare_methods(tiny_session(), lambda: 3, free, "")) == [{"status": sbs.BUSY_NOW}]
    views = list(sbs.compare_methods(tiny_session(), lambda: 0, free, "Test CPU"))
    assert all("run " in v["status"] for v in views[:-1]) and len(views) == 1 + 2 * len(sbs.METHODS)
    assert 'class="tr-sides tr-sides-open"' in views[-1]["sides"] and "side by side" in views[-1]["status"]


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
    s = tiny_session()
    ids = s.engine.encode_chat([{"role": "user", "content": "x"}])
    results = list(sbs.run_methods(lambda: s.engine.fork(), ids, tokens=4, rounds=1))[-1][2]
    shown = sbs.side_by_side_html(results, "<img src=x onerror=alert(1)>", exact=True)
    assert "<img" not in shown and "&lt;img" in shown


def test_the_comparison_names_the_machine_it_runs_on_not_a_loaded_traces(monkeypatch):
    """A visitor may have loaded a trace recorded elsewhere: the side-by-side runs here, and says so."""
    from studio import page
    from studio.handlers import precision

    s = tiny_session()
    s.trace = SimpleNamespace(settings={"machine": "Somebody's GPU"})
    seen = []
    monkeypatch.setattr(sbs, "compare_methods", lambda s, crowd, slot, machine: seen.append(machine) or iter(()))
    registry = SimpleNamespace(get=lambda state, request: s)
    list(page._sides_fn(registry, {"state": "state"})(None, None))
    assert seen == [precision(s.engine)["machine"]] and "Somebody" not in seen[0]


def test_where_the_papers_tree_loses_the_foot_says_why_from_the_measured_step_times():
    """Readers saw 0.70x for the paper's method with the reason only in a closed panel."""
    from tr_core.events import StepEvent

    def run(template: str, n_steps: int, seconds: float, nodes: int) -> sbs.MethodRun:
        step = StepEvent(step=0, position=1, tokens=list(range(nodes)), parents=[-1] + [0] * (nodes - 1),
                         depths=[0] + [1] * (nodes - 1), ranks=[-1] + list(range(nodes - 1)), accepted=[0],
                         emitted=[5], bonus=5, timings={})
        return sbs.MethodRun(template, template, [1] * 42, [step] * n_steps, seconds)

    results = {"plain": run("plain", 42, 2.8, 1), sbs.PAPER: run(sbs.PAPER, 18, 4.2, 81),
               sbs.HYBRID: run(sbs.HYBRID, 24, 1.7, 9)}
    foot = unglossed(sbs.side_by_side_html(results, "a CPU", exact=False))
    assert "checks up to 81 tokens in one forward: 3.50 plain steps here" in foot  # 233.3 ms / 66.7 ms
    assert "about 2× there" in foot and ">3.50<" in foot.split("checks up to")[0]  # the bars show the same cost
    results[sbs.PAPER] = run(sbs.PAPER, 18, 1.4, 81)  # faster than plain decoding: nothing to explain
    assert "checks up to" not in unglossed(sbs.side_by_side_html(results, "a GPU", exact=False))


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

    best = sides.best_step([step([0], 5), step([0, 1, 2], 5), step([0, 1, 2], 6), step([0, 1, 2, 3], 5, None)])
    assert best.accepted == [0, 1, 2] and len(best.tokens) == 5  # the first of equals; a cut last step gained 3
    drawn = sides.silhouette_svg(best)
    assert drawn.count("<circle") == 5 and drawn.count("<polygon") == 1  # four drafts and the root; the star
    assert drawn.count(f'stroke="{ACCEPTED_COLOUR}"') == 2  # the two accepted edges
