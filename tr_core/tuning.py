"""The timed choice of matrix products (kernels.py): which way each row count multiplies, chosen by timing this machine;
a way is admitted within ADMIT_FACTOR of the library's own n-row rounding (docs/exactness.md)."""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch
import torch.nn.functional as F

from . import kernels
from .cost import ForwardTimer, relative_spread, timing_context
from .kernels import (ONEDNN, STOCK, WAYS, LinearPlan, available_ways, installed, linear_layers, needs_tuning,
                      no_room_for_packs, plan_of, reroute, set_plan, weight_dtype)
from .plan_cache import load_plan, save_plan

# row counts timed; others follow the nearest one timed, and more than the largest (long prompts) follow the largest
TUNE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
MAX_EXTRA_ROUNDS = 2  # more rounds, at most, for sizes whose deciding timings varied over kernels.STEADY_SPREAD
STALE_RATIO = 1.5  # a kept plan whose forwards now take more than this factor more or less time is timed again
ADMIT_FACTOR = 4.0  # a way may deviate from the one-row product this many times what the library's n-row one does
AGREE_ROWS = (1, 2, 3, 4, 8, 16)  # row counts the agreement is measured at
_LOCK = threading.Lock()  # one tuning at a time in a process (the app's sessions share models)


def choose(ms: dict[str, dict[int, float]]) -> dict[int, str]:
    """The fastest way for each row count timed every way (the library's product on a tie)."""
    sizes = set.intersection(*(set(per) for per in ms.values())) if ms else set()
    return {n: min((way for way in WAYS if way in ms), key=lambda way: (ms[way][n], way != STOCK))
            for n in sorted(sizes)}


@torch.no_grad()
def agreement(model: Any, way: str, rows: tuple[int, ...] = AGREE_ROWS, seed: int = 0) -> dict[str, float]:
    """Largest gap of `way`'s n-row product [n, out] from the library's one-row products, beside the library's own
    n-row product's, over one layer of each shape: "way_abs", "library_abs", relative "way_rel", "library_rel";
    "bit_equal" 1.0 or 0.0."""
    g = torch.Generator().manual_seed(seed)
    product = kernels.PRODUCTS.get(way, lambda x, w, b, n: F.linear(x, w, b))
    worst = {"way_abs": 0.0, "way_rel": 0.0, "library_abs": 0.0, "library_rel": 0.0, "bit_equal": 1.0}
    shapes: dict[tuple[int, int, bool], torch.nn.Linear] = {}
    for layer in linear_layers(model):
        shapes.setdefault((layer.in_features, layer.out_features, layer.bias is not None), layer)
    for layer in shapes.values():
        w, b = layer.weight, layer.bias
        x = torch.randn(max(rows), w.shape[1], generator=g).to(w.dtype)
        one = torch.cat([F.linear(x[i : i + 1], w, b) for i in range(max(rows))]).float()  # [rows, out]
        scale = max(float(one.abs().max()), 1e-30)
        for n in rows:
            for key, got in (("way", product(x[:n], w, b, n)), ("library", F.linear(x[:n], w, b))):
                gap = float((got.float() - one[:n]).abs().max())
                worst[f"{key}_abs"] = max(worst[f"{key}_abs"], gap)
                worst[f"{key}_rel"] = max(worst[f"{key}_rel"], gap / scale)
                if key == "way" and gap:
                    worst["bit_equal"] = 0.0
    return worst


def admitted_ways(model: Any) -> tuple[tuple[str, ...], dict[str, dict[str, float]], str]:
    """(ways to time, each admitted way's `agreement`, why any other was left out) for `model` on this machine."""
    dtype = weight_dtype(model)
    floor = 4 * torch.finfo(dtype).eps  # a library that is itself row-invariant still leaves the last bits free
    ways, measured, notes = [STOCK], {}, []
    for way in available_ways(dtype)[1:]:
        if way == ONEDNN and (room := no_room_for_packs(model)):
            notes.append(room)
            continue
        try:
            agree = agreement(model, way)
        except (RuntimeError, NotImplementedError, TypeError) as exc:  # a shape the small check did not cover
            notes.append(f"{way} not tried: it failed on this model's shapes ({exc})")
            continue
        if agree["way_rel"] > ADMIT_FACTOR * max(agree["library_rel"], floor):
            notes.append(f"{way} not tried: {agree['way_rel']:.1e} from the one-row product, more than "
                         f"{ADMIT_FACTOR:g}x the library's own {agree['library_rel']:.1e}")
            continue
        ways.append(way)
        measured[way] = {k: float(f"{v:.3g}") for k, v in agree.items()}
    return tuple(ways), measured, "; ".join(notes)


