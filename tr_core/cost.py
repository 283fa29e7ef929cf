"""What a forward costs on this device, timed over the engine's own cache and mask path: the one measurement
for the adaptive tree and the profiler. On CUDA, events are read after the step's one host sync (no stall)."""
from __future__ import annotations

import bisect
import time
import weakref
from collections.abc import Iterable
from typing import Any

import torch

from .kv_cache import TreeKVCache
from .machine import sync
from .runner import ModelRunner
from .tree import chain_tree

COST_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 81, 96, 128)  # forward sizes (tokens) whose cost is tracked


def interpolate(points: dict[int, float], n: float) -> float:
    """Piecewise-linear value at n of a curve given at integer sizes (linear through the origin past the end)."""
    sizes = sorted(points)
    if n <= sizes[0]:
        return points[sizes[0]]
    if n >= sizes[-1]:
        return points[sizes[-1]] * n / sizes[-1]
    i = bisect.bisect_left(sizes, n)  # sizes[i - 1] < n <= sizes[i]
    lo, hi = sizes[i - 1], sizes[i]
    w = (n - lo) / (hi - lo)
    return points[lo] * (1 - w) + points[hi] * w


STEADY_SPREAD = 0.25  # a curve whose repeats varied more than this (relative_spread) is not shown as fact
MAX_RETIMES = 2  # rounds of re-timing an unsteady probe's unsteady sizes, at most


