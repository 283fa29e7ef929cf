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

Other CPUs and BLAS builds differ, so nothing is assumed: tuning.py times whole forwards every admitted way on this
machine and `set_plan` keeps the fastest way per row count (a `LinearPlan`, with how steady its timings were).

The model is left as it was found. A plan is kept beside the model (`plan_of`, a weak mapping), shared by every
engine and by the engine's plain decoding, so the speedup is measured against plain decoding at its own best. The
products are installed only while a call runs (`installed`, reference-counted per model: overlapping answers share
one installation, and the last to end, close or raise restores every layer exactly). A layer's own instance
`forward` is never overwritten: an accelerate hook keeps running around the timed product (its `_old_forward` is
swapped for the call and put back); any other per-instance wrapper stays in charge of its layer. Only plain
`nn.Linear` layers on a CPU are routed; GPUs and other layer kinds keep their own path.

Exactness: a way is routed only where tuning.py admitted it (`tuning.agreement`); docs/exactness.md gives the
measurements and the tests that hold greedy output to an untouched model's `generate` under mixed plans.
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

from . import machine

STOCK, TRANSPOSED, ONEDNN = "stock", "transposed", "onednn"
WAYS = (STOCK, TRANSPOSED, ONEDNN)  # a route is an index into this tuple
# a plan whose deciding timings varied more than this between rounds (the median's distance above the fastest,
# relative) is re-timed at those sizes (tuning.py) and never kept on disk if still so
STEADY_SPREAD = 0.25
PACK_ROOM = 2.0  # oneDNN's packed weights are made only where free memory holds them this many times over


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
    weights' memory once more, and are made only where free memory (`machine.free_memory()` unless given) holds them
    PACK_ROOM times over, so a large model on a small machine keeps its memory rather than run out of it."""
    need = sum(layer.weight.numel() * layer.weight.element_size() for layer in linear_layers(model))
    free = machine.free_memory() if free is None else free
    if free is None or free >= PACK_ROOM * need:
        return ""
    return (f"oneDNN's packed product not tried: its copies of the weights ({need / 2**30:.1f} GiB) need "
            f"{PACK_ROOM * need / 2**30:.1f} GiB free, {free / 2**30:.1f} GiB is")


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


PRODUCTS = {TRANSPOSED: transposed_linear, ONEDNN: onednn_linear}


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
        return PRODUCTS[WAYS[way]](x, weight, layer.bias, rows)
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


def reroute(model: Any, routes: tuple[int, ...]) -> None:
    """Change the routes of a model in use (tuning tries each way; a new plan takes over); no-op when unused."""
    with _ROUTING_LOCK:
        routing = _ROUTINGS.get(id(model))
        if routing is not None:
            routing.route(model, routes)


def uninstall(model: Any) -> None:
    """Forget `model`'s plan and its packed weights; layers in use go back to the library's product."""
    _PLANS.pop(model, None)
    reroute(model, ())
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
    reroute(model, plan.routes())


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
