"""What the page shows, built from plain data (a session, a trace, a speed estimate): no Gradio here.

A view is a dict keyed by the names in `KEYS`; the page maps each name to its component. Handlers return
views, so they can be tested without building the page.
"""
from __future__ import annotations

import dataclasses
import html
import json
from dataclasses import dataclass
from typing import Any, Callable

from tr_core.cost import interpolate
from tr_core.events import StepEvent
from present.figures import (MatrixTracker, MeterView, accepted_chart_explained, coloured_markdown,
                                    heatmap_figure, marked_markdown, meter_html, ratio_class, safe_markdown,
                                    tree_figure)
from present.microscope import microscope_view
from present.race import NoRace, race_timeline
from tr_core.bench.meter import SpeedEstimate
from present.story import ended_by, step_story
from tr_core.trace import Trace, boundaries_from_texts

# Every output a handler may set, in the order of the endpoints' outputs (the API's documented order: new names
# go at the end). "replay_html" (the HTML replay's download) is an output of its own endpoint only.
KEYS = ("chat", "msg", "status", "meter", "tree", "heat", "chart", "matrix", "replay", "trace_file", "matrix_file",
        "model", "story", "cost", "race", "decoding", "microscope", "warm")
STORY_PLACEHOLDER = "What each step drafted, accepted and recycled is told here, step by step."


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
        return f'<div class="tr-story">{head}{html.escape(text)}</div>'
    return (f'<div class="tr-story"><div class="tr-story-full">{head}{html.escape(text)}</div>'
            f'<div class="tr-story-brief">{head}{html.escape(brief)}</div></div>')


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
        return "Greedy decoding: token for token what plain decoding gives"
    extra = "".join(f", {name} {str(s[key])[:12]}" for key, name in (("top_p", "top-p"), ("top_k", "top-k"))
                    if s.get(key) not in (None, 0, 1, 1.0))  # from a trace file: any value, shown short and escaped
    return f"Sampling: temperature {temperature:g}{extra}, seed {str(s.get('seed', 0))[:12]}"


def decoding_html(settings: dict[str, Any] | None) -> str:
    """The decoding mode line shown under the answer."""
    return f'<div class="tr-decoding">{html.escape(decoding_text(settings))}</div>'


# ------------------------------------------------------------------------------------------ cost panel
# One speed story: the meter's interleaved measurement (tr_core.bench.meter) is the only measured speedup on the page.
# Once it has measured an answer, the cost panel's step costs are the meter's own timings (Token Recycling's steps of
# each size against plain decoding's steps, over the same tokens: `meter_curve`), so the formula with them gives the
# meter's figure. Before that, or without a measurement, they are estimates from this machine's cost curve, labelled
# as such, and withheld when the curve was measured on a busy machine or when the meter found the timings too noisy
# (nothing may then imply a speedup).

COST_PLACEHOLDER = ("What the shown step's forward cost on this machine, against what it gained, is worked out here: "
                    "speedup ≈ tokens gained per step ÷ the cost of the step's forward.")
FORMULA = ("Speedup ≈ tokens per step (accepted drafts + the bonus) ÷ t(N)/t(1), where t(N)/t(1) is what a step "
           "verifying N tokens (the last token and its drafts) costs against a plain decoding step")
NOISY_WITHHELD = "the meter found this answer's timings too noisy, so no speed is claimed here either"
ONE_FORWARD, PLAIN_STEP = "a one-token forward", "a plain decoding step"


@dataclass(frozen=True)
class CostCurve:
    """What a step verifying n tokens costs on this machine relative to one token, or why there is no such figure."""

    relative: Callable[[int], float] | None  # n -> t(n) / t(1); None: not measured
    why: str = ""  # why it could not be measured (when `relative` is None)
    source: str = ""  # what measured it, in words
    steady: bool = True  # False: timed while the machine was busy (ForwardCost.steady): its figures are not shown
    note: str = ""  # how steady the timing was, in words (e.g. "repeats spread ±35%"), shown with an unsteady curve
    unit: str = ONE_FORWARD  # what t(1) is: the curve's own one-token forward, or the meter's plain decoding step
    ms: Callable[[int], float] | None = None  # n -> ms of the curve this came from (the meter's shape; None: unknown)

    @property
    def metered(self) -> bool:
        """True when the costs are the meter's timings (in plain decoding steps), not the cost curve's estimate."""
        return self.unit == PLAIN_STEP

    def cost(self, n: int) -> float:
        """t(n)/t(1). An estimate is never below 1: a forward of n tokens costs at least a one-token forward (timing
        noise aside). The meter's timings are shown as measured: its Token Recycling steps can run faster than its
        plain steps did, and a floor would break the formula's agreement with its figure."""
        if self.relative is None:
            return 1.0
        return self.relative(n) if self.metered else max(self.relative(n), 1.0)


