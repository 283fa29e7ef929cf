"""The speed meter's timing protocol: Token Recycling and plain decoding timed in alternating chunks of the same tokens.

Run one after the other, a load change between the two runs fakes a speedup; in alternating chunks each pair covers
the same text at nearly the same moment, so machine drift hits both sides alike and the pairs' spread is the error.
A figure is trusted only with enough pairs, a small spread and a plausible ratio (docs/studio.md, "The speedup meter").
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from tr_core.bench.results import plausible_limit
from tr_core.divergence import first_difference
from tr_core.events import StepEvent

MIN_PAIRS = 3  # fewer chunk pairs than this cannot give a spread
MAX_PASSES = 3  # an answer measured whole but too noisily is decoded again from the same start, up to this often
MAX_REL_ERROR = 0.08  # a standard error above 8% of the ratio is "too noisy to measure"


@dataclass(frozen=True)
class ChunkPair:
    """One Token Recycling chunk and the plain chunk that decoded the same tokens right after it."""

    tokens: int  # tokens covered by both chunks
    tr_ms: float  # Token Recycling engine time for them (sum of step timings)
    tr_steps: int  # Token Recycling steps in the chunk
    plain_ms: float  # plain decoding engine time for the same tokens
    # Token Recycling's steps in the chunk by size: (tokens in the step's forward, their ms summed, steps)
    tr_sizes: tuple[tuple[int, float, int], ...] = ()


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
    # Token Recycling's steps over the measured tokens by size: (tokens in the step's forward, mean ms, steps); with
    # plain decoding's ms per token (1000 / plain_tps) it gives what a step of each size cost in plain steps
    step_ms: tuple[tuple[int, float, int], ...] = ()
    exact: bool | None = None  # Token Recycling ran in exact mode (row-invariant products; None: not known)
    # where the two runs parted: tr_core.divergence.Divergence as data with the tokens' texts (trace_schema PARTED)
    parted: dict | None = None


def _sizes(p: ChunkPair) -> tuple[tuple[int, float, int], ...]:
    """A pair's Token Recycling steps by size (one kind of step when it was recorded without sizes)."""
    return p.tr_sizes or ((0, p.tr_ms, p.tr_steps),)


def size_totals(pairs: list[ChunkPair]) -> dict[int, tuple[float, int]]:
    """The pairs' Token Recycling steps by size (tokens in the forward): (ms summed, steps)."""
    totals: dict[int, tuple[float, int]] = {}
    for p in pairs:
        for n, ms, k in _sizes(p):
            before = totals.get(n, (0.0, 0))
            totals[n] = (before[0] + ms, before[1] + k)
    return totals


def step_costs(pairs: list[ChunkPair]) -> dict[int, float]:
    """The mean ms of a Token Recycling step of each size (tokens in its forward) over the pairs."""
    return {n: ms / k for n, (ms, k) in size_totals(pairs).items() if k > 0}


def modelled_ratio(pairs: list[ChunkPair], fit: list[ChunkPair]) -> float:
    """plain ms / Token Recycling ms of all `pairs`, each side costed at the rates fitted on `fit`: plain decoding's ms
    per token, Token Recycling's mean ms per step of each size (a size absent from `fit`: its rate over all pairs).
    The text decoded (its tokens, how many steps of which size) stays that of `pairs`."""
    per_token = sum(p.plain_ms for p in fit) / max(sum(p.tokens for p in fit), 1)
    costs, every = step_costs(fit), step_costs(pairs)
    tr = sum(k * costs.get(n, every.get(n, 0.0)) for p in pairs for n, _, k in _sizes(p))
    return per_token * sum(p.tokens for p in pairs) / max(tr, 1e-9)


def jackknife_ratio(pairs: list[ChunkPair], fit: list[ChunkPair] | None = None) -> tuple[float, float]:
    """plain ms / TR ms of the text of `pairs` at the rates fitted on `fit` (default: all of them: the ratio of sums),
    and its jackknife standard error: the rates re-fitted without each fitted pair in turn, the same text re-costed.
    Only the costs are noisy; the text decoded (its tokens and steps) is exact."""
    fit = pairs if fit is None else fit
    ratio = modelled_ratio(pairs, fit)
    n = len(fit)
    if n < 2:
        return ratio, math.inf
    loo = [modelled_ratio(pairs, fit[:i] + fit[i + 1:]) for i in range(n)]
    mean = sum(loo) / n
    return ratio, math.sqrt((n - 1) / n * sum((x - mean) ** 2 for x in loo))


