"""What the page shows, built from plain data (a session, a trace, a speed estimate): no Gradio here.

A view is a dict keyed by the names in `KEYS`; the page maps each name to its component. Handlers return
views, so they can be tested without building the page.
"""
from __future__ import annotations

import dataclasses
import html
import json
from typing import Any, Callable

from tr_core.events import StepEvent
from present.chart import accepted_chart_explained
from present.chat import coloured_markdown, marked_markdown, safe_markdown
from present.glossary import gloss
from present.heatmap import MatrixTracker, heatmap_figure
from present.meter import MeterView, figures_of, meter_html
from present.tree import tree_figure
from present.microscope import microscope_view
from present.race import NoRace, race_timeline
from present.story import ended_by, step_story
from present.tour import matrix_kept, telling_step
from tr_core.trace import Trace, boundaries_from_texts

# the cost panel is its own module; tests/test_speed.py also names these from here
from .cost_panel import (CostCurve, _disagreement, cost_html, cost_text, divisor_text,  # noqa: F401
                         expected_speedup, meter_curve, step_sizes)
from .meter import SpeedEstimate

# Every output a handler may set, in the order of the endpoints' outputs (the API's documented order: new names
# go at the end). "replay_html" (the HTML replay's download) is an output of its own endpoint only.
KEYS = ("chat", "msg", "status", "meter", "tree", "heat", "chart", "matrix", "replay", "trace_file", "matrix_file",
        "model", "story", "cost", "race", "decoding", "microscope", "warm")
STORY_PLACEHOLDER = "What each step drafted, accepted and recycled is told here, step by step."
RENDER_EVERY_S = 0.25  # redraw figures at most this often while an answer streams or is measured


def message(role: str, text: str) -> dict[str, str]:
    """A chat message whose text is shown as text (escaped), never as live HTML."""
    return {"role": role, "content": safe_markdown(text)}


def coloured_answer(trace: Trace, upto: int | None = None, colour: bool = True, mark: int | None = None) -> str:
    """The answer's markdown with alternating colours per step (up to a step, for replay); always escaped.

    mark: a step whose run is also outlined (the step the replay shows), with or without the colours.
    """
    texts = trace.step_texts if upto is None else trace.step_texts[: upto + 1]
    text = "".join(texts)
    if mark is not None:
        return marked_markdown(text, boundaries_from_texts(texts), mark, colour=colour)
    return coloured_markdown(text, boundaries_from_texts(texts)) if colour else safe_markdown(text)


def marked_chat(display: list[dict[str, str]], trace: Trace, step: int, colour: bool,
                upto: int | None = None) -> list[dict[str, str]]:
    """The chat as shown, its last answer redrawn (up to step `upto`, for replay) with step `step`'s run outlined."""
    chat = list(display)
    if chat and chat[-1]["role"] == "assistant":
        chat[-1] = {"role": "assistant", "content": coloured_answer(trace, upto=upto, colour=colour, mark=step)}
    return chat


def story_html(text: str = STORY_PLACEHOLDER, brief: str | None = None) -> str:
    """The step story (plain text, which may quote tokens from a model or a trace) as escaped HTML; with `brief`,
    also its brief version, which the presentation view shows instead (assets/studio.css)."""
    head = '<span class="tr-story-head">This step:</span> ' if text != STORY_PLACEHOLDER else ""
    if brief is None:
        return f'<div class="tr-story">{head}{gloss(text)}</div>'
    return (f'<div class="tr-story"><div class="tr-story-full">{head}{gloss(text)}</div>'
            f'<div class="tr-story-brief">{head}{gloss(brief)}</div></div>')


def step_story_view(ev: StepEvent, token_text: Callable[[int], str], before: dict[int, list[int]] | None,
                    ended: str | None = None) -> str:
    """The story of one step for the page, full and brief (see present.story.step_story; `ended`: why the
    answer ended, for its last step)."""
    return story_html(step_story(ev, token_text, before, ended=ended),
                      step_story(ev, token_text, before, brief=True, ended=ended))


def step_views(trace: Trace, step: int, cost: CostCurve | None = None) -> dict[str, Any]:
    """Tree, heatmap, chart, story, microscope, cost panel and decoding mode of one recorded step (0-based), from the
    trace (and a cost curve)."""
    step = max(0, min(step, len(trace.steps) - 1))
    tracker = MatrixTracker()
    for ev in trace.steps[:step]:
        tracker.update(ev)
    ev = trace.steps[step]
    before = tracker.update(ev)
    return {"tree": tree_figure(ev, trace.token_text), "heat": heatmap_figure(tracker, ev, trace.token_text),
            "chart": accepted_chart_explained(trace.steps, current=step),
            "story": step_story_view(ev, trace.token_text, before, ended_by(trace, step)),
            "cost": cost_html(ev, cost, trace),
            "microscope": microscope_html(trace, step), "decoding": decoding_html(trace.settings)}