def meter_curve(speed: dict | None, shape: Callable[[int], float] | None = None) -> CostCurve | None:
    """Step costs in plain decoding steps from the meter's trusted measurement (None without one): the ms of
    Token Recycling's steps of each size it timed (`step_ms`) over plain decoding's ms per token, both from the same
    chunk pairs. A size it timed costs what it timed; `shape` (n -> ms, this machine's cost curve; None when unknown
    or timed on a busy machine) gives the others, scaled so that the meter's own steps would cost what it timed.
    Without it the meter's sizes are interpolated. Either way the formula over the meter's steps gives its ratio."""
    if speed_state(speed) != "measured" or not speed.get("step_ms") or not speed.get("plain_tps"):
        return None
    plain_ms = 1000.0 / float(speed["plain_tps"])
    timed = [(int(n), float(ms), int(k)) for n, ms, k in speed["step_ms"]]
    points = {n: ms for n, ms, _ in timed}
    total = sum(ms * k for _, ms, k in timed)
    if shape is not None:  # a size the meter timed: its own mean; another: the curve, scaled to the meter's steps
        scale = total / max(sum(shape(n) * k for n, _, k in timed), 1e-9)
        relative = lambda n: (points[n] if n in points else shape(n) * scale) / plain_ms  # noqa: E731
        between = ", other sizes by this machine's cost curve"
    else:
        relative, between = (lambda n: interpolate(points, n) / plain_ms), ""
    sizes = sum(k for *_, k in timed)
    return CostCurve(relative, unit=PLAIN_STEP,
                     source=f"the meter: {sizes} Token Recycling steps against plain decoding at "
                            f"{float(speed['plain_tps']):.1f} tok/s, over the same tokens{between}")


def _tokens(n: int) -> str:
    return f"{n} token{'' if n == 1 else 's'}"


def speed_state(speed: dict | None) -> str:
    """What the meter says of an answer: 'measured' (a trusted ratio), 'noisy' (too noisy to measure), '' (nothing)."""
    if not speed:
        return ""
    return "measured" if speed.get("trusted") and speed.get("ratio") else "noisy"


def _usable(curve: CostCurve | None) -> bool:
    return curve is not None and curve.relative is not None and curve.steady


def _unusable_why(curve: CostCurve | None) -> str:
    """Why the curve's figures are not shown (for a missing or unsteady curve)."""
    if curve is None:
        return "no cost curve is known here"
    if curve.relative is None:
        return curve.why
    note = f" ({curve.note})" if curve.note else ""
    return f"this machine's cost curve was measured while the machine was busy{note}: not shown"


def no_draft_text(ev: StepEvent) -> str:
    """Why a step drafted nothing, in plain words (StepEvent.no_draft_reason, absent from older traces)."""
    reason = getattr(ev, "no_draft_reason", None)
    return f"This step drafted nothing: {reason.rstrip('.')}." if reason else "This step drafted nothing."


def cost_text(ev: StepEvent, curve: CostCurve | None, speed: dict | None = None) -> tuple[str, str]:
    """(what the step cost against what it gained, its colour class up/par/down/none); see the section's comment."""
    n, gained = len(ev.tokens), len(ev.emitted)
    if n <= 1:
        return (f"{no_draft_text(ev)} One one-token forward gained {_tokens(gained)}: plain decoding's own pace.",
                "par")
    head = f"This step verified {n} tokens in one forward (the last token and {n - 1} drafted) and gained {_tokens(gained)}."
    if not _usable(curve):
        return f"{head} What a {n}-token forward costs against a one-token forward is not shown: {_unusable_why(curve)}.", "none"
    if speed_state(speed) == "noisy":
        return f"{head} No estimate of its speed: {NOISY_WITHHELD}.", "none"
    c = round(curve.cost(n), 2)  # the shown figure, so that the division on screen is exact to its last digit
    speed_x = gained / c
    if curve.metered:
        cost = (f"a step of that size cost {c:.2f}× a plain decoding step, as the meter timed this answer")
        tail = "This step alone; the meter's figure is for the whole answer."
    else:
        cost = f"on this machine that costs {c:.2f}× {curve.unit}"
        tail = "An estimate for this step alone, from the cost curve; the measured figure is the meter's, for the whole answer."
    return (f"This step verified {n} tokens in one forward (the last token and {n - 1} drafted): {cost}. It gained "
            f"{_tokens(gained)}, so this step ran at {gained} ÷ {c:.2f} = {speed_x:.2f}× plain speed. {tail}",
            ratio_class(speed_x))


