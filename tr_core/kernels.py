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

Other CPUs and BLAS builds differ, so nothing is assumed: `tune` times whole forwards every available way at each
row count of TUNE_SIZES on this machine, and `set_plan` routes each row count to the fastest way.

Every way computes the same products; only the order of the floating-point sums may differ, as it already does
between a one-token forward and a tree forward. A model keeps one plan (`plan_of`), shared by every engine and by
plain decoding, so the speedup is measured against plain decoding at its own best. Only plain `nn.Linear` layers
on a CPU are routed; GPUs and other layer kinds keep their own path.
"""
from __future__ import annotations

import threading
import types
import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

STOCK, TRANSPOSED, ONEDNN = "stock", "transposed", "onednn"
WAYS = (STOCK, TRANSPOSED, ONEDNN)  # a route is an index into this tuple
# row counts timed; others follow the nearest one timed, and more than the largest (long prompts) follow the largest
TUNE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
_ATTR = "_tr_linear_plan"  # where a model keeps its plan
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
        return f"linear layers by row count: {taken} ({self.layers} layers; {pairs}){note}{cached}"


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


def _routed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A linear layer's forward that sends m rows the way self._tr_routes[m] names (CPU tensors of the weight's
    dtype only). Bound to the layer as a method, so a deep copy of the model routes its own weights."""
    routes, d = self._tr_routes, x.shape[-1]
    rows = x.numel() // d if d else 0
    way = routes[rows] if rows < len(routes) else routes[-1]  # past the largest timed count: its way
    if way and rows and x.device.type == "cpu" and x.dtype == self.weight.dtype:
        return _PRODUCTS[WAYS[way]](x, self.weight, self.bias, rows)
    return F.linear(x, self.weight, self.bias)


def weight_dtype(model: Any) -> torch.dtype:
    """The dtype of `model`'s routable linear layers' weights (float32 when it has none)."""
    layers = linear_layers(model)
    return layers[0].weight.dtype if layers else torch.float32


def linear_layers(model: Any) -> list[torch.nn.Linear]:
    """The layers a plan may route: exactly `nn.Linear` (not subclasses such as quantized layers), 2-D weights."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dim() == 2]


def install(model: Any, routes: tuple[int, ...]) -> int:
    """Route every linear layer of `model` by `routes` (see LinearPlan.routes); returns the number of layers."""
    layers = linear_layers(model)
    for layer in layers:
        if any(routes):
            layer._tr_routes = tuple(routes)
            layer.forward = types.MethodType(_routed_forward, layer)
        else:
            layer.__dict__.pop("forward", None)
            layer.__dict__.pop("_tr_routes", None)
    return len(layers)


def uninstall(model: Any) -> None:
    """Give every linear layer its library forward back and forget the plan."""
    install(model, ())
    drop_packs(model)
    model.__dict__.pop(_ATTR, None)


def plan_of(model: Any) -> LinearPlan | None:
    """The plan installed on `model`, or None when it was never tuned."""
    return model.__dict__.get(_ATTR)


def set_plan(model: Any, plan: LinearPlan) -> None:
    """Install `plan` on `model` and keep it there (one plan per model, shared by every engine)."""
    layers = install(model, plan.routes())
    if ONEDNN not in plan.ways.values():
        drop_packs(model)
    model.__dict__[_ATTR] = LinearPlan(dict(plan.ways), plan.limit, plan.ms, layers, plan.note, plan.cached)


def describe_plan(model: Any) -> dict[str, Any]:
    """JSON-ready: how `model`'s linear layers multiply (the plan's ways and timings, or the library's product)."""
    plan = plan_of(model)
    if plan is None:
        return {"summary": "linear layers: the library's own product (not tuned)", "ways": {}}
    return {"summary": plan.summary(), "ways": {str(n): way for n, way in sorted(plan.ways.items())},
            "layers": plan.layers, "note": plan.note, "cached": plan.cached,
            "ms": {way: {str(n): round(v, 3) for n, v in per.items()} for way, per in plan.ms.items()}}


def timed_costs(model: Any) -> dict[int, float]:
    """Milliseconds of a whole forward of n tokens, for every row count n the installed plan timed, the way the plan
    runs it (its tuning's fastest round); empty when `model` was never tuned. The cost-sized trees' start-up probe
    takes these instead of timing the same forwards again."""
    plan = plan_of(model)
    if plan is None:
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


def tune(runner: Any, context: list[int], sizes: tuple[int, ...] = TUNE_SIZES, repeats: int = 2) -> LinearPlan:
    """Time whole forwards of each size every available way on this machine (interleaved; the fastest of `repeats`
    rounds after one warm-up round), install the fastest way per size and return the plan. 12-15 s with 2
    threads on a 2-core CPU for the embedded model."""
    from .cost import ForwardTimer, timing_context

    context, sizes = timing_context(runner, context, sizes)
    sizes = tuple(sizes) or (1,)
    model = runner.model
    ways = available_ways(weight_dtype(model))
    note = no_room_for_packs(model) if ONEDNN in ways else ""
    if note:
        ways = tuple(way for way in ways if way != ONEDNN)
    every = {way: (0,) + (WAYS.index(way),) * max(sizes) for way in ways}
    times: dict[str, dict[int, list[float]]] = {way: {n: [] for n in sizes} for way in ways}
    failed: set[str] = set()  # ways that raised on this model (a shape or dtype the small check did not cover)
    with ForwardTimer(runner, context) as timer:
        for rep in range(repeats + 1):
            for i, n in enumerate(sizes):
                turn = (rep + i) % len(ways)  # rotate which way goes first
                for way in ways[turn:] + ways[:turn]:
                    if way in failed:
                        continue
                    install(model, every[way])
                    try:
                        ms = timer.time(n)
                    except (RuntimeError, NotImplementedError):
                        if way == STOCK:
                            install(model, ())
                            raise
                        failed.add(way)
                        timer.cache.truncate(timer.past)  # layers that ran before the failure wrote entries
                        continue
                    if rep:
                        times[way][n].append(ms)
    best = {way: {n: min(v) for n, v in per.items()} for way, per in times.items()  # the least disturbed run
            if way not in failed}
    set_plan(model, LinearPlan(choose(best), max(sizes), best, note=note))
    return plan_of(model)


def ensure_tuned(runner: Any, context: list[int]) -> LinearPlan | None:
    """Tune `runner`'s model once (CPU only; later calls and other engines of the same model reuse the plan), or take
    the plan this machine timed for the same shapes in an earlier process (plan_cache.py)."""
    if not needs_tuning(runner.model, runner.device):
        return plan_of(runner.model)
    from .plan_cache import load_plan, save_plan

    with _LOCK:
        if needs_tuning(runner.model, runner.device):
            if (kept := load_plan(runner.model)) is not None:
                set_plan(runner.model, kept)
            else:
                save_plan(runner.model, tune(runner, context or [0]))
    return plan_of(runner.model)