def microscope_html(trace: Trace | None, step: int) -> str:
    """One step under the microscope (present.microscope: rows read, tree built, verdict, rows written back)."""
    if trace is None or not trace.steps:
        return f'<div class="tr-microscope tr-microscope-none">{html.escape(MICROSCOPE_PLACEHOLDER)}</div>'
    return f'<div class="tr-microscope">{microscope_view(trace, step)}</div>'  # escaped HTML of its own


MICROSCOPE_PLACEHOLDER = ("One step under the microscope: the matrix rows it read, the tree built from them, the "
                          "model's verdict and the rows written back, before and after.")


def decoding_text(settings: dict[str, Any] | None) -> str:
    """'Greedy decoding: …' or 'Sampling: temperature T, seed S', from an answer's recorded settings (one line: the
    presentation view has one line for it; the page's explanations say that a seed gives plain decoding's answer)."""
    s = settings or {}
    try:
        temperature = float(s.get("temperature") or 0.0)
    except (TypeError, ValueError):
        return "Decoding mode: not recorded"
    if temperature <= 0:
        return greedy_text(s.get("dtype"), s.get("exact"))
    extra = "".join(f", {name} {str(s[key])[:12]}" for key, name in (("top_p", "top-p"), ("top_k", "top-k"))
                    if s.get(key) not in (None, 0, 1, 1.0))  # from a trace file: any value, shown short and escaped
    return f"Sampling: temperature {temperature:g}{extra}, seed {str(s.get('seed', 0))[:12]}"


def greedy_text(dtype: Any, exact: Any) -> str:
    """The greedy line (one line of the presentation view): the setting, never the outcome (the meter's flag says
    whether the tokens matched); `precision_note` says what the dtype and mode promise, on hover."""
    mode = ", exact mode" if exact is True else ""
    return f"Greedy decoding (the model's top token every step{mode})"


def precision_note(settings: dict[str, Any] | None) -> str:
    """The dtype and mode an answer was computed in, and what that promises (the decoding line's hover text)."""
    s = settings or {}
    dtype, exact = str(s.get("dtype") or "")[:12], s.get("exact")
    if exact is True:
        return f"{dtype}, exact mode: every row of a tree forward rounds as a one-token forward, bit for bit"
    if exact is False:
        return (f"{dtype} without exact mode: a tree forward rounds a little differently from a one-token forward, "
                "so at a near tie the best token can flip")
    return ""


def decoding_html(settings: dict[str, Any] | None) -> str:
    """The decoding mode line shown under the answer."""
    title = precision_note(settings)
    title = f' title="{html.escape(title)}"' if title else ""
    return f'<div class="tr-decoding"{title}>{html.escape(decoding_text(settings))}</div>'


# ------------------------------------------------------------------------------------------------ race

RACE_WAIT = "the speedup is still being measured; the race is ready once the meter shows its figure"


def race_html(trace: Trace | None, wait: str = "") -> str:
    """The race panel (hidden until the Race button opens it): the timeline as data for the page's animation, or
    why there is no race. `wait`: a reason to show instead (e.g. while the meter measures). All text escaped."""
    reason = wait
    if not reason:
        try:
            timeline = race_timeline(trace)
        except NoRace as exc:
            reason = str(exc)
    if reason:
        return (f'<div class="tr-race tr-race-none"><div class="tr-race-msg">No race for this answer: '
                f'{html.escape(reason)}.</div></div>')
    data = html.escape(json.dumps(timeline.to_dict(), ensure_ascii=False, separators=(",", ":")), quote=True)
    lanes = "".join(
        f'<div class="tr-lane tr-lane-{key}"><div class="tr-lane-head"><span class="tr-lane-name">{name}</span>'
        f'<span class="tr-race-count" id="tr-race-{key}-count">{html.escape(side.labels[0])}</span></div>'
        f'<div class="tr-lane-text" id="tr-race-{key}"></div></div>'
        for key, name, side in (("tr", "♻ Token Recycling", timeline.tr), ("plain", "Plain decoding", timeline.plain)))
    return (f'<div class="tr-race" data-timeline="{data}"><div class="tr-race-top">'
            '<span class="tr-race-title">⚑ Race: the same answer, each side at its recorded pace</span>'
            '<span class="tr-race-clock" id="tr-race-clock">0.0 s</span>'
            '<button type="button" class="tr-race-close" title="close the race">✕</button></div>'
            f'<div class="tr-race-lanes">{lanes}</div>'
            f'<div class="tr-race-caption" id="tr-race-caption">{html.escape(timeline.caption)}</div></div>')