def expected_speedup(steps: list[StepEvent], curve: CostCurve) -> tuple[float, float, float]:
    """(mean accepted tokens per step A, mean t(N)/t(1) of the steps' forwards C, A / C) over recorded steps."""
    tokens = sum(len(e.emitted) for e in steps)
    cost = sum(curve.cost(len(e.tokens)) for e in steps)
    a, c = tokens / max(len(steps), 1), cost / max(len(steps), 1)
    return a, c, a / max(c, 1e-9)


def shown_quotient(a: float, c: float) -> float:
    """a ÷ c as the page writes it: from the two figures rounded as shown, so that a reader's division agrees."""
    return round(a, 2) / max(round(c, 2), 1e-9)


def formula_text(steps: list[StepEvent], curve: CostCurve | None, speed: dict | None) -> str:
    """The expected-speedup formula with this answer's and this machine's numbers, and what the meter measured."""
    if not steps:
        return FORMULA + "."
    a = sum(len(e.emitted) for e in steps) / len(steps)
    if speed_state(speed) == "noisy":
        return f"{FORMULA}. This answer: {a:.2f} tokens per step; {NOISY_WITHHELD}."
    if not _usable(curve):
        return f"{FORMULA}. This answer: {a:.2f} tokens per step; t(N)/t(1) is not shown: {_unusable_why(curve)}."
    a, c, _ = expected_speedup(steps, curve)
    e = shown_quotient(a, c)
    if curve.metered and speed_state(speed) == "measured":
        return f"{FORMULA}. " + metered_formula(a, c, e, speed, curve.source, len(steps)) + step_sizes(steps)
    text = (f"{FORMULA}. This answer: {a:.2f} ÷ {c:.2f} ≈ {e:.2f}× expected (estimate; t timed by "
            f"{curve.source or 'this machine'}).") + step_sizes(steps)
    if speed_state(speed) == "measured":
        err = f" ± {speed['error']:.2f}" if speed.get("error") is not None else ""
        text += f" Measured by the meter: {speed['ratio']:.2f}×{err}." + _disagreement(e, speed)
    return text


def step_sizes(steps: list[StepEvent]) -> str:
    """How many tokens the answer's steps verified: t(N)/t(1) in the formula is their mean cost, so a large step
    costs more than it (a reader set one step's "2.55×" against the formula's 1.43× and could not reconcile them)."""
    sizes = [len(e.tokens) for e in steps]
    lo, hi = min(sizes), max(sizes)
    spread = f", from {lo} to {hi}" if lo != hi else ""
    plain = sum(1 for n in sizes if n == 1)
    alone = (f" {plain} of them drafted nothing and verified the last token alone (each such step's story says why)."
             if plain and len(sizes) > plain else "")
    return (f" Its {len(steps)} steps verified {sum(sizes) / len(sizes):.1f} tokens each on average{spread}: "
            "the divisor in the formula is their mean t(N)/t(1), so one step's own cost can be far from it." + alone)


def divisor_text(a: float, ratio: float) -> str:
    """a / ratio written with as many decimals (2 to 4) as it takes for a reader's division of the two figures shown
    to give the ratio shown (2.0645 / 1.71: "2.06 ÷ 1.21" reads 1.70, "2.06 ÷ 1.205" reads 1.71). It divides the
    figure shown, round(a, 2), which differs from a by less than the last decimal shown of either."""
    c = round(a, 2) / ratio
    for decimals in (2, 3, 4):
        if round(round(a, 2) / max(round(c, decimals), 1e-9), 2) == round(ratio, 2):
            return f"{c:.{decimals}f}"
    return f"{c:.2f}"


