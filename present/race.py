"""The race: an answer replayed twice side by side, Token Recycling against plain decoding, at their recorded pace.

Nothing is decoded: Token Recycling's side follows the answer's own step timings (`StepEvent.timings["total"]`,
their cumulative sums are the steps' timestamps); plain decoding's per-token times are not recorded, so its side
is paced evenly, its total being Token Recycling's recorded total times the ratio the interleaved speed meter
measured (`Trace.speed`, trusted): the race finishes in the proportion the meter measured, and says so.

The meter is the page's one measured speedup, so there is no race without its trusted figure: when it says "too
noisy to measure", or for an older trace timed one method after the other (`Trace.plain`), a race would show a gap
that nobody measured, and `NoRace` says that instead.

`race_timeline` builds the plain-data timeline (the studio animates it in the browser, from its JSON);
`race_frame` says what both panes show at a given time. The same trace gives the same race every time.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Any

from .meter import machine_of
from .replay import step_runs
from tr_core.trace import Trace

MEASURE_HINT = ("turn on “Measure the speedup against plain decoding” in the decoding settings and ask again")


class NoRace(ValueError):
    """The trace cannot be raced; the message says why, in words for the page."""


@dataclass(frozen=True)
class RaceSide:
    """One runner: when each of its units (a step, or a plain token) ends, and how much text is shown then."""

    name: str  # "Token Recycling" or "plain decoding"
    times: tuple[float, ...]  # ms from the start at which unit i ends (non-decreasing)
    chars: tuple[int, ...]  # characters of the answer shown once unit i has ended (non-decreasing)
    labels: tuple[str, ...]  # the counter after 0, 1, ..., n units: len(times) + 1 entries

    @property
    def total_ms(self) -> float:
        """When this runner finishes."""
        return self.times[-1] if self.times else 0.0

    def done(self, t_ms: float) -> int:
        """Units ended by time t_ms (a unit ending exactly at t_ms counts)."""
        return bisect.bisect_right(self.times, t_ms)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "times": list(self.times), "chars": list(self.chars), "labels": list(self.labels)}


@dataclass(frozen=True)
class RaceTimeline:
    """Both runners of one answer, the answer's text and the caption that says how the pace was obtained."""

    text: str  # the answer (both runners emit the same tokens)
    tr: RaceSide  # Token Recycling: one unit per decoding step
    plain: RaceSide  # plain decoding: one unit per token
    mode: str  # "measured": plain decoding paced by the meter's trusted ratio (the only race there is)
    caption: str  # how the pace was obtained, in words

    @property
    def total_ms(self) -> float:
        """When the slower runner finishes."""
        return max(self.tr.total_ms, self.plain.total_ms)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (the page's animation reads it)."""
        return {"text": self.text, "mode": self.mode, "caption": self.caption, "total_ms": self.total_ms,
                "tr": self.tr.to_dict(), "plain": self.plain.to_dict()}


def race_frame(timeline: RaceTimeline, t_ms: float) -> tuple[str, str, str, str]:
    """(Token Recycling's text, plain decoding's text, their counters) at t_ms after the start."""
    out = []
    for side in (timeline.tr, timeline.plain):
        k = side.done(t_ms)
        out.append((timeline.text[: side.chars[k - 1]] if k else "", side.labels[k]))
    (tr_text, tr_counter), (plain_text, plain_counter) = out
    return tr_text, plain_text, tr_counter, plain_counter


def _cumulative(values: list[float]) -> tuple[float, ...]:
    total, out = 0.0, []
    for v in values:
        total += v
        out.append(round(total, 3))
    return tuple(out)


def _done(ms: float) -> str:
    return f" · done in {ms / 1000:.2f} s"


def _tr_side(trace: Trace, runs: list[str]) -> RaceSide:
    """Token Recycling's runner: step i ends at the sum of the recorded step times up to i."""
    times = _cumulative([max(float(ev.timings.get("total", 0.0)), 0.0) for ev in trace.steps])
    chars = tuple(_cumulative_ints([len(r) for r in runs]))
    tokens = _cumulative_ints([len(ev.emitted) for ev in trace.steps])
    n = len(trace.steps)
    labels = [f"step 0 of {n} · 0 tokens"] + [f"step {i + 1} of {n} · {tok} token{'' if tok == 1 else 's'}"
                                                for i, tok in enumerate(tokens)]
    labels[-1] += _done(times[-1]) if times else ""
    return RaceSide("Token Recycling", times, chars, tuple(labels))


def _cumulative_ints(values: list[int]) -> list[int]:
    total, out = 0, []
    for v in values:
        total += v
        out.append(total)
    return out


def token_ends(trace: Trace, runs: list[str]) -> list[int]:
    """Characters of the answer shown after each emitted token: each step's run split by its tokens' strings."""
    ends, start = [], 0
    for ev, run in zip(trace.steps, runs):
        acc = 0
        for j, t in enumerate(ev.emitted):
            last = j == len(ev.emitted) - 1
            acc = len(run) if last else min(acc + len(trace.token_text(t)), len(run))
            ends.append(start + acc)
        start += len(run)
    return ends


def _plain_side(ends: list[int], ms_per_token: float) -> RaceSide:
    """Plain decoding's runner: one token every `ms_per_token`."""
    m = len(ends)
    times = tuple(round((j + 1) * ms_per_token, 3) for j in range(m))
    labels = [f"token {j} of {m}" for j in range(m + 1)]
    labels[-1] += _done(times[-1]) if times else ""
    return RaceSide("plain decoding", times, tuple(ends), tuple(labels))


def no_race_reason(trace: Trace | None) -> str:
    """Why this trace cannot be raced ("" when it can): no steps, no timings, or no trusted speed measurement."""
    if trace is None or not trace.steps:
        return "there is no answer to race yet"
    if sum(ev.timings.get("total", 0.0) for ev in trace.steps) <= 0:
        return "this answer's step timings were not recorded"
    speed = trace.speed
    if speed is None and trace.plain is not None:
        return ("this trace was timed one method after the other (an older studio), so the gap between them is not "
                "a measurement")
    if speed is None:
        return f"this answer was not measured against plain decoding ({MEASURE_HINT})"
    if not (speed.get("trusted") and speed.get("ratio")):
        why = speed.get("reason") or "no timings"
        return f"the speed meter could not measure the speedup ({why}), so a race would show a gap nobody measured"
    return ""


def plain_pace(trace: Trace, tr_ms: float, tokens: int) -> tuple[float, str]:
    """(ms per plain token, the caption's sentence on plain decoding's pace), from the meter's trusted ratio."""
    speed = trace.speed or {}
    ratio, error = float(speed["ratio"]), float(speed.get("error") or 0.0)
    over = speed.get("tokens") or 0
    scope = f" over the first {over} of {tokens} tokens" if 0 < over < tokens else ""
    machine = machine_of(trace)
    scope += f", on {machine}" if machine else ""
    return (tr_ms * ratio / tokens,
            f"Plain decoding's per-token times are not recorded: it is paced evenly, scaled so that its time "
            f"is {ratio:.2f}× Token Recycling's, the speedup the speed meter measured ({ratio:.2f}× ± {error:.2f}, "
            f"both methods timed in turns over the same tokens{scope}).")


def race_timeline(trace: Trace) -> RaceTimeline:
    """Both runners of a trace's answer at their recorded pace; raises NoRace (with the reason) when it cannot."""
    reason = no_race_reason(trace)
    if reason:
        raise NoRace(reason)
    runs = step_runs(trace, trace.token_text)
    tr = _tr_side(trace, runs)
    ends = token_ends(trace, runs)
    ms, pace = plain_pace(trace, tr.total_ms, len(ends))
    plain = _plain_side(ends, ms)
    head = (f"Token Recycling at its recorded step times: {len(ends)} tokens in {len(trace.steps)} steps, "
            f"{tr.total_ms / 1000:.2f} s; plain decoding, one token per forward: {plain.total_ms / 1000:.2f} s.")
    same = (trace.speed or {}).get("identical")
    differ = " The two runs' tokens differed: both panes show Token Recycling's text." if same is False else ""
    return RaceTimeline(text="".join(runs), tr=tr, plain=plain, mode="measured", caption=f"{head} {pace}{differ}")