def balances(pairs: list[ChunkPair]) -> list[float]:
    """Each pair's plain half's load over its Token Recycling half's: about 1 when both chunks ran under the same load.
    Each half is judged against what its own steps cost over all pairs, so a chunk of large trees is not taken for a
    disturbed one."""
    per_token = sum(p.plain_ms for p in pairs) / max(sum(p.tokens for p in pairs), 1)
    costs = step_costs(pairs)
    out = []
    for p in pairs:
        expected_tr = sum(k * costs[n] for n, _, k in _sizes(p))
        out.append((p.plain_ms / max(p.tokens * per_token, 1e-9)) / max(p.tr_ms / max(expected_tr, 1e-9), 1e-9))
    return out


def drop_outliers(pairs: list[ChunkPair]) -> list[ChunkPair]:
    """Pairs whose balance (`balances`) is far from the rest (a load change fell between their two chunks) are left
    out. Far: more than 4 median absolute deviations (at least 10%) from the median balance."""
    if len(pairs) < 5:
        return pairs
    values = balances(pairs)
    ordered = sorted(values)
    median = ordered[len(ordered) // 2]
    mad = sorted(abs(v - median) for v in ordered)[len(ordered) // 2]
    limit = max(4 * mad, 0.10 * median)
    return [p for p, v in zip(pairs, values) if abs(v - median) <= limit]


def robust_ratio(pairs: list[ChunkPair], ratio: float | None = None) -> tuple[float, float]:
    """The ratio from the median pair (`ratio`, default the pairs' ratio of sums, x the median balance) and its
    MAD-based standard error. A median far from the ratio means the figure rests on a few disturbed pairs."""
    ratio = sum(p.plain_ms for p in pairs) / sum(p.tr_ms for p in pairs) if ratio is None else ratio
    values = sorted(ratio * b for b in balances(pairs))
    n = len(values)
    median = (values[(n - 1) // 2] + values[n // 2]) / 2
    mad = sorted(abs(v - median) for v in values)[n // 2] * 1.4826  # ~ standard deviation for normal noise
    return median, 1.2533 * mad / math.sqrt(n)  # 1.2533: standard error of a median


def _distrust(pairs: list[ChunkPair], ratio: float, error: float, median_ratio: float, mean_acc: float) -> str:
    """Why a measured ratio cannot be shown ("" when it can)."""
    tokens = sum(p.tokens for p in pairs)
    if len(pairs) < MIN_PAIRS:
        return f"the answer was too short to measure ({tokens} tokens); ask for a longer one"
    if ratio > plausible_limit(mean_acc):
        return ("the timings make Token Recycling faster than its accepted tokens per step allow (a tree forward "
                "never costs less than a one-token forward): the machine's load changed while measuring")
    if error > MAX_REL_ERROR * ratio or abs(ratio - median_ratio) > 2 * error:
        return f"the timings varied by ±{error / ratio:.0%} between turns: the machine was busy while measuring"
    return ""


def estimate(pairs: list[ChunkPair], identical: bool | None = None) -> SpeedEstimate:
    """Measured chunk pairs -> the meter's figure, trusted or not: the text of all pairs costed at the rates of the
    undisturbed ones (`modelled_ratio`; a disturbed pair lends no timing but its text counts), with the larger of the
    jackknife and the median-based errors."""
    pairs = [p for p in pairs if p.tokens > 0 and p.tr_ms > 0 and p.plain_ms > 0]
    if not pairs:
        return SpeedEstimate(None, None, None, None, None, 0, 0, False, "nothing was measured", identical)
    tokens = sum(p.tokens for p in pairs)
    kept = drop_outliers(pairs)
    left_out = len(pairs) - len(kept) if len(kept) >= 0.8 * len(pairs) else 0
    fit = kept if left_out else pairs  # too many disagree: keep all, the error shows it
    ratio, error = jackknife_ratio(pairs, fit)
    median_ratio, median_error = robust_ratio(fit, ratio)
    error = max(error, median_error)
    per_token = sum(p.plain_ms for p in fit) / sum(p.tokens for p in fit)  # plain decoding's ms per token
    costs = step_costs(fit)
    step_ms = tuple((n, costs.get(n, ms / k), k)  # all the text's steps, at the fitted rates
                    for n, (ms, k) in sorted(size_totals(pairs).items()) if k > 0)
    tr_s = tokens * per_token / ratio / 1e3  # the text's Token Recycling time at the fitted rates
    mean_acc = tokens / max(sum(p.tr_steps for p in pairs), 1)
    reason = _distrust(fit, ratio, error, median_ratio, mean_acc)
    error = error if math.isfinite(error) else None  # one pair has no spread: unknown (and JSON has no inf)
    return SpeedEstimate(ratio=ratio, error=error, tr_tps=tokens / tr_s, plain_tps=1e3 / per_token,
                         mean_accepted=mean_acc, tokens=tokens, pairs=len(fit), trusted=not reason,
                         reason=reason, identical=identical, covered=tokens, left_out=left_out,
                         step_ms=step_ms if any(p.tr_sizes for p in pairs) else ())


def _advance(events: Iterator[Any], until: Callable[[int, float], bool], state: dict) -> bool:
    """Pull step events into `state` ("tokens", "ms", "steps", "emitted"; "sizes": this round's steps by forward size,
    n -> [ms, steps]) until `until(tokens, chunk_ms)`.

    Returns False when the generator is exhausted.
    """
    chunk_ms = 0.0
    for ev in events:
        if isinstance(ev, StepEvent):
            ms = ev.timings.get("total", 0.0)
            state["tokens"] += len(ev.emitted)
            state["emitted"].extend(ev.emitted)
            state["ms"] += ms
            state["steps"] += 1
            size = state["sizes"].setdefault(len(ev.tokens), [0.0, 0])
            size[0], size[1] = size[0] + ms, size[1] + 1
            chunk_ms += ms
            if until(state["tokens"], chunk_ms):
                return True
    return False


def _fresh() -> dict:
    """Counters of one run inside `interleave`."""
    return {"tokens": 0, "ms": 0.0, "steps": 0, "emitted": [], "sizes": {}}


def interleave(tr_events: Iterator[Any], plain_events: Iterator[Any], chunk_ms: float = 250.0,
               max_s: float = 30.0, should_stop: Callable[[], bool] | None = None,
               again: Callable[[], tuple[Iterator[Any], Iterator[Any]]] | None = None,
               max_passes: int = MAX_PASSES) -> Iterator[SpeedEstimate]:
    """Alternate chunks of a Token Recycling run and a plain run of the same prompt; yield the estimate after each round
    (the last one is the result).

    tr_events / plain_events: `Engine.generate` generators, closed here when done or when this generator is closed.
    Rounds alternate which run goes first (about `chunk_ms` of engine time, the other run catching up to the same
    token), so whatever the consumer does between rounds slows each method alike. Stops after `max_s` seconds of
    wall time or when `should_stop()` says so. `again`: fresh generators decoding the same answer from the same start;
    a whole answer measured too noisily is decoded again, up to `max_passes` passes, its pairs pooled.
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
            tr["sizes"] = {}  # this round's steps only
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
                                   plain_ms=plain["ms"] - before_plain["ms"],
                                   tr_sizes=tuple((n, ms, k) for n, (ms, k) in sorted(tr["sizes"].items()))))
            yield with_parting(estimate(pairs), tr["emitted"], plain["emitted"])
    finally:
        for gen in (tr_events, plain_events):
            close = getattr(gen, "close", None)
            if close is not None:
                close()


def with_parting(est: SpeedEstimate, tr: list[int], plain: list[int]) -> SpeedEstimate:
    """`est` with whether the runs' tokens so far agree and, if not, where they part (the scores are added later)."""
    n = min(len(tr), len(plain))
    index = first_difference(tr[:n], plain[:n])
    if index is None:
        return dataclasses.replace(est, identical=True)
    return dataclasses.replace(est, identical=False,
                               parted={"index": index, "first_token": tr[index], "second_token": plain[index]})


def measure_interleaved(tr_events: Iterator[Any], plain_events: Iterator[Any], **options: Any) -> SpeedEstimate:
    """Run `interleave` to the end and return its final estimate."""
    result = estimate([])
    for result in interleave(tr_events, plain_events, **options):
        pass
    return result


def answer_sizes(steps: list[StepEvent]) -> list[int]:
    """The tree sizes an answer drafted (nodes per step after the root), from its second step on: what `Engine.fork`'s
    cost-sized drafters draft again."""
    return [len(ev.tokens) - 1 for ev in steps[1:]]