def best_step(trace: Trace) -> int:
    """The step to show first, and to tour (present.tour.telling_step): where the most drafts read from the matrix
    were accepted (the paper's method at work), then the most tokens."""
    return telling_step(trace)


def done_status(notes: list[str], trace: Trace) -> str:
    """The status after an answer: its notes, else done, and which step the page shows (best_step): a reader who
    counts the answer's steps (tokens / tokens per step) then knows why the tree shows another than the last."""
    if notes:
        return "  \n".join(notes)
    if not trace.steps:
        return "✓ Done."
    best = best_step(trace)
    gained, matrix = len(trace.steps[best].emitted), matrix_kept(trace.steps[best])
    why = (f"the one with the most drafts from the matrix alone accepted ({matrix}; {gained} tokens)" if matrix else
           f"the one that gained the most tokens ({gained})")
    return f"✓ Done. Showing step {best + 1} of {len(trace.steps)}, {why}.{answer_end(trace)}"


def answer_end(trace: Trace) -> str:
    """Why the answer ends where it does, when the chat alone does not show it: the token limit cut it mid-sentence,
    or its last step gave only the end-of-turn token, which the chat does not show (a reader who counts the runs in
    the chat then finds one step fewer than the status says)."""
    s = trace.summary
    if s is None:
        return ""
    if s.stop_reason == "length":
        return f" It stopped at its {s.new_tokens}-token limit (Max new tokens)."
    texts = trace.step_texts
    if s.stop_reason == "eos" and len(texts) == len(trace.steps) > 1 and not texts[-1].strip():
        return f" Step {len(trace.steps)} gave only the end-of-turn token, which the chat does not show."
    return ""


def live_meter(trace: Trace, measured_after: bool = True) -> str:
    """The meter while an answer streams: Token Recycling's own speed, no ratio yet (`measured_after`: the speedup
    is measured once the answer ends)."""
    ms = sum(e.timings.get("total", 0.0) for e in trace.steps)
    n = sum(len(e.emitted) for e in trace.steps)
    return meter_html(MeterView(state="live" if measured_after else "live-off", tr_tps=n / ms * 1000 if ms else None,
                                mean_accepted=n / max(len(trace.steps), 1), note="engine-timed, UI excluded",
                                **figures_of(trace)))



def coverage_note(covered: int, total: int, why: str = "") -> str:
    """How far a measurement got through an answer ("measured over the first 30 of 128 tokens (time cap)")."""
    return f"measured over the first {covered} of {total} tokens" + (f" ({why})" if why else "")


def left_out_note(left_out: int) -> str:
    """The pairs of short turns a measurement left out as disturbed, in words ("" for none)."""
    if left_out <= 0:
        return ""
    pairs = ("1 pair", "its") if left_out == 1 else (f"{left_out} pairs", "their")  # of short turns (said before)
    return f"{pairs[0]} left out: the load changed between {pairs[1]} two turns"


def measured_span(est: SpeedEstimate, answer_tokens: int | None) -> str:
    """What a trusted measurement covers, in words that agree with the answer's length: "the whole answer" only when
    both methods decoded all of it (else the measure note says how far they got), and how many tokens the figure is
    over when disturbed pairs of turns were left out."""
    if answer_tokens is None or est.covered < answer_tokens:
        return "this answer"
    if est.passes > 1:
        return f"the whole answer ({est.covered} tokens), decoded {est.passes} times"
    if est.tokens < est.covered:
        return f"the whole answer ({est.covered} tokens), the figure over the {est.tokens} kept"
    return f"the whole answer ({est.tokens} tokens)"


