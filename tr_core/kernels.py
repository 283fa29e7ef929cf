"""The matrix product behind a model's linear layers on a CPU, chosen per row count by timing this machine: the
library's, `transposed` (W @ x^T) or `onednn` (on weights packed once). The plan lives beside the model, shared with
plain decoding, and is installed only while a call runs, reference-counted (docs/cpu.md, docs/exactness.md)."""
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

from . import invariant, machine

STOCK, TRANSPOSED, ONEDNN = "stock", "transposed", "onednn"
WAYS = (STOCK, TRANSPOSED, ONEDNN)  # a route is an index into this tuple
# a plan whose deciding timings varied more than this (relative) is re-timed (tuning.py) and never kept on disk
STEADY_SPREAD = 0.25
PACK_ROOM = 2.0  # oneDNN's packed weights are made only where free memory holds them this many times over


@dataclass(frozen=True)
class LinearPlan:
    """`ways[n]`: the way n rows multiply; `ms[way][n]`: the fastest timed forward of n tokens that way. Untimed
    counts up to `limit` follow the nearest timed one (the lower on a tie), larger ones the way of `limit` rows."""

    ways: dict[int, str]
    limit: int
    ms: dict[str, dict[int, float]] = field(default_factory=dict)
    layers: int = 0
    note: str = ""  # why a way was not tried (no room for oneDNN's packed weights)
    cached: str = ""  # where and when it was timed, when loaded from plan_cache.py
    spread: float = 0.0  # the largest relative spread of the timings that chose a way (cost.relative_spread)
    origin: str = ""  # timed now and kept / timed now, not kept / loaded
    # per admitted way: its relative deviation from the one-row product, beside the library's (tuning.agreement)
    agreement: dict[str, dict[str, float]] = field(default_factory=dict)
    exact: invariant.Chunking | None = None  # exact mode: every layer row-invariant (invariant.py), no routes

    @property
    def steady(self) -> bool:
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
        if self.exact is not None:
            return f"exact mode: {self.exact.describe()}, attention in float64 ({self.layers} layers)"
        if not self.layers:
            return "linear layers: the library's own product (nothing to route on this model or device)"
        stock = self.ms.get(STOCK, {})
        pairs = ", ".join(f"N={n}: {stock[n]:.1f} -> {self.ms[self.ways[n]][n]:.1f} ms" for n in (1, 2)
                          if n in stock and n in self.ways)
        taken = "; ".join(f"{way} for {','.join(str(n) for n in sorted(self.ways) if self.ways[n] == way)}"
                          for way in WAYS if way in self.ways.values())
        steady = (f"timings steady within {self.spread:.0%}" if self.steady else
                  f"timings unsteady: varied {self.spread:.0%} between rounds")
        extra = "".join(f"; {text}" for text in (self.note, self.cached) if text)
        return f"linear layers by row count: {taken} ({self.layers} layers; {pairs}; {steady}){extra}"


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """F.linear as (W @ x^T)^T for x [..., d] of `rows` rows -> [..., out]. One row is padded to two (a one-column
    product is the slow matrix-vector path); the result is contiguous, the layout the next layer is fast for."""
    flat = x.reshape(rows, x.shape[-1])
    if rows == 1:
        flat = torch.cat((flat, flat))
    out = torch.mm(weight, flat.t()).t()[:rows].contiguous()
    if bias is not None:
        out += bias
    return out.view(*x.shape[:-1], weight.shape[0])


# id(weight) -> (weak ref, (data pointer, version) when packed, packed copy); re-packed if changed in place. Keyed by
# id, not a WeakIdKeyDictionary: this runs for every layer of every forward (1.7 us per lookup there, 0.3 us here).
_PACKS: dict[int, tuple[weakref.ref, tuple[int, int], torch.Tensor]] = {}


