"""The cost panel: what the shown step's forward cost on this machine against what it gained, and the expected-
speedup formula with the answer's numbers.

One speed story: the meter's interleaved measurement (studio/meter.py) is the only measured speedup on the page.
Once it has measured an answer, the cost panel's step costs are the meter's own timings (Token Recycling's steps of
each size against plain decoding's steps, over the same tokens: `meter_curve`), so the formula with them gives the
meter's figure. Before that, or without a measurement, they are estimates from this machine's cost curve, labelled
as such, and withheld when the curve was measured on a busy machine or when the meter found the timings too noisy
(nothing may then imply a speedup).
"""
from __future__ import annotations

from collections import Counter

import html
from dataclasses import dataclass
from typing import Callable

from present.glossary import gloss
from present.meter import machine_of, ratio_class
from present.reasons import no_draft_reason
from present.tour_pictures import UNDER_ONE
from tr_core.cost import interpolate
from tr_core.events import StepEvent
from tr_core.trace import Trace


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
    """Why a step drafted nothing, in plain words (StepEvent.no_draft, absent from older traces)."""
    reason = no_draft_reason(ev)
    return f"This step drafted nothing: {reason.rstrip('.')}." if reason else "This step drafted nothing."


def under_one(c: float) -> str:
    """Why a cost is shown under 1 (a reader expects more tokens to cost more): the meter timed it so."""
    return f" (under 1: {UNDER_ONE})" if c < 1 else ""


def cost_text(ev: StepEvent, curve: CostCurve | None, speed: dict | None = None, machine: str = "") -> tuple[str, str]:
    """(what the step cost against what it gained, its colour class up/par/down/none); see the section's comment.
    `machine`: the one the answer was timed on, named beside the estimate ("": "this machine")."""
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
        cost = (f"a step of that size cost {c:.2f}× a plain decoding step, as the meter timed this answer"
                f"{under_one(c)}")
        tail = "This step alone; the meter's figure is for the whole answer."
    else:
        cost = f"on {machine or 'this machine'} that costs {c:.2f}× {curve.unit}"
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
    alone = (f" {plain} of them drafted nothing and verified the last token alone ({why_alone(steps)})."
             if plain and len(sizes) > plain else "")
    return (f" Its {len(steps)} steps verified {sum(sizes) / len(sizes):.1f} tokens each on average{spread}: "
            "the divisor in the formula is their mean t(N)/t(1), so one step's own cost can be far from it." + alone)


ALONE_WHY = {"first step": "the first, checked by the prompt's own forward",
             "cost": "a tree would not have paid for its forward on this machine",
             "empty row": "the matrix had no candidates after the last token yet"}


def why_alone(steps: list[StepEvent]) -> str:
    """Why the answer's steps that drafted nothing drafted nothing, counted by reason (StepEvent.no_draft): a
    full matrix does not mean every step drafts."""
    reasons = Counter((e.no_draft or {}).get("why", "") for e in steps if len(e.tokens) == 1)
    said = [f"{n}: {ALONE_WHY[why]}" for why, n in reasons.most_common() if why in ALONE_WHY]
    return "; ".join(said) if said else "each such step's story says why"


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
    c = shown_cost(ev, curve, speed)
    unit, kind = ("a plain step's time", "timed by the meter") if curve.metered else ("one token's", "estimate")
    return (f"Cost: {n - 1} drafted + the last token in one forward = {c:.2f}× {unit}; gained {gained} → this step alone ≈ "
            f"{gained} ÷ {c:.2f} = {gained / c:.2f}× plain speed ({kind})")


def shown_cost(ev: StepEvent, curve: CostCurve | None, speed: dict | None = None) -> float | None:
    """The step's cost as cost_brief prints it (rounded as cost_text, so that the division on screen is exact), or
    None where it prints none (no draft, no usable curve, a noisy meter)."""
    n = len(ev.tokens)
    if n <= 1 or not _usable(curve) or speed_state(speed) == "noisy":
        return None
    return round(curve.cost(n), 2)


def brief_note(ev: StepEvent, curve: CostCurve | None, speed: dict | None = None) -> str:
    """The sentence after cost_brief that says why its cost is under 1 ("" when it is not, or none is shown; only
    the meter's costs go under 1); the page shows it, the presentation view has no room for it (assets/studio.css)."""
    c = shown_cost(ev, curve, speed)
    return "Under 1: this step ran faster than a plain step here." if c is not None and c < 1 else ""


def cost_html(ev: StepEvent | None, curve: CostCurve | None, trace: Trace | None = None) -> str:
    """The cost panel: t(N)/t(1) on this machine beside the step's gain, so speedup ≈ gained ÷ cost; all escaped.
    `trace`: the answer so far, for the formula with its numbers and the meter's verdict. The panel holds the full
    text and a one-line brief; assets/studio.css shows the brief in the presentation view only."""
    if ev is None:
        return f'<div class="tr-cost tr-cost-none">{html.escape(COST_PLACEHOLDER)}</div>'
    speed = trace.speed if trace is not None else None
    main, cls = cost_text(ev, curve, speed, machine_of(trace))
    rule = formula_text(trace.steps if trace is not None else [], curve, speed)  # no trace: the bare formula
    return (f'<div class="tr-cost tr-cost-{cls}"><div class="tr-cost-full"><span class="tr-cost-head">'
            f'Cost of this step:</span> {gloss(main)}<div class="tr-cost-rule">{gloss(rule)}</div></div>'
            f'<div class="tr-cost-brief">{gloss(cost_brief(ev, curve, speed))}{_note_span(ev, curve, speed)}</div></div>')


def _note_span(ev: StepEvent, curve: CostCurve | None, speed: dict | None) -> str:
    note = brief_note(ev, curve, speed)
    return f' <span class="tr-cost-note">{gloss(note)}</span>' if note else ""