def relative_spread(times: list[float]) -> float:
    """(median - fastest) / fastest of one timing's repeats (0 for fewer than two): a busy machine lifts the median."""
    if len(times) < 2:
        return 0.0
    ordered = sorted(times)
    return (ordered[len(ordered) // 2] - ordered[0]) / max(ordered[0], 1e-9)


def timing_context(runner: ModelRunner, context: list[int], sizes: Iterable[int]) -> tuple[list[int], list[int]]:
    """(the last <= 256 tokens of `context`, leaving room for the largest size, the sizes that fit after them)."""
    limit, sizes = runner.context_limit(), list(sizes)
    keep = max(1, min(256, limit - max(sizes, default=1)))
    context = (context or [0])[-keep:]
    return context, [n for n in sizes if len(context) + n <= limit]


class ForwardTimer:
    """Times forwards of n chain tokens (the widest mask) after a context prefilled once; each forward is cut back
    off the cache like a rejected draft. A context manager (no autograd); times the model's products as installed."""

    def __init__(self, runner: ModelRunner, context: list[int]) -> None:
        self.runner, self.context = runner, context
        self._grad = torch.no_grad()

    def __enter__(self) -> "ForwardTimer":
        self._grad.__enter__()
        self.cache = TreeKVCache()
        self.runner.prefill(self.context, self.cache)
        self.past = len(self.context)
        self.token = torch.tensor([(self.context or [0])[-1]], dtype=torch.long, device=self.runner.device)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._grad.__exit__(*exc)

    def time(self, n: int) -> float:
        """Milliseconds of one forward of n tokens."""
        runner, past = self.runner, self.past
        tree = chain_tree(n, runner.device)
        sync(runner.device)
        t0 = time.perf_counter()
        runner.forward(self.token.repeat(n)[None], (past + tree.depths)[None],
                       runner.mask(tree.tree_mask, tree.depths, past), self.cache)
        sync(runner.device)
        ms = (time.perf_counter() - t0) * 1e3
        self.cache.truncate(past)
        return ms


def measure_forward_costs(runner: ModelRunner, context: list[int], sizes: list[int], repeats: int = 2,
                          warmup: int = 1) -> dict[int, list[float]]:
    """n -> `repeats` ms of forwards of n tokens after `context`; sizes interleaved so machine drift hits all alike."""
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with ForwardTimer(runner, context) as timer:
        for rep in range(warmup + repeats):
            for n in sizes:
                ms = timer.time(n)
                if rep >= warmup:
                    times[n].append(ms)
    return times


class ForwardCost:
    """t(N): one step of N tokens, probed at start-up and refined online (EMA). Never-observed sizes follow the probe
    scaled by the observed/probed ratio, so a size is not chosen just because it was never tried."""

    def __init__(self) -> None:
        self.ms = {n: float(n) for n in COST_GRID}  # placeholder shape until measured: linear in N
        self.probed = dict(self.ms)  # the probe's curve, unscaled
        self.seen = {n: 0 for n in COST_GRID}  # observations folded into each grid point
        self.scale = 1.0  # observed step cost / probed forward cost, EMA over all observations
        self.measured = False
        self.spread = 0.0  # the largest relative_spread of the probe's repeats at one size (0 until measured)

    @property
    def steady(self) -> bool:
        """False when the probe's timings varied too much (spread above STEADY_SPREAD) to be shown as fact."""
        return self.spread <= STEADY_SPREAD

    def __call__(self, n: int) -> float:
        return interpolate(self.ms, n)

    def observe(self, n: int, ms: float, alpha: float = 0.1) -> None:
        """Blend one measured step into the nearest grid point; rescale the grid points never observed."""
        g = min(COST_GRID, key=lambda x: abs(x - n))
        self.scale = (1 - alpha / 2) * self.scale + alpha / 2 * ms / max(interpolate(self.probed, n), 1e-9)
        self.ms[g] = (1 - alpha) * self.ms[g] + alpha * ms * self(g) / max(self(n), 1e-9)
        self.seen[g] += 1
        for p in COST_GRID:
            if not self.seen[p]:
                self.ms[p] = self.probed[p] * self.scale

    def set_measured(self, times: dict[int, list[float]], max_tokens: int) -> None:
        """Take a probe's times (median per size); sizes past `max_tokens` scale linearly from the last one."""
        self.spread = max((relative_spread(v) for v in times.values()), default=0.0)
        for n in COST_GRID:
            if n in times and times[n]:
                self.ms[n] = sorted(times[n])[len(times[n]) // 2]
        last = max((g for g in COST_GRID if g in times and g <= max_tokens), default=1)
        for n in COST_GRID:
            if n > last:
                self.ms[n] = self.ms[last] * n / last
        self.probed = dict(self.ms)
        self.measured = True

    def probe(self, runner: ModelRunner, context: list[int], max_tokens: int,
              known: dict[int, float] | None = None) -> dict[int, list[float]]:
        """Measure the grid up to `max_tokens`, timing only sizes not in `known` (ms, e.g. kernels.timed_costs);
        returns the times taken."""
        known = {n: ms for n, ms in (known or {}).items() if n in COST_GRID and n <= max(max_tokens, 1)}
        sizes = [n for n in COST_GRID if n <= max(max_tokens, 1) and n not in known]
        context, sizes = timing_context(runner, context, sizes)
        times = measure_forward_costs(runner, context, sizes) if sizes else {}
        for _ in range(MAX_RETIMES):  # a disturbed size is timed again, a bounded number of times
            shaky = [n for n, v in times.items() if relative_spread(v) > STEADY_SPREAD]
            if not shaky:
                break
            for n, more in measure_forward_costs(runner, context, shaky, warmup=0).items():
                times[n] += more
        times = {**{n: [ms] for n, ms in known.items()}, **times}
        self.set_measured(times, max_tokens)
        return times

    def probe_once(self, runner: ModelRunner, context: list[int], max_tokens: int,
                   known: dict[int, float] | None = None, variant: Any = None) -> None:
        """`probe`, or the times of an earlier probe of the same model, `max_tokens`, `known` and `variant` (how its
        products run): a device's forward costs are the model's, and a crowd's sessions each need them."""
        key = (max_tokens, variant, tuple(sorted((known or {}).items())))
        times = _PROBED.get(runner.model, {}).get(key)
        if times is None:
            _PROBED.setdefault(runner.model, {})[key] = self.probe(runner, context, max_tokens, known)
        else:
            self.set_measured(times, max_tokens)


_PROBED: "weakref.WeakKeyDictionary[Any, dict[tuple, dict[int, list[float]]]]" = weakref.WeakKeyDictionary()


class StepClock:
    """Phase timings of one decoding step in ms; `exact=True` syncs CUDA at every mark (exact, slower)."""

    def __init__(self, device: torch.device, exact: bool = False) -> None:
        self.cuda, self.device = device.type == "cuda", device
        self.exact = exact and self.cuda
        self.marks: list[tuple[str, float]] = []
        self._events: tuple[Any, Any] | None = None
        self.start = self._now()

    def _now(self) -> float:
        if self.exact:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def mark(self, phase: str) -> None:
        self.marks.append((phase, self._now()))

    def forward_begins(self) -> None:
        """Record the forward's start on the GPU stream (no stall)."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            self._events = (start, end)

    def forward_ends(self) -> None:
        """Record the forward's end on the GPU stream (no stall)."""
        if self._events is not None:
            self._events[1].record()

    def timings(self) -> dict[str, float]:
        """Milliseconds per phase and "total"; call after the step's host sync (the CUDA events are done then)."""
        out, last = {}, self.start
        for phase, t in self.marks:
            out[phase] = (t - last) * 1e3
            last = t
        if self._events is not None:
            self._events[1].synchronize()  # already complete after the step's sync: no stall
            out["forward"] = self._events[0].elapsed_time(self._events[1])
        out["total"] = (last - self.start) * 1e3
        return out
