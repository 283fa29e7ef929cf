"""An honest speedup figure: Token Recycling and plain decoding timed in alternating chunks over the same tokens.

Timing the two methods one after the other lets any change in machine load between the runs fake a result
(a busy neighbour during the plain run makes Token Recycling look 3x faster). Here both runs advance
together: Token Recycling decodes a short chunk (about `chunk_ms` of engine time), then plain decoding
decodes the very same tokens, and so on. Each pair of chunks covers the same text at nearly the same
moment, so a load change hits both sides of a pair; the spread of the pairs' ratios gives the uncertainty.

A figure is shown only when it can be trusted: enough pairs, a small spread, and a ratio no larger than
the run's mean accepted tokens per step allow (a tree forward never costs less than a one-token forward,
so a step that emits `a` tokens can at most be `a` times faster than one plain step).
"""
from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..events import StepEvent

MIN_PAIRS = 3  # fewer chunk pairs than this cannot give a spread
MAX_PASSES = 3  # an answer measured whole but too noisily is decoded again from the same start, up to this often
MAX_REL_ERROR = 0.08  # a standard error above 8% of the ratio is "too noisy to measure"
PLAUSIBLE_SLACK = 1.10  # ratio <= slack x mean accepted tokens per step (slack covers per-step overheads)


@dataclass(frozen=True)
class ChunkPair:
    """One Token Recycling chunk and the plain chunk that decoded the same tokens right after it."""

    tokens: int  # tokens covered by both chunks
    tr_ms: float  # Token Recycling engine time for them (sum of step timings)
    tr_steps: int  # Token Recycling steps in the chunk
    plain_ms: float  # plain decoding engine time for the same tokens


@dataclass(frozen=True)
class SpeedEstimate:
    """The meter's figure: a ratio with its uncertainty, or the reason it cannot be trusted."""

    ratio: float | None  # plain time / Token Recycling time over the measured tokens (None: nothing measured)
    error: float | None  # one standard error of the ratio (jackknife over chunk pairs)
    tr_tps: float | None  # Token Recycling tokens/s over the measured chunks
    plain_tps: float | None  # plain tokens/s over the same tokens
    mean_accepted: float | None  # tokens per Token Recycling step in the measured chunks
    tokens: int  # tokens measured by both methods
    pairs: int  # chunk pairs
    trusted: bool  # True: show the ratio; False: show "too noisy to measure" and `reason`
    reason: str = ""  # why the figure is not trusted ("" when trusted)
    identical: bool | None = None  # both runs emitted the same tokens (None: not known)
    covered: int = 0  # tokens both runs decoded, including pairs left out as disturbed
    left_out: int = 0  # chunk pairs left out because a load change fell between their two chunks
    passes: int = 1  # times the answer was decoded by both methods (its chunk pairs pooled)


def jackknife_ratio(pairs: list[ChunkPair]) -> tuple[float, float]:
    """Ratio of sums (plain ms / TR ms) and its jackknife standard error from timing noise alone.

    ratio = mean accepted tokens per step x (plain ms per step / TR ms per step). The first factor is
    exact (the same tokens are decoded whatever the load); only the cost ratio is noisy, so the jackknife
    resamples that, holding the accepted tokens fixed: how much a chunk's text happened to be drafted
    well is not measurement noise.
    """
    tokens, steps = sum(p.tokens for p in pairs), sum(p.tr_steps for p in pairs)
    tr, plain = sum(p.tr_ms for p in pairs), sum(p.plain_ms for p in pairs)
    ratio = plain / tr
    n = len(pairs)
    if n < 2:
        return ratio, math.inf
    mean_acc = tokens / max(steps, 1)

    def cost_ratio(t: int, s: int, tr_ms: float, plain_ms: float) -> float:
        return (plain_ms / max(t, 1)) / (tr_ms / max(s, 1))

    loo = [mean_acc * cost_ratio(tokens - p.tokens, steps - p.tr_steps, tr - p.tr_ms, plain - p.plain_ms)
           for p in pairs]
    mean = sum(loo) / n
    return ratio, math.sqrt((n - 1) / n * sum((x - mean) ** 2 for x in loo))


def cost_ratio(p: ChunkPair) -> float:
    """A pair's plain ms per token over its Token Recycling ms per step: load-sensitive, content-insensitive."""
    return (p.plain_ms / max(p.tokens, 1)) / (p.tr_ms / max(p.tr_steps, 1))