def packed_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` packed into oneDNN's layout (an opaque tensor), made once and kept while the weight is unchanged."""
    key = id(weight)
    held = _PACKS.get(key)
    stamp = (weight.data_ptr(), weight._version)
    if held is None or held[0]() is not weight or held[1] != stamp:

        def forget(ref: weakref.ref) -> None:  # the weight died: free its pack (unless its id was reused since)
            entry = _PACKS.get(key)
            if entry is not None and entry[0] is ref:
                _PACKS.pop(key, None)

        held = _PACKS[key] = (weakref.ref(weight, forget), stamp,
                              torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None))
    return held[2]


def is_packed(weight: torch.Tensor) -> bool:
    held = _PACKS.get(id(weight))
    return held is not None and held[0]() is weight


def no_room_for_packs(model: Any, free: int | None = None) -> str:
    """Why oneDNN's packed weights must not be made ("" when they may): free memory must hold them PACK_ROOM times."""
    need = sum(layer.weight.numel() * layer.weight.element_size() for layer in linear_layers(model))
    free = machine.free_memory() if free is None else free
    if free is None or free >= PACK_ROOM * need:
        return ""
    return (f"oneDNN's packed product not tried: its copies of the weights ({need / 2**30:.1f} GiB) need "
            f"{PACK_ROOM * need / 2**30:.1f} GiB free, {free / 2**30:.1f} GiB is")


def drop_packs(model: Any) -> None:
    for layer in linear_layers(model):
        if is_packed(layer.weight):
            _PACKS.pop(id(layer.weight), None)


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> torch.Tensor:
    """F.linear through oneDNN's packed weight, x [..., d] -> [..., out] (F.linear where autograd needs a gradient)."""
    if torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad):
        return F.linear(x, weight, bias)
    flat = x.reshape(rows, x.shape[-1])
    out = torch.ops.mkldnn._linear_pointwise(flat, packed_weight(weight), bias, "none", [], "")
    return out.view(*x.shape[:-1], weight.shape[0])


PRODUCTS = {TRANSPOSED: transposed_linear, ONEDNN: onednn_linear}


def available_ways(dtype: torch.dtype = torch.float32) -> tuple[str, ...]:
    """The ways this torch build can multiply `dtype` weights on a CPU: stock, then each way that runs and agrees
    with F.linear (oneDNN has no float16 product on most CPUs)."""
    g = torch.Generator().manual_seed(0)
    w, b, x = (torch.randn(*s, generator=g).to(dtype) for s in ((6, 5), (6,), (1, 3, 5)))
    rtol, atol = (1e-4, 1e-5) if dtype == torch.float32 else (2e-2, 2e-2)
    ways = [STOCK]
    for way, product in ((TRANSPOSED, transposed_linear), (ONEDNN, onednn_linear)):  # read now: tests replace them
        try:
            if torch.allclose(product(x, w, b, 3).float(), F.linear(x, w, b).float(), rtol=rtol, atol=atol):
                ways.append(way)
        except (AttributeError, RuntimeError, NotImplementedError, TypeError):
            pass
    return tuple(ways)


def _routed_forward(layer: torch.nn.Linear, routes: tuple[int, ...], inner: Any, x: torch.Tensor) -> torch.Tensor:
    """x [..., d]: m rows go the way routes[m] names (CPU, weight's dtype); the rest to `inner` (None: F.linear)."""
    d = x.shape[-1]
    rows = x.numel() // d if d else 0
    way = routes[rows] if rows < len(routes) else routes[-1]  # past the largest timed count: its way
    weight = layer.weight
    if way and rows and x.device.type == "cpu" and weight.device.type == "cpu" and x.dtype == weight.dtype:
        return PRODUCTS[WAYS[way]](x, weight, layer.bias, rows)
    return F.linear(x, weight, layer.bias) if inner is None else inner(x)


def onednn_chunk(chunk: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """chunk [n, d] @ weight^T through oneDNN's packed weight (exact mode's product where it is row-invariant)."""
    return onednn_linear(chunk, weight, None, chunk.shape[0])


EXACT_PRODUCTS = {**invariant.PRODUCTS, invariant.ONEDNN: onednn_chunk}


def _exact_forward(layer: torch.nn.Module, chunking: invariant.Chunking, x: torch.Tensor) -> torch.Tensor:
    """x [..., d] through `layer` (nn.Linear, or transformers' Conv1D with its weight stored [in, out]) in
    row-invariant chunks."""
    weight = linear_weight(layer)
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not rows or invariant.is_relaxed():  # a prompt's forward: the library's product (invariant.relaxed)
        return F.linear(x, weight, layer.bias)
    return invariant.chunked_linear(x, weight, layer.bias, rows, chunking, EXACT_PRODUCTS[chunking.product])


def linear_weight(layer: torch.nn.Module) -> torch.Tensor:
    """The layer's weight as F.linear takes it, [out, in] (a Conv1D stores it [in, out]: its transposed view)."""
    return layer.weight if isinstance(layer, torch.nn.Linear) else layer.weight.t()


def exact_layers(model: Any) -> list[torch.nn.Module]:
    """The layers exact mode routes: the linear layers, and GPT-2's Conv1D layers."""
    return linear_layers(model) + [m for m in model.modules() if type(m).__name__ == "Conv1D" and m.weight.dim() == 2]


def exact_plan(model: Any) -> LinearPlan | None:
    """A plan making every product of `model` row-invariant, probed on its layer shapes (None: no chunking is)."""
    layers = exact_layers(model)
    weights = [linear_weight(m) for m in layers]
    products = dict(invariant.PRODUCTS)
    if all(w.device.type == "cpu" and w.is_contiguous() for w in weights) and not no_room_for_packs(model):
        products[invariant.ONEDNN] = onednn_chunk  # packed once per weight (a Conv1D's transposed view is not)
    chunking = invariant.choose(weights, products)
    if chunking is None:
        return None
    return LinearPlan(ways={}, limit=0, layers=len(layers), origin="exact", exact=chunking)


def use_exact(model: Any, want: bool) -> bool:
    """Give `model` the exact plan (`want`) or take it away (the next call tunes again); False when no chunking is
    row-invariant on this device (the model then keeps its products, and its answers may round apart)."""
    plan = plan_of(model)
    if not want:
        if plan is not None and plan.exact is not None:
            uninstall(model)
        return False
    if plan is None or plan.exact is None:
        plan = exact_plan(model)
        if plan is None:
            return False
        set_plan(model, plan)
    return True


def weight_dtype(model: Any) -> torch.dtype:
    """The dtype of `model`'s routable linear layers' weights (float32 when it has none)."""
    layers = linear_layers(model)
    return layers[0].weight.dtype if layers else torch.float32


def linear_layers(model: Any) -> list[torch.nn.Linear]:
    """The layers a plan may route: exactly `nn.Linear` (not subclasses such as quantized layers), 2-D weights."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dim() == 2]


_ABSENT = object()  # a slot the layer's own __dict__ did not hold before routing


class _Routing:
    """One model's routing: its users and what each routed slot held before (restored when the last user leaves)."""

    def __init__(self) -> None:
        self.users = 0
        self.slots: list[tuple[torch.nn.Linear, str, Any, Any]] = []  # (layer, slot, what it held, what we put)
        self.attention = contextlib.ExitStack()  # exact mode's attention, while installed

    def route(self, model: Any, routes: tuple[int, ...], exact: invariant.Chunking | None = None) -> None:
        """Send each linear layer's rows by `routes` (() or all zero: the library's product); with `exact`, every
        product and the attention row-invariant instead."""
        self.restore()
        if exact is not None:
            self.attention.enter_context(invariant.attention_installed(model))
        elif not any(routes):
            return
        routes = tuple(routes)
        for layer in exact_layers(model) if exact is not None else linear_layers(model):
            own = layer.__dict__
            if "forward" not in own:  # the class's forward: ours goes in front of it, on the instance
                slot, held, inner = "forward", _ABSENT, None
            elif "_old_forward" in own and "_hf_hook" in own:  # accelerate's hook: it keeps running, around ours
                slot, held = "_old_forward", own["_old_forward"]
                inner = held
            else:  # another per-instance wrapper we cannot see inside: left in charge of its layer
                continue
            own[slot] = (functools.partial(_exact_forward, layer, exact) if exact is not None else
                         functools.partial(_routed_forward, layer, routes, inner))
            self.slots.append((layer, slot, held, own[slot]))

    def restore(self) -> None:
        """Put back what every routed slot held; a slot someone replaced since is theirs now and stays."""
        for layer, slot, held, ours in self.slots:
            if layer.__dict__.get(slot) is ours:
                if held is _ABSENT:
                    del layer.__dict__[slot]
                else:
                    layer.__dict__[slot] = held
        self.slots = []
        self.attention.close()


# id(model) -> its routing while in use (a model in use is alive; the entry goes with its last user)
_ROUTINGS: dict[int, _Routing] = {}
_ROUTING_LOCK = threading.RLock()
# model -> its plan (a weak key: the plan goes with the model), shared by every engine of it
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


@contextlib.contextmanager
def installed(model: Any) -> Iterator[None]:
    """`model`'s plan installed on its layers for the block, reference-counted: the last user to leave gives every
    layer back exactly what it had (its forward, any wrapper), also on raise."""
    with _ROUTING_LOCK:
        plan = plan_of(model)
        routing = _ROUTINGS.get(id(model))
        if routing is None:
            routing = _ROUTINGS[id(model)] = _Routing()
            routing.route(model, plan.routes() if plan is not None else (), plan.exact if plan is not None else None)
        routing.users += 1
    exact = plan is not None and plan.exact is not None
    try:
        with invariant.wide_storage() if exact else contextlib.nullcontext():  # this thread's new caches: float64
            yield
    finally:
        with _ROUTING_LOCK:
            routing.users -= 1
            if routing.users <= 0:
                routing.restore()
                _ROUTINGS.pop(id(model), None)


def is_routed(model: Any) -> bool:
    """True while some call has `model`'s timed products installed on at least one layer."""
    routing = _ROUTINGS.get(id(model))
    return routing is not None and bool(routing.slots)


def reroute(model: Any, routes: tuple[int, ...], exact: invariant.Chunking | None = None) -> None:
    """Change the routes of a model in use (tuning tries each way; a new plan takes over); no-op when unused."""
    with _ROUTING_LOCK:
        routing = _ROUTINGS.get(id(model))
        if routing is not None:
            routing.route(model, routes, exact)


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
    if ONEDNN not in plan.ways.values() and (plan.exact is None or plan.exact.product != invariant.ONEDNN):
        drop_packs(model)
    layers = exact_layers(model) if plan.exact is not None else linear_layers(model)
    _PLANS[model] = dataclasses.replace(plan, ways=dict(plan.ways), layers=len(layers))
    reroute(model, plan.routes(), plan.exact)


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
    """n -> ms of a whole forward of n tokens as the plan runs it (for cost.py's probe); empty if untuned/unsteady."""
    plan = plan_of(model)
    if plan is None or not plan.steady:
        return {}
    return {n: plan.ms[way][n] for n, way in plan.ways.items() if n in plan.ms.get(way, {})}


def needs_tuning(model: Any, device: torch.device) -> bool:
    """True when `model` runs on a CPU, has linear layers to route and was never tuned."""
    return device.type == "cpu" and plan_of(model) is None and bool(linear_layers(model))
