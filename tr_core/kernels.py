"""The matrix product behind a model's linear layers on a CPU, chosen per row count by timing this machine.

A decoding step multiplies a handful of rows (1 for plain decoding, N for a draft tree of N tokens) by every weight
matrix of the model. `F.linear` hands that to the BLAS as x @ W^T, and for a few rows the BLAS may take a slow path:
on a 2-core AMD EPYC with torch 2.13's MKL, two or three rows cost 2-3x one row (the weights are read once per
row), so the forward of a 2-token tree cost 1.7x that of one token and a draft token had to be accepted 70% of the
time just to break even. Two other ways to compute the same product are tried:

- `transposed`: W @ x^T, the weight matrix streamed once for all rows, a one-row input padded to two (a
  one-column product is the matrix-vector path). It cut the embedded model's forward from 62 to 34 ms for one
  token and from 101 to 38 ms for two, with 2 threads.
- `onednn`: oneDNN's matrix product (`torch.ops.mkldnn._linear_pointwise`, where the torch build has it) on a copy
  of each weight packed once into oneDNN's own layout (`torch.ops.mkldnn._reorder_linear_weight`), the path torch's
  CPU compiler takes for frozen weights. Unpacked, oneDNN reorders the weight on every call: on the same CPU with 1
  thread a 4-token forward then cost 88-94 ms against 57-61 ms packed, 1.1-1.2x a 1-token forward instead of
  1.4-1.9x (README: "The matrix product on a CPU"). The packed copies cost the linear weights' memory once more; they
  are made when first used and dropped when the plan routes no row count this way (`drop_packs`); where free memory
  would not hold them twice over, this way is not tried (`no_room_for_packs`).

Other CPUs and BLAS builds differ, so nothing is assumed: `tune` times whole forwards every admitted way at each
row count of TUNE_SIZES on this machine, re-times sizes whose rounds disagreed (bounded), records how steady the
deciding timings were (`LinearPlan.spread`), and `set_plan` keeps the fastest way per row count.

The model is left as it was found. A plan is kept beside the model (`plan_of`, a weak mapping), shared by every
engine and by the engine's plain decoding, so the speedup is measured against plain decoding at its own best. The
products are installed only while a call runs (`installed`, reference-counted per model: overlapping answers share
one installation, and the last to end, close or raise restores every layer exactly). A layer's own instance
`forward` is never overwritten: an accelerate hook keeps running around the timed product (its `_old_forward` is
swapped for the call and put back); any other per-instance wrapper stays in charge of its layer. Only plain
`nn.Linear` layers on a CPU are routed; GPUs and other layer kinds keep their own path.

Exactness. No way, the library's own included, gives a row of an n-row product the bits of that row multiplied
alone (the one-row product plain decoding and transformers' `generate` compute): on this machine's MKL the library's
n-row product is already up to 4e-6 away from it. So bit-equality cannot be the rule; a way is admitted only where
it adds no more than ADMIT_FACTOR times the rounding the library's own n-row product carries (`agreement`, measured
on the model's own layer shapes). docs/exactness.md gives the measurements and the tests that hold greedy output to
an untouched model's `generate` under mixed plans.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

STOCK, TRANSPOSED, ONEDNN = "stock", "transposed", "onednn"
WAYS = (STOCK, TRANSPOSED, ONEDNN)  # a route is an index into this tuple
# row counts timed; others follow the nearest one timed, and more than the largest (long prompts) follow the largest
TUNE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
# a plan whose deciding timings varied more than this between rounds (the median's distance above the fastest,
# relative) is re-timed at those sizes, at most MAX_EXTRA_ROUNDS more rounds, and never kept on disk if still so
STEADY_SPREAD = 0.25
MAX_EXTRA_ROUNDS = 2
STALE_RATIO = 1.5  # a kept plan whose forwards now take more than this factor more or less time is timed again
# A way is admitted only where its largest deviation from the library's one-row product (what plain decoding and
# transformers' generate compute) is at most this many times the library's own n-row product's deviation from it
# (what any tree forward already carries): docs/exactness.md has the measurements behind it.
ADMIT_FACTOR = 4.0
AGREE_ROWS = (1, 2, 3, 4, 8, 16)  # row counts the agreement is measured at
PACK_ROOM = 2.0  # oneDNN's packed weights are made only where free memory holds them this many times over
_LOCK = threading.Lock()  # one tuning at a time in a process (the app's sessions share models)


@dataclass(frozen=True)
class LinearPlan:
    """The way each timed row count multiplies, and the whole-forward times that chose it (plain data).

    `ways[n]`: the way for n rows; `ms[way][n]`: the fastest of the timed forwards of n tree tokens that way. Row
    counts up to `limit` that were not timed follow the nearest timed count (the lower on a tie); larger ones (a
    long prompt's prefill) follow the way of `limit` rows.
    """

    ways: dict[int, str]
    limit: int
    ms: dict[str, dict[int, float]] = field(default_factory=dict)
    layers: int = 0
    note: str = ""  # why a way was not tried (no room for oneDNN's packed weights), for the summary
    cached: str = ""  # where and when it was timed, when taken from the plan cache (plan_cache.py)
    spread: float = 0.0  # the largest relative spread of the timings that chose a way (cost.relative_spread)
    origin: str = ""  # what this process did to get it: timed now and kept / timed now, not kept / loaded
    # per admitted way: its largest deviation from the library's one-row product, relative ("way_rel") and next to
    # the library's own n-row product's ("library_rel"), measured on the model's layers (`agreement`)
    agreement: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def steady(self) -> bool:
        """True when the timings that chose the ways agreed between rounds (spread at most STEADY_SPREAD)."""
        return self.spread <= STEADY_SPREAD

    def routes(self) -> tuple[int, ...]:
        """routes()[m]: the index in WAYS of the way m rows take, for m in 0..limit."""
        timed = sorted(self.ways)
        if not timed:
            return ()
        return (0,) + tuple(WAYS.index(self.ways[min(timed, key=lambda t: (abs(t - m), t))])
                            for m in range(1, self.limit + 1))

    def summary(self) -> str:
        """One line: the row counts each way took and the forward times at one and two tokens."""
        if not self.layers:
            return "linear layers: the library's own product (nothing to route on this model or device)"
        stock = self.ms.get(STOCK, {})
        pairs = ", ".join(f"N={n}: {stock[n]:.1f} -> {self.ms[self.ways[n]][n]:.1f} ms" for n in (1, 2)
                          if n in stock and n in self.ways)
        taken = "; ".join(f"{way} for {','.join(str(n) for n in sorted(self.ways) if self.ways[n] == way)}"
                          for way in WAYS if way in self.ways.values())
        note = f"; {self.note}" if self.note else ""
        cached = f"; {self.cached}" if self.cached else ""
        steady = (f"timings steady within {self.spread:.0%}" if self.steady else
                  f"timings unsteady: varied {self.spread:.0%} between rounds")
        return f"linear layers by row count: {taken} ({self.layers} layers; {pairs}; {steady}){note}{cached}"


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """F.linear(x, weight, bias) as (W @ x^T)^T: the weight streamed once for all `rows`; one row is padded to two
    (a one-column product is a matrix-vector product, the slow path this avoids). The result is contiguous, so
    the next layer's input keeps the row-major layout this product is fast for."""
    d = x.shape[-1]
    flat = x.reshape(rows, d)
    if rows == 1:
        flat = torch.cat((flat, flat))
    out = torch.mm(weight, flat.t()).t()[:rows].contiguous()
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


# id(weight) -> (a weak reference to the weight, its data pointer and version when packed, the oneDNN-packed copy):
# one pack per weight tensor, dropped with the tensor (a deep-copied model packs its own weights), made again if the
# weight is changed in place. Keyed by id with the weight's own weak reference checked, not a WeakIdKeyDictionary:
# this runs for every layer of every forward, and that dictionary's lookup cost 1.7 us against 0.3 us here.
_PACKS: dict[int, tuple[weakref.ref, tuple[int, int], torch.Tensor]] = {}


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` packed into oneDNN's layout (an opaque tensor), made once and kept while the weight is unchanged."""
    held = _PACKS.get(id(weight))
    stamp = (weight.data_ptr(), weight._version)
    if held is None or held[0]() is not weight or held[1] != stamp:
        held = _pack(weight, stamp)
    return held[2]


def _pack(weight: torch.Tensor, stamp: tuple[int, int]) -> tuple[weakref.ref, tuple[int, int], torch.Tensor]:
    key = id(weight)

    def forget(ref: weakref.ref) -> None:  # the weight died: free its pack (unless its id was reused since)
        entry = _PACKS.get(key)
        if entry is not None and entry[0] is ref:
            _PACKS.pop(key, None)

    held = _PACKS[key] = (weakref.ref(weight, forget), stamp,
                          torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
    return held


def is_packed(weight: torch.Tensor) -> bool:
    """True when a packed copy of `weight` is held."""
    held = _PACKS.get(id(weight))
    return held is not None and held[0]() is weight


def no_room_for_packs(model: Any, free: int | None = None) -> str:
    """Why oneDNN's packed copies of `model`'s linear weights must not be made ("" when they may): they take the
    weights' memory once more, and are made only where free memory (`free_memory()` unless given) holds them
    PACK_ROOM times over, so a large model on a small machine keeps its memory rather than run out of it."""
    need = sum(layer.weight.numel() * layer.weight.element_size() for layer in linear_layers(model))
    free = free_memory() if free is None else free
    if free is None or free >= PACK_ROOM * need:
        return ""
    return (f"oneDNN's packed product not tried: its copies of the weights ({need / 2**30:.1f} GiB) need "
            f"{PACK_ROOM * need / 2**30:.1f} GiB free, {free / 2**30:.1f} GiB is")


def free_memory() -> int | None:
    """Bytes this process may still take: the smaller of the system's available memory and the room left under its
    control group's limit (a container's); None where neither can be read (not Linux)."""
    found = []
    meminfo = _read_text("/proc/meminfo")
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:") and line.split()[1].isdigit():
            found.append(int(line.split()[1]) * 1024)
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2, then v1
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_text(limit).strip(), _read_text(usage).strip()
        if cap.isdigit() and used.isdigit():  # "max": no limit
            found.append(int(cap) - int(used))
    return min(found) if found else None


def _read_text(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, ValueError):
        return ""


def drop_packs(model: Any) -> None:
    """Free the packed copies of `model`'s linear weights (the plan no longer routes any row count to oneDNN)."""
    for layer in linear_layers(model):
        if is_packed(layer.weight):
            _PACKS.pop(id(layer.weight), None)


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """F.linear(x, weight, bias) through oneDNN's matrix product on the packed weight (what torch's own CPU compiler
    emits for frozen weights). Where autograd needs a gradient, which the packed product has not, the library's."""
    if torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed_weight(weight), bias, "none", [], "")
    return out.view(*x.shape[:-1], weight.shape[0])


_PRODUCTS = {TRANSPOSED: transposed_linear, ONEDNN: onednn_linear}


def available_ways(dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The ways this torch build can multiply weights of `dtype` on a CPU: the library's product, then each other way
    only where it runs and agrees with F.linear (oneDNN has no float16 product on most CPUs, for one)."""
    g = torch.Generator().manual_seed(0)
    w, b, x = (torch.randn(*s, generator=g).to(dtype) for s in ((6, 5), (6,), (1, 3, 5)))
    rtol, atol = (1e-4, 1e-5) if dtype == torch.float32 else (2e-2, 2e-2)
    ways = [STOCK]
    for way, product in ((TRANSPOSED, transposed_linear), (ONEDNN, onednn_linear)):  # read now: tests replace them
        try:
            got = product(x, w, b, 3)
            if torch.allclose(got.float(), F.linear(x, w, b).float(), rtol=rtol, atol=atol):
                ways.append(way)
        except (AttributeError, RuntimeError, NotImplementedError, TypeError):
            pass
    return tuple(ways)


def _routed_forward(layer: torch.nn.Linear, routes: tuple[int, ...], inner: Any, x: torch.Tensor) -> torch.Tensor:
    """The forward a routed layer runs while installed: m rows go the way routes[m] names (CPU tensors of the
    weight's dtype only); everything else goes to `inner`, the forward the layer had (None: the library's)."""
    d = x.shape[-1]
    rows = x.numel() // d if d else 0
    way = routes[rows] if rows < len(routes) else routes[-1]  # past the largest timed count: its way
    weight = layer.weight
    if way and rows and x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype == weight.dtype:
        return _PRODUCTS[WAYS[way]](x, weight, layer.bias, rows)
    return F.linear(x, weight, layer.bias) if inner is None else inner(x)


def weight_dtype(model: Any) -> torch.dtype:
    """The dtype of `model`'s routable linear layers' weights (float32 when it has none)."""
    layers = linear_layers(model)
    return layers[0].weight.dtype if layers else torch.float32


def linear_layers(model: Any) -> list[torch.nn.Linear]:
    """The layers a plan may route: exactly `nn.Linear` (not subclasses such as quantized layers), 2-D weights."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dim() == 2]


_ABSENT = object()  # a slot the layer's own __dict__ did not hold before routing


class _Routing:
    """One model's layers as routed for the calls running now: who uses the routing, and what each routed slot held
    before (restored exactly when the last user leaves). Kept beside the model (`_ROUTINGS`), never on it."""

    def __init__(self) -> None:
        self.users = 0
        self.routes: tuple[int, ...] = ()
        self.slots: list[tuple[torch.nn.Linear, str, Any, Any]] = []  # (layer, slot, what it held, what we put)
        self.wrapped = 0  # layers left to a forward wrapper of someone else's that has no accelerate-style seam

    def route(self, model: Any, routes: tuple[int, ...]) -> int:
        """Send each linear layer's rows by `routes` (() or all zero: the library's product); layers routed."""
        self.restore()
        self.routes = tuple(routes)
        if not any(self.routes):
            return 0
        for layer in linear_layers(model):
            own = layer.__dict__
            if "forward" not in own:  # the class's forward: ours goes in front of it, on the instance
                slot, held, inner = "forward", _ABSENT, None
            elif "_old_forward" in own and "_hf_hook" in own:  # accelerate's hook: it keeps running, around ours
                slot, held = "_old_forward", own["_old_forward"]
                inner = held
            else:  # another per-instance wrapper we cannot see inside: left in charge of its layer
                self.wrapped += 1
                continue
            ours = functools.partial(_routed_forward, layer, self.routes, inner)
            own[slot] = ours
            self.slots.append((layer, slot, held, ours))
        return len(self.slots)

    def restore(self) -> None:
        """Put back what every routed slot held; a slot someone replaced since is theirs now and stays."""
        for layer, slot, held, ours in self.slots:
            if layer.__dict__.get(slot) is ours:
                if held is _ABSENT:
                    del layer.__dict__[slot]
                else:
                    layer.__dict__[slot] = held
        self.slots, self.wrapped = [], 0


# id(model) -> its routing, while some call uses it. By id, not a weak key: a model in use is alive, and the entry
# goes with its last user.
_ROUTINGS: dict[int, _Routing] = {}
_ROUTING_LOCK = threading.RLock()
# model -> its plan: kept beside the model (a weak key: the plan goes with the model), shared by every engine of it
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def acquire(model: Any) -> None:
    """One more user of `model`'s timed products: the first installs its plan (if it has one) on its layers."""
    with _ROUTING_LOCK:
        routing = _ROUTINGS.get(id(model))
        if routing is None:
            routing = _ROUTINGS[id(model)] = _Routing()
            plan = plan_of(model)
            routing.route(model, plan.routes() if plan is not None else ())
        routing.users += 1


def release(model: Any) -> None:
    """One user fewer: the last gives every layer back exactly what it had (its forward, any wrapper)."""
    with _ROUTING_LOCK:
        routing = _ROUTINGS.get(id(model))
        if routing is None:
            return
        routing.users -= 1
        if routing.users <= 0:
            routing.restore()
            del _ROUTINGS[id(model)]


@contextlib.contextmanager
def installed(model: Any) -> Iterator[None]:
    """`model`'s plan installed for the duration of the block (reference-counted: nested and overlapping blocks on
    one model share it; the last to leave removes it, also when the block raises)."""
    acquire(model)
    try:
        yield
    finally:
        release(model)


def is_routed(model: Any) -> bool:
    """True while some call has `model`'s timed products installed on at least one layer."""
    routing = _ROUTINGS.get(id(model))
    return routing is not None and bool(routing.slots)


def _reroute(model: Any, routes: tuple[int, ...]) -> None:
    """Change the routes of a model in use (tuning tries each way; a new plan takes over); no-op when unused."""
    with _ROUTING_LOCK:
        routing = _ROUTINGS.get(id(model))
        if routing is not None:
            routing.route(model, routes)


def uninstall(model: Any) -> None:
    """Forget `model`'s plan and its packed weights; layers in use go back to the library's product."""
    _PLANS.pop(model, None)
    _reroute(model, ())
    drop_packs(model)


def plan_of(model: Any) -> LinearPlan | None:
    """The plan timed for `model` (kept beside it), or None when it was never tuned."""
    try:
        return _PLANS.get(model)
    except TypeError:  # not weakly referenceable: never tuned
        return None


def set_plan(model: Any, plan: LinearPlan) -> None:
    """Keep `plan` for `model` (one plan per model, shared by every engine), routing its layers now if in use."""
    if ONEDNN not in plan.ways.values():
        drop_packs(model)
    _PLANS[model] = dataclasses.replace(plan, ways=dict(plan.ways), layers=len(linear_layers(model)))
    _reroute(model, plan.routes())


def describe_plan(model: Any) -> dict[str, Any]:
    """JSON-ready: how `model`'s linear layers multiply (the plan's ways and timings, or the library's product)."""
    plan = plan_of(model)
    if plan is None:
        return {"summary": "linear layers: the library's own product (not tuned)", "ways": {}}
    return {"summary": plan.summary(), "ways": {str(n): way for n, way in sorted(plan.ways.items())},
            "layers": plan.layers, "note": plan.note, "cached": plan.cached, "origin": plan.origin,
            "spread": round(plan.spread, 4), "steady": plan.steady, "agreement": plan.agreement,
            "ms": {way: {str(n): round(v, 3) for n, v in per.items()} for way, per in plan.ms.items()}}


def timed_costs(model: Any) -> dict[int, float]:
    """Milliseconds of a whole forward of n tokens, for every row count n the plan timed, the way the plan runs it
    (its tuning's fastest round); empty when `model` was never tuned or its timings were unsteady. The cost-sized
    trees' start-up probe takes these instead of timing the same forwards again."""
    plan = plan_of(model)
    if plan is None or not plan.steady:
        return {}
    return {n: plan.ms[way][n] for n, way in plan.ways.items() if n in plan.ms.get(way, {})}


def needs_tuning(model: Any, device: torch.device) -> bool:
    """True when `model` runs on a CPU, has linear layers to route and was never tuned."""
    return device.type == "cpu" and plan_of(model) is None and bool(linear_layers(model))


def choose(ms: dict[str, dict[int, float]]) -> dict[int, str]:
    """The fastest way for each row count timed every way (the library's product on a tie)."""
    sizes = set.intersection(*(set(per) for per in ms.values())) if ms else set()
    return {n: min((way for way in WAYS if way in ms), key=lambda way: (ms[way][n], way != STOCK))
            for n in sorted(sizes)}


def _distinct_layers(model: Any) -> list[torch.nn.Linear]:
    """One linear layer of each (in, out, bias) shape of `model`."""
    seen: dict[tuple[int, int, bool], torch.nn.Linear] = {}
    for layer in linear_layers(model):
        seen.setdefault((layer.in_features, layer.out_features, layer.bias is not None), layer)
    return list(seen.values())


@torch.no_grad()
def agreement(model: Any, way: str, rows: tuple[int, ...] = AGREE_ROWS, seed: int = 0) -> dict[str, float]:
    """How far `way`'s product of n rows is from the library's product of each row alone (plain decoding's), on one
    layer of each shape of `model` with random inputs [n, in]; beside it, how far the library's own n-row product
    is. Largest absolute ("way_abs", "library_abs") and relative to the output's largest value ("way_rel",
    "library_rel"); "bit_equal": 1.0 when the way gave the one-row bits at every row count."""
    g = torch.Generator().manual_seed(seed)
    product = _PRODUCTS.get(way, lambda x, w, b, n: F.linear(x, w, b))
    worst = {"way_abs": 0.0, "way_rel": 0.0, "library_abs": 0.0, "library_rel": 0.0, "bit_equal": 1.0}
    for layer in _distinct_layers(model):
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
    """(ways to time, each admitted way's `agreement`, why any was left out) for `model` on this machine: those that
    run in its dtype, that add no more rounding than a tree forward already carries (ADMIT_FACTOR) and, for oneDNN,
    whose packed copies fit in memory."""
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
        turn = (rnd + i) % len(ways)  # rotate which way goes first
        for way in ways[turn:] + ways[:turn]:
            if way in failed:
                continue
            _reroute(model, (0,) + (WAYS.index(way),) * max(sizes))
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


def _deciding_spread(times: dict[str, dict[int, list[float]]], chosen: dict[int, str]) -> dict[int, float]:
    """Per size: the relative spread of the chosen way's timings there."""
    from .cost import relative_spread

    return {n: relative_spread(times[way][n]) for n, way in chosen.items()}


def tune(runner: Any, context: list[int], sizes: tuple[int, ...] = TUNE_SIZES, repeats: int = 2,
         extra_rounds: int = MAX_EXTRA_ROUNDS) -> LinearPlan:
    """Time whole forwards of each size every admitted way on this machine (interleaved; `repeats` rounds after one
    warm-up round, and up to `extra_rounds` more at sizes whose deciding timings were unsteady), keep the fastest
    way per size for `model` and return the plan. 12-15 s with 2 threads on a 2-core CPU for the embedded model."""
    from .cost import ForwardTimer, timing_context

    context, sized = timing_context(runner, context, sizes)
    sized = list(sized) or [1]
    model = runner.model
    ways, agree, note = admitted_ways(model)
    times: dict[str, dict[int, list[float]]] = {way: {n: [] for n in sized} for way in ways}
    failed: set[str] = set()
    with installed(model), ForwardTimer(runner, context) as timer:  # the routing the rounds switch between
        for rnd in range(repeats + 1):
            _time_round(timer, model, ways, sized, rnd, times, failed, keep=rnd > 0)
        for rnd in range(extra_rounds):
            best = {way: {n: min(v) for n, v in per.items()} for way, per in times.items() if way not in failed}
            shaky = [n for n, spread in _deciding_spread(times, choose(best)).items() if spread > STEADY_SPREAD]
            if not shaky:
                break
            _time_round(timer, model, ways, shaky, repeats + 1 + rnd, times, failed, keep=True)
        best = {way: {n: min(v) for n, v in per.items()} for way, per in times.items() if way not in failed}
        chosen = choose(best)
        spread = max(_deciding_spread(times, chosen).values(), default=0.0)
        set_plan(model, LinearPlan(chosen, max(sized), best, note=note, spread=spread,
                                   agreement={w: a for w, a in agree.items() if w not in failed}))
    return plan_of(model)


def check_kept(runner: Any, context: list[int], plan: LinearPlan, sizes: tuple[int, ...] = (1, 8)) -> str:
    """Why a plan kept from an earlier process no longer holds here ("" when it does): forwards of `sizes` tokens
    timed now (the fastest of 2, after a warm-up), the plan's way, must take within STALE_RATIO of what it says."""
    from .cost import ForwardTimer, timing_context

    context, sized = timing_context(runner, context, [n for n in sizes if n in plan.ways])
    if not sized:
        return ""
    with installed(runner.model), ForwardTimer(runner, context) as timer:
        _reroute(runner.model, plan.routes())
        timer.time(sized[0])
        for n in sized:
            now, said = min(timer.time(n) for _ in range(2)), plan.ms[plan.ways[n]][n]
            if not said / STALE_RATIO <= now <= said * STALE_RATIO:
                return f"a forward of {n} tokens took {now:.1f} ms where the kept plan said {said:.1f} ms"
    return ""


def ensure_tuned(runner: Any, context: list[int]) -> LinearPlan | None:
    """Tune `runner`'s model once (CPU only; later calls and other engines of the same model reuse the plan), or take
    the plan this machine timed for the same shapes in an earlier process (plan_cache.py), when a quick check of its
    timings still agrees. The plan's `origin` says which happened."""
    if not needs_tuning(runner.model, runner.device):
        return plan_of(runner.model)
    from .plan_cache import load_plan, save_plan

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
