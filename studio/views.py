"""What the page shows, built from plain data (a session, a trace, a speed estimate): no Gradio here.

A view is a dict keyed by the names in `KEYS`; the page maps each name to its component. Handlers return
views, so they can be tested without building the page.
"""
from __future__ import annotations

import html
from typing import Any, Callable

from tr_core.events import StepEvent
from tr_core.figures import (MatrixTracker, MeterView, accepted_chart, coloured_markdown, heatmap_figure, meter_html,
                             safe_markdown, tree_figure)
from tr_core.speed import SpeedEstimate
from tr_core.story import matrix_before, step_story
from tr_core.trace import Trace, boundaries_from_texts

# Every output a handler may set, in the order of the endpoints' outputs (the API's documented order: new names
# go at the end). "replay_html" (the HTML replay's download) is an output of its own endpoint only.
KEYS = ("chat", "msg", "status", "meter", "tree", "heat", "chart", "matrix", "replay", "trace_file", "matrix_file",
        "model", "story")
STORY_PLACEHOLDER = "What each step drafted, accepted and recycled is told here, step by step."


def message(role: str, text: str) -> dict[str, str]:
    """A chat message whose text is shown as text (escaped), never as live HTML."""
    return {"role": role, "content": safe_markdown(text)}


def coloured_answer(trace: Trace, upto: int | None = None, colour: bool = True) -> str:
    """The answer's markdown with alternating colours per step (up to a step, for replay); always escaped."""
    texts = trace.step_texts if upto is None else trace.step_texts[: upto + 1]
    text = "".join(texts)
    return coloured_markdown(text, boundaries_from_texts(texts)) if colour else safe_markdown(text)


def story_html(text: str = STORY_PLACEHOLDER) -> str:
    """The step story (plain text, which may quote tokens from a model or a trace) as escaped HTML."""
    head = '<span class="tr-story-head">This step:</span> ' if text != STORY_PLACEHOLDER else ""
    return f'<div class="tr-story">{head}{html.escape(text)}</div>'


def step_story_view(ev: StepEvent, token_text: Callable[[int], str], before: dict[int, list[int]] | None) -> str:
    """The story of one step for the page (see tr_core.story.step_story)."""
    return story_html(step_story(ev, token_text, before))


def step_views(trace: Trace, step: int) -> dict[str, Any]:
    """Tree, heatmap, chart and story of one recorded step (0-based), from the trace alone."""
    step = max(0, min(step, len(trace.steps) - 1))
    tracker = MatrixTracker()
    for ev in trace.steps[:step]:
        tracker.update(ev)
    ev = trace.steps[step]
    before = matrix_before(tracker, ev)
    tracker.update(ev)
    return {"tree": tree_figure(ev, trace.token_text), "heat": heatmap_figure(tracker, ev, trace.token_text),
            "chart": accepted_chart(trace.steps, current=step),
            "story": step_story_view(ev, trace.token_text, before)}


def best_step(trace: Trace) -> int:
    """The step to show first: the one that emitted the most tokens (the latest of ties)."""
    return max(range(len(trace.steps)), key=lambda i: (len(trace.steps[i].emitted), i))


def live_meter(trace: Trace) -> str:
    """The meter while an answer streams: Token Recycling's own speed, no ratio yet."""
    ms = sum(e.timings.get("total", 0.0) for e in trace.steps)
    n = sum(len(e.emitted) for e in trace.steps)
    return meter_html(MeterView(state="live", tr_tps=n / ms * 1000 if ms else None,
                                mean_accepted=n / max(len(trace.steps), 1), note="engine-timed, UI excluded"))


def measured_meter(est: SpeedEstimate, done: bool = True, note: str = "") -> str:
    """The meter from an interleaved measurement: a ratio ± error, or 'too noisy to measure' and why."""
    if not done:
        return meter_html(MeterView(state="measuring", tr_tps=est.tr_tps, plain_tps=est.plain_tps,
                                    mean_accepted=est.mean_accepted, identical=est.identical,
                                    note=f"timing both methods in turns over the same tokens… {est.tokens} so far"))
    state = "measured" if est.trusted else "noisy"
    why = (f"over {est.tokens} tokens, both methods timed in {est.pairs} alternating chunks" if est.trusted
           else est.reason)
    return meter_html(MeterView(state=state, tr_tps=est.tr_tps, plain_tps=est.plain_tps,
                                mean_accepted=est.mean_accepted, ratio=est.ratio if est.trusted else None,
                                error=est.error, identical=est.identical, note="; ".join(x for x in (why, note) if x)))


MEASURE_HINT = "turn on “Measure the speedup” in the decoding settings to measure it"


def trace_meter(trace: Trace, note: str = MEASURE_HINT, loaded: bool = False) -> str:
    """The meter of a finished or loaded trace: its recorded measurement, else its own speed only."""
    if trace.speed is not None:
        return measured_meter(SpeedEstimate(**trace.speed), note="recorded with the trace" if loaded else "")
    s = trace.summary
    if loaded:
        note = "no speed measurement is recorded in this trace"
    if trace.plain is not None:  # an older trace, timed one method after the other: its ratio is not trusted
        note = "this trace was timed one method after the other (older studio): no ratio is shown"
    return meter_html(MeterView(state="off", tr_tps=s.tokens_per_s if s else None,
                                mean_accepted=s.mean_accepted if s else None, identical=trace.identical, note=note))


def matrix_info(engine: Any, k: int) -> str:
    """One line about the session's whole matrix: rows filled, size."""
    if engine is None:
        return "**Adjacency matrix**: not created yet (the first message creates it)."
    m = engine.matrix
    return (f"**Adjacency matrix** · {m.rows_filled:,} / {m.vocab_size:,} rows filled · k = {k} · "
            f"{m.size_mb:.1f} MB · persists over this conversation")


def replay_slider(trace: Trace, value: int) -> dict[str, Any]:
    """The replay slider's settings for a trace (1-based steps)."""
    n = len(trace.steps)
    return {"minimum": 1, "maximum": max(n, 2), "value": value, "label": f"Replay step (1–{n})"}