def metered_formula(a: float, c: float, e: float, speed: dict, source: str, answer_steps: int) -> str:
    """The formula with the meter's timings: over the meter's own steps it gives the meter's figure exactly; over the
    answer's steps too when they are the same steps, else both are shown and why they differ is said."""
    m, ratio = float(speed.get("mean_accepted") or 0.0), float(speed["ratio"])
    err = f" ± {speed['error']:.2f}" if speed.get("error") is not None else ""
    meter = f"{m:.2f} ÷ {divisor_text(m, ratio)} = {ratio:.2f}×{err}"
    if (round(a, 2), round(c, 2)) == (round(m, 2), round(m / ratio, 2)):  # the answer's steps are the meter's
        return f"This answer: {meter}, the meter's figure (t timed by {source})."
    covered, answer_tokens = int(speed.get("covered") or 0), round(a * answer_steps)
    why = (f"the meter's time cap ended its re-decode after {covered} of {answer_tokens} tokens"
           if 0 < covered < answer_tokens else
           "the re-decode's trees were not all the answer's")
    return (f"Measured by the meter, re-decoding this answer: {meter} (t timed by {source}). The answer's own steps "
            f"with the same timings: {a:.2f} ÷ {c:.2f} ≈ {e:.2f}× ({why}).")


def _disagreement(expected: float, speed: dict) -> str:
    """A sentence when the curve's estimate and the meter's measurement disagree by more than the meter's error
    (three standard errors, and at least 10%): the page says so, and why, rather than show two speedups silently."""
    ratio, error = speed["ratio"], speed.get("error") or 0.0
    if abs(expected - ratio) <= max(3 * error, 0.10 * ratio):
        return ""
    return (" The two disagree: the estimate takes t(N)/t(1) from the drafter's own timings, the meter times this "
            f"answer's whole steps against plain decoding over the same tokens, so the meter's {ratio:.2f}× is the "
            "figure to trust.")


def cost_brief(ev: StepEvent, curve: CostCurve | None, speed: dict | None = None) -> str:
    """cost_text's figures in one line, for the presentation view (a 720 px projector screen has no room for more)."""
    n, gained = len(ev.tokens), len(ev.emitted)
    if n <= 1:
        return f"Cost: no draft; one one-token forward gained {_tokens(gained)}: plain decoding's pace"
    if not _usable(curve):
        busy = curve is not None and curve.relative is not None
        return (f"Cost: {n} tokens in one forward gained {_tokens(gained)}; that forward's cost "
                + ("was timed on a busy machine: not shown" if busy else "was not measured here"))
    if speed_state(speed) == "noisy":
        return f"Cost: {n} tokens in one forward gained {_tokens(gained)}; no speed claimed: the meter says too noisy"
    c = round(curve.cost(n), 2)  # as cost_text
    unit, kind = ("a plain step's time", "timed by the meter") if curve.metered else ("one token's", "estimate")
    return (f"Cost: {n - 1} drafted + the last token in one forward = {c:.2f}× {unit}; gained {gained} → this step alone ≈ "
            f"{gained} ÷ {c:.2f} = {gained / c:.2f}× plain speed ({kind})")


def cost_html(ev: StepEvent | None, curve: CostCurve | None, trace: Trace | None = None) -> str:
    """The cost panel: t(N)/t(1) on this machine beside the step's gain, so speedup ≈ gained ÷ cost; all escaped.
    `trace`: the answer so far, for the formula with its numbers and the meter's verdict. The panel holds the full
    text and a one-line brief; assets/studio.css shows the brief in the presentation view only."""
    if ev is None:
        return f'<div class="tr-cost tr-cost-none">{html.escape(COST_PLACEHOLDER)}</div>'
    speed = trace.speed if trace is not None else None
    main, cls = cost_text(ev, curve, speed)
    rule = formula_text(trace.steps if trace is not None else [], curve, speed)  # no trace: the bare formula
    return (f'<div class="tr-cost tr-cost-{cls}"><div class="tr-cost-full"><span class="tr-cost-head">'
            f'Cost of this step:</span> {html.escape(main)}<div class="tr-cost-rule">{html.escape(rule)}</div></div>'
            f'<div class="tr-cost-brief">{html.escape(cost_brief(ev, curve, speed))}</div></div>')


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
    """The step to show first: the one that emitted the most tokens (the latest of ties)."""
    return max(range(len(trace.steps)), key=lambda i: (len(trace.steps[i].emitted), i))


