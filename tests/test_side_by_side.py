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
    assert "The paper&#x27;s method as published: the matrix alone, its 80-node tree" in shown and "Hybrid: matrix + context" in shown
    assert shown.count("✓ token-identical to plain decoding") == 2 and "✓ Both answers are plain decoding" in shown
    assert "on Test CPU, 2 threads" in shown and "24 tokens = " in shown and "Your last question, 24 tokens each" in shown  # the drafts' credit, as the chart's
    assert f"(plain decoding: {plain.step_ms:.0f} ms)" in shown  # why fewer steps need not be faster


def test_the_handler_needs_a_question_and_a_quiet_page_and_ends_with_the_panel():
    free = contextlib.nullcontext
    assert list(sbs.compare_methods(tiny_session([]), lambda: 0, free, "")) == [{"status": sbs.NEED_QUESTION}]
    assert list(sbs.compare_methods(tiny_session(), lambda: 3, free, "")) == [{"status": sbs.BUSY_NOW}]
    views = list(sbs.compare_methods(tiny_session(), lambda: 0, free, "Test CPU"))
    assert all("run " in v["status"] for v in views[:-1]) and len(views) == 1 + 2 * len(sbs.METHODS)
    assert 'class="tr-sides"' in views[-1]["sides"] and "side by side" in views[-1]["status"]


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
    assert "a forward of up to 81 tokens (its drafts and the last token), took 3.5 plain steps on average" in foot  # 233 ms / 67 ms, as the cards show them
    assert "about 2×" in foot
    results[sbs.PAPER] = run(sbs.PAPER, 18, 1.4, 81)  # faster than plain decoding: nothing to explain
    assert "Why the paper's tree is slower" not in unglossed(sbs.side_by_side_html(results, "a GPU", exact=False))