def drop_outliers(pairs: list[ChunkPair]) -> list[ChunkPair]:
    """Pairs whose cost ratio is far from the rest (a load change fell between their two chunks) are left out.

    Far: more than 4 median absolute deviations (at least 10%) from the median cost ratio.
    """
    if len(pairs) < 5:
        return pairs
    ratios = sorted(cost_ratio(p) for p in pairs)
    median = ratios[len(ratios) // 2]
    mad = sorted(abs(r - median) for r in ratios)[len(ratios) // 2]
    limit = max(4 * mad, 0.10 * median)
    return [p for p in pairs if abs(cost_ratio(p) - median) <= limit]


def plausible_limit(mean_accepted: float) -> float:
    """The largest ratio a run with this many tokens per step can honestly reach."""
    return mean_accepted * PLAUSIBLE_SLACK


def robust_ratio(pairs: list[ChunkPair]) -> tuple[float, float]:
    """The ratio from the median pair (mean accepted x median cost ratio) and its MAD-based standard error.

    Bursts of load that fall between a pair's two chunks move the mean, not the median; a median far from
    the ratio of sums therefore means the figure rests on a few disturbed pairs.
    """
    ratios = sorted(cost_ratio(p) for p in pairs)
    n = len(ratios)
    median = (ratios[(n - 1) // 2] + ratios[n // 2]) / 2
    mad = sorted(abs(r - median) for r in ratios)[n // 2] * 1.4826  # ~ standard deviation for normal noise
    mean_acc = sum(p.tokens for p in pairs) / max(sum(p.tr_steps for p in pairs), 1)
    return mean_acc * median, mean_acc * 1.2533 * mad / math.sqrt(n)  # 1.2533: standard error of a median


def _distrust(pairs: list[ChunkPair], ratio: float, error: float, median_ratio: float, mean_acc: float) -> str:
    """Why a measured ratio cannot be shown ("" when it can)."""
    tokens = sum(p.tokens for p in pairs)
    if len(pairs) < MIN_PAIRS:
        return f"the answer was too short to measure ({tokens} tokens); ask for a longer one"
    if ratio > plausible_limit(mean_acc):
        return ("the timings make Token Recycling faster than its accepted tokens per step allow (a tree forward "
                "never costs less than a one-token forward): the machine's load changed while measuring")
    if error > MAX_REL_ERROR * ratio or abs(ratio - median_ratio) > 2 * error:
        return f"the timings varied by ±{error / ratio:.0%} between chunks: the machine was busy while measuring"
    return ""


def estimate(pairs: list[ChunkPair], identical: bool | None = None) -> SpeedEstimate:
    """Turn measured chunk pairs into the meter's figure, deciding whether it can be trusted.

    The ratio is the ratio of sums over the pairs (a pair disturbed by a load change between its chunks is
    left out); its error is the larger of the jackknife and the median-based one.
    """
    pairs = [p for p in pairs if p.tokens > 0 and p.tr_ms > 0 and p.plain_ms > 0]
    if not pairs:
        return SpeedEstimate(None, None, None, None, None, 0, 0, False, "nothing was measured", identical)
    covered = sum(p.tokens for p in pairs)
    kept = drop_outliers(pairs)
    left_out = len(pairs) - len(kept) if len(kept) >= 0.8 * len(pairs) else 0
    pairs = kept if left_out else pairs  # too many disagree: keep all, the error shows it
    tokens = sum(p.tokens for p in pairs)
    ratio, error = jackknife_ratio(pairs)
    median_ratio, median_error = robust_ratio(pairs)
    error = max(error, median_error)
    tr_s, plain_s = sum(p.tr_ms for p in pairs) / 1e3, sum(p.plain_ms for p in pairs) / 1e3
    mean_acc = tokens / max(sum(p.tr_steps for p in pairs), 1)
    reason = _distrust(pairs, ratio, error, median_ratio, mean_acc)
    error = error if math.isfinite(error) else None  # one pair has no spread: unknown (and JSON has no inf)
    return SpeedEstimate(ratio=ratio, error=error, tr_tps=tokens / tr_s, plain_tps=tokens / plain_s,
                         mean_accepted=mean_acc, tokens=tokens, pairs=len(pairs), trusted=not reason,
                         reason=reason, identical=identical, covered=covered, left_out=left_out)


def _advance(events: Iterator[Any], until: Callable[[int, float], bool], state: dict) -> bool:
    """Pull step events into `state` ("tokens", "ms", "steps", "emitted") until `until(tokens, chunk_ms)`.

    Returns False when the generator is exhausted.
    """
    chunk_ms = 0.0
    for ev in events:
        if isinstance(ev, StepEvent):
            state["tokens"] += len(ev.emitted)
            state["emitted"].extend(ev.emitted)
            state["ms"] += ev.timings.get("total", 0.0)
            state["steps"] += 1
            chunk_ms += ev.timings.get("total", 0.0)
            if until(state["tokens"], chunk_ms):
                return True
    return False


def _fresh() -> dict:
    """Counters of one run inside `interleave`."""
    return {"tokens": 0, "ms": 0.0, "steps": 0, "emitted": []}


def interleave(tr_events: Iterator[Any], plain_events: Iterator[Any], chunk_ms: float = 250.0,
               max_s: float = 30.0, should_stop: Callable[[], bool] | None = None,
               again: Callable[[], tuple[Iterator[Any], Iterator[Any]]] | None = None,
               max_passes: int = MAX_PASSES) -> Iterator[SpeedEstimate]:
    """Alternate chunks of a Token Recycling run and a plain run of the same prompt; yield the estimate so far.

    tr_events / plain_events: `Engine.generate` generators (closed here when done or when this generator
    is closed). The rounds alternate which run goes first. In odd rounds the Token Recycling run decodes
    about `chunk_ms` of engine time, then the plain run decodes up to the same token count; in even rounds
    the plain run decodes about `chunk_ms`, Token Recycling catches up (its last step may overshoot) and
    plain decodes those last few tokens. Whatever the consumer does with each estimate (a page redraws the
    meter, a browser on the same CPU renders it) then slows each method's chunk in half the rounds instead
    of always the first one's. An estimate is yielded after every round (the last one is the result).
    Stops after `max_s` seconds of wall time (the figure then covers the tokens so far) or when
    `should_stop()` says so.

    `again`: fresh generators that decode the same answer from the same start. When a pass measured the whole
    answer but its figure cannot be shown (a short answer gives few pairs, a busy machine a wide spread), and
    time is left, the answer is decoded again, up to `max_passes` passes, and the pairs of all passes are pooled:
    more pairs of the same tokens narrow the error honestly.
    """
    pairs: list[ChunkPair] = []
    deadline = time.monotonic() + max_s
    est, covered, passes = estimate([]), 0, 0
    while True:
        passes, first = passes + 1, len(pairs)
        rounds = _one_pass(tr_events, plain_events, chunk_ms, pairs)
        try:
            for est in rounds:
                covered = max(covered, sum(p.tokens for p in pairs[first:] if p.tokens > 0))  # this pass's
                est = dataclasses.replace(est, covered=covered, passes=passes)
                yield est
                if time.monotonic() > deadline or (should_stop is not None and should_stop()):
                    return
        finally:
            rounds.close()  # closes both runs, also when the consumer closes this generator
        if est.trusted or est.identical is False or again is None or passes >= max_passes or not pairs:
            return
        tr_events, plain_events = again()


def _one_pass(tr_events: Iterator[Any], plain_events: Iterator[Any], chunk_ms: float,
              pairs: list[ChunkPair]) -> Iterator[SpeedEstimate]:
    """One pass of `interleave` over the answer, appending its chunk pairs to `pairs` (those of earlier passes
    included in each estimate)."""
    tr, plain = _fresh(), _fresh()
    try:
        more = True
        while more:
            before_tr, before_plain = dict(tr), dict(plain)
            if len(pairs) % 2 == 0:
                more = _advance(tr_events, lambda _t, ms: ms >= chunk_ms, tr)
            else:
                more = _advance(plain_events, lambda _t, ms: ms >= chunk_ms, plain)
                goal = plain["tokens"]
                if tr["tokens"] < goal:
                    more = _advance(tr_events, lambda t, _ms: t >= goal, tr) and more
            target = tr["tokens"]
            if plain["tokens"] < target:
                more = _advance(plain_events, lambda t, _ms: t >= target, plain) and more
            pairs.append(ChunkPair(tokens=min(tr["tokens"], plain["tokens"]) - before_tr["tokens"],
                                   tr_ms=tr["ms"] - before_tr["ms"], tr_steps=tr["steps"] - before_tr["steps"],
                                   plain_ms=plain["ms"] - before_plain["ms"]))
            n = min(len(tr["emitted"]), len(plain["emitted"]))
            yield estimate(pairs, identical=tr["emitted"][:n] == plain["emitted"][:n])
    finally:
        for gen in (tr_events, plain_events):
            close = getattr(gen, "close", None)
            if close is not None:
                close()


def measure_interleaved(tr_events: Iterator[Any], plain_events: Iterator[Any], **options: Any) -> SpeedEstimate:
    """Run `interleave` to the end and return its final estimate."""
    result = estimate([])
    for result in interleave(tr_events, plain_events, **options):
        pass
    return result


def forked(engine: Any) -> Any:
    """A copy of an engine sharing its model (and its drafters' measured forward costs) but with its own adjacency
    matrix and drafter state.

    Taken before an answer, it lets the speed measurement re-run Token Recycling from exactly the state
    the answer started from (the answer itself taught the live matrix its own text, which would flatter it).
    """
    twin = copy.copy(engine)
    twin.matrix = engine.matrix.clone()
    twin.answer_starts = list(getattr(engine, "answer_starts", []))  # the twin's own clock history
    twin.adaptive = _fork_drafter(engine.adaptive)
    twin.hybrid = _fork_drafter(engine.hybrid)
    return twin


def _fork_drafter(drafter: Any) -> Any:
    """A deep copy of a drafter that shares its forward cost curve: the curve describes the machine, not the answer,
    so a twin taken before the answer's start-up probe reads the probe's result instead of timing it again (seconds
    that would come out of the measurement's time cap)."""
    cost = getattr(drafter, "cost", None)
    return copy.deepcopy(drafter, memo={} if cost is None else {id(cost): cost})