def _time_round(timer: Any, model: Any, ways: tuple[str, ...], sizes: list[int], rnd: int,
                times: dict[str, dict[int, list[float]]], failed: set[str], keep: bool) -> None:
    """One round: a forward of every size every way (the first way rotating), added to `times` when `keep`."""
    for i, n in enumerate(sizes):
        turn = (rnd + i) % len(ways)
        for way in ways[turn:] + ways[:turn]:
            if way in failed:
                continue
            reroute(model, (0,) + (WAYS.index(way),) * max(sizes))
            try:
                ms = timer.time(n)
            except (RuntimeError, NotImplementedError):
                if way == STOCK:
                    raise
                failed.add(way)  # a way that raised on this model (a shape or dtype the small check did not cover)
                timer.cache.truncate(timer.past)  # layers that ran before the failure wrote entries
                continue
            if keep:
                times[way][n].append(ms)


def _decide(times: dict[str, dict[int, list[float]]], failed: set[str]) -> tuple[dict, dict[int, str], dict]:
    """(each way's fastest time per size, the way chosen per size, the relative spread of its timings there)."""
    best = {way: {n: min(v) for n, v in per.items()} for way, per in times.items() if way not in failed}
    chosen = choose(best)
    return best, chosen, {n: relative_spread(times[way][n]) for n, way in chosen.items()}


def tune(runner: Any, context: list[int], sizes: tuple[int, ...] = TUNE_SIZES, repeats: int = 2,
         extra_rounds: int = MAX_EXTRA_ROUNDS) -> LinearPlan:
    """Time whole forwards of each size every admitted way (interleaved), keep and return the fastest per size;
    sizes whose chosen way's timings varied over kernels.STEADY_SPREAD get up to `extra_rounds` more rounds."""
    context, sized = timing_context(runner, context, sizes)
    sized = list(sized) or [1]
    model = runner.model
    ways, agree, note = admitted_ways(model)
    times: dict[str, dict[int, list[float]]] = {way: {n: [] for n in sized} for way in ways}
    failed: set[str] = set()
    with installed(model), ForwardTimer(runner, context) as timer:  # the routing the rounds switch between
        for rnd in range(repeats + 1):  # a warm-up round, then `repeats` kept ones
            _time_round(timer, model, ways, sized, rnd, times, failed, keep=rnd > 0)
        for rnd in range(repeats + 1, repeats + 1 + extra_rounds):
            shaky = [n for n, spread in _decide(times, failed)[2].items() if spread > kernels.STEADY_SPREAD]
            if not shaky:
                break
            _time_round(timer, model, ways, shaky, rnd, times, failed, keep=True)
        best, chosen, spreads = _decide(times, failed)
        set_plan(model, LinearPlan(chosen, max(sized), best, note=note, spread=max(spreads.values(), default=0.0),
                                   agreement={w: a for w, a in agree.items() if w not in failed}))
    return plan_of(model)


def check_kept(runner: Any, context: list[int], plan: LinearPlan, sizes: tuple[int, ...] = (1, 8)) -> str:
    """Why a kept plan no longer holds ("" when it does): forwards of `sizes` must take within STALE_RATIO of it."""
    context, sized = timing_context(runner, context, [n for n in sizes if n in plan.ways])
    if not sized:
        return ""
    with installed(runner.model), ForwardTimer(runner, context) as timer:
        reroute(runner.model, plan.routes())
        timer.time(sized[0])
        for n in sized:
            now, said = min(timer.time(n) for _ in range(2)), plan.ms[plan.ways[n]][n]
            if not said / STALE_RATIO <= now <= said * STALE_RATIO:
                return f"a forward of {n} tokens took {now:.1f} ms where the kept plan said {said:.1f} ms"
    return ""


def ensure_tuned(runner: Any, context: list[int]) -> LinearPlan | None:
    """Tune `runner`'s model once (CPU only), or take the plan kept by plan_cache.py when `check_kept` agrees."""
    if not needs_tuning(runner.model, runner.device):
        return plan_of(runner.model)
    with _LOCK:
        if needs_tuning(runner.model, runner.device):
            context = context or [0]
            kept, why = load_plan(runner.model)
            stale = check_kept(runner, context, kept) if kept is not None else ""
            if kept is not None and not stale:
                set_plan(runner.model, dataclasses.replace(kept, origin=f"loaded: {kept.cached}"))
            else:
                plan = tune(runner, context)
                where = save_plan(runner.model, plan)
                before = f" ({why or 'the kept plan no longer held: ' + stale})" if (why or stale) else ""
                set_plan(runner.model, dataclasses.replace(plan, origin=f"timed now{before}; {where}"))
    return plan_of(runner.model)