def done_status(notes: list[str], trace: Trace) -> str:
    """The status after an answer: its notes, else done, and which step the page shows (best_step): a reader who
    counts the answer's steps (tokens / tokens per step) then knows why the tree shows another than the last."""
    if notes:
        return "  \n".join(notes)
    if not trace.steps:
        return "✓ Done."
    best = best_step(trace)
    gained = len(trace.steps[best].emitted)
    return (f"✓ Done. Showing step {best + 1} of {len(trace.steps)}, the one that gained the most tokens "
            f"({gained}).{answer_end(trace)}")


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
                                mean_accepted=n / max(len(trace.steps), 1), note="engine-timed, UI excluded"))


def coverage_note(covered: int, total: int, why: str = "") -> str:
    """How far a measurement got through an answer ("measured over the first 30 of 128 tokens (time cap)")."""
    return f"measured over the first {covered} of {total} tokens" + (f" ({why})" if why else "")


def left_out_note(left_out: int) -> str:
    """The chunk pairs a measurement left out as disturbed, in words ("" for none)."""
    if left_out <= 0:
        return ""
    pairs = ("1 chunk pair", "its") if left_out == 1 else (f"{left_out} chunk pairs", "their")
    return f"{pairs[0]} left out: the load changed between {pairs[1]} halves"


def measured_span(est: SpeedEstimate, answer_tokens: int | None) -> str:
    """What a trusted measurement covers, in words that agree with the answer's length: "the whole answer" only when
    both methods decoded all of it (else the measure note says how far they got), and how many tokens the figure is
    over when disturbed chunk pairs were left out."""
    if answer_tokens is None or est.covered < answer_tokens:
        return "this answer"
    if est.passes > 1:
        return f"the whole answer ({est.covered} tokens), decoded {est.passes} times"
    if est.tokens < est.covered:
        return f"the whole answer ({est.covered} tokens), the figure over the {est.tokens} kept"
    return f"the whole answer ({est.tokens} tokens)"


def measured_meter(est: SpeedEstimate, done: bool = True, note: str = "", answer_mean: float | None = None,
                   answer_tokens: int | None = None) -> str:
    """The meter from an interleaved measurement: a ratio ± error, or 'too noisy to measure' and why.

    `answer_mean`: the answer's own mean accepted tokens per step, shown instead of the measured chunks' (which
    cover only part of the answer when the measurement was cut), so that it agrees with the chart beside it.
    `answer_tokens`: the answer's length (None: unknown), for what the figure covers (`measured_span`)."""
    if answer_mean is not None:
        est = dataclasses.replace(est, mean_accepted=answer_mean)
    if not done:
        return meter_html(MeterView(state="measuring", tr_tps=est.tr_tps, plain_tps=est.plain_tps,
                                    mean_accepted=est.mean_accepted, identical=est.identical,
                                    note=f"timing both methods in turns over the same tokens… {est.covered} so far"
                                    + (f" (pass {est.passes})" if est.passes > 1 else "")))
    state = "measured" if est.trusted else "noisy"
    why = est.reason
    if est.trusted:
        timed = est.pairs + est.left_out  # the pairs left out as disturbed were timed too: "12 of them kept"
        pairs = "1 alternating chunk pair" if timed == 1 else f"{timed} alternating chunk pairs"
        pairs += f", {est.pairs} of them kept" if est.left_out else ""
        why = (f"{measured_span(est, answer_tokens)}, both methods timed in {pairs}"
               + ("; ±: one standard error" if est.error is not None else ""))
    # too noisy: plain decoding's tokens/s is left out too, since beside Token Recycling's it would imply the ratio
    return meter_html(MeterView(state=state, tr_tps=est.tr_tps, plain_tps=est.plain_tps if est.trusted else None,
                                mean_accepted=est.mean_accepted, ratio=est.ratio if est.trusted else None,
                                error=est.error, identical=est.identical, note="; ".join(x for x in (why, note) if x)))


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
                              answer_mean=trace.summary.mean_accepted if trace.summary else None)
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