def measured_meter(est: SpeedEstimate, done: bool = True, note: str = "", answer_mean: float | None = None,
                   answer_tokens: int | None = None, trace: Any = None) -> str:
    """The meter from an interleaved measurement: a ratio ± error, or 'too noisy to measure' and why.

    `answer_mean`: the answer's own mean accepted tokens per step, shown instead of the measured chunks' (which
    cover only part of the answer when the measurement was cut), so that it agrees with the chart beside it.
    `answer_tokens`: the answer's length (None: unknown), for what the figure covers (`measured_span`).
    `trace`: the answer measured, for whose figures they are (figures_of: machine, drafting, model)."""
    if answer_mean is not None:
        est = dataclasses.replace(est, mean_accepted=answer_mean)
    if not done:
        return meter_html(MeterView(state="measuring", tr_tps=est.tr_tps, plain_tps=est.plain_tps,
                                    mean_accepted=est.mean_accepted, identical=est.identical, exact=est.exact,
                                    parted=est.parted, **figures_of(trace),
                                    note=f"timing both methods in turns over the same tokens… {est.covered} so far"
                                    + (f" (pass {est.passes})" if est.passes > 1 else "")))
    state = "measured" if est.trusted else "noisy"
    why = est.reason
    if est.trusted:
        timed = est.pairs + est.left_out  # the pairs left out as disturbed were timed too: "12 of them kept"
        pairs = f"{timed} short turn{'s' if timed != 1 else ''} each"  # a pair: one turn of each method
        pairs += f", {est.pairs} of them kept" if est.left_out else ""
        why = (f"{measured_span(est, answer_tokens)}, both methods timed in {pairs}"
               + ("; ±: one standard error" if est.error is not None else ""))
    # too noisy: plain decoding's tokens/s is left out too, since beside Token Recycling's it would imply the ratio
    return meter_html(MeterView(state=state, tr_tps=est.tr_tps, plain_tps=est.plain_tps if est.trusted else None,
                                mean_accepted=est.mean_accepted, ratio=est.ratio if est.trusted else None,
                                error=est.error, identical=est.identical, exact=est.exact, parted=est.parted,
                                **figures_of(trace), note="; ".join(x for x in (why, note) if x)))


MEASURE_HINT = "turn on “Measure the speedup” in the decoding settings to measure it"
STOPPED_HINT = "the answer was stopped before its end, so the speedup was not measured"
SEND_TO_MEASURE = "Send a message to measure."


def blank_views() -> dict[str, Any]:
    """What the answer's panels show before any answer, and again after New chat."""
    return {"meter": meter_html(MeterView(note=SEND_TO_MEASURE)), "tree": tree_figure(None, str),
            "heat": heatmap_figure(MatrixTracker(), None, str), "chart": accepted_chart_explained([]),
            "story": story_html(), "cost": cost_html(None, None), "race": race_html(None),
            "microscope": microscope_html(None, 0), "decoding": "",
            "replay": {"minimum": 1, "maximum": 2, "value": 1, "label": "Replay step"}, "trace_file": None}


def trace_meter(trace: Trace, note: str = MEASURE_HINT, loaded: bool = False) -> str:
    """The meter of a finished or loaded trace: its recorded measurement, else its own speed only."""
    if trace.speed is not None:
        est, total = SpeedEstimate(**trace.speed), trace.summary.new_tokens if trace.summary else None
        notes = ["recorded with the trace"] if loaded else []
        if total is not None and est.covered < total:
            notes.append(coverage_note(est.covered, total))
        notes.append(left_out_note(est.left_out))
        return measured_meter(est, note="; ".join(n for n in notes if n), answer_tokens=total,
                              answer_mean=trace.summary.mean_accepted if trace.summary else None,
                              trace=trace)
    s = trace.summary
    if loaded:
        note = "no speed measurement is recorded in this trace"
    if trace.plain is not None:  # an older trace, timed one method after the other: its ratio is not trusted
        note = "this trace was timed one method after the other (older studio): no ratio is shown"
    figures = figures_of(trace)
    if s is None:
        figures["machine"] = None  # no figures: no line saying where they were timed
    return meter_html(MeterView(state="off", tr_tps=s.tokens_per_s if s else None,
                                mean_accepted=s.mean_accepted if s else None, identical=trace.identical, note=note,
                                **figures))


def matrix_info(engine: Any, k: int) -> str:
    """One line about the session's whole matrix: rows filled (how many this conversation wrote, when others were
    learned beforehand: a reader met every row filled after one short answer), size."""
    if engine is None:
        return "**Adjacency matrix**: not created yet (the first message creates it)."
    m = engine.matrix
    filled, written = m.rows_filled, int((m.stamps >= 0).sum())  # a row loaded or learned beforehand: stamp -1
    whose = "" if filled <= written else " (all learned beforehand)" if not written else \
        f" ({written:,} written by this conversation, the rest learned beforehand)"
    return (f"**Adjacency matrix** · {filled:,} / {m.vocab_size:,} rows filled{whose} · k = {k} · "
            f"{m.size_mb:.1f} MB · persists over this conversation")


def replay_slider(trace: Trace, value: int) -> dict[str, Any]:
    """The replay slider's settings for a trace (1-based steps)."""
    n = len(trace.steps)
    return {"minimum": 1, "maximum": max(n, 2), "value": value, "label": f"Replay step (1–{n})"}
