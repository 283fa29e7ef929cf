"""The matrix product behind a model's linear layers on a CPU, chosen per row count by timing this machine.

A decoding step multiplies a handful of rows (1 for plain decoding, N for a draft tree of N tokens) by every weight
matrix of the model. `F.linear` hands that to the BLAS as x @ W^T, and for a few rows the BLAS may take a slow path:
on a 2-core AMD EPYC with torch 2.13's MKL, two or three rows cost 2-3x one row (the weights are read once per
row), so the forward of a 2-token tree cost 1.7x that of one token and a draft token had to be accepted 70% of the
time just to break even. The same product written as W @ x^T (the weight matrix streamed once for all rows, with a
one-row input padded to two) cut the embedded model's forward from 62 to 34 ms for one token and from 101 to 38 ms
for two, with 2 threads. Other CPUs and BLAS builds differ, so nothing is assumed: `tune` times whole forwards
both ways at each tracked size on this machine, and `install` routes each row count to the faster one.

Both ways compute the same products; only the order of the floating-point sums may differ, as it already does
between a one-token forward and a tree forward. A model keeps one choice (`plan_of`), shared by every engine and
by plain decoding, so the speedup is measured against plain decoding at its own best. Only plain `nn.Linear`
layers on a CPU are routed; GPUs and other layer kinds keep their own path.
"""
from __future__ import annotations

import threading
import types
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

STOCK, TRANSPOSED = "stock", "transposed"
TUNE_SIZES = (1, 2, 3, 4, 6, 8, 12, 16)  # row counts timed; others follow the nearest one timed
_ATTR = "_tr_linear_plan"  # where a model keeps its plan
_LOCK = threading.Lock()  # one tuning at a time in a process (the app's sessions share models)


@dataclass(frozen=True)
class LinearPlan:
    """Which row counts take the transposed product, and the whole-forward times that chose them (plain data).

    `ms[strategy][n]`: median milliseconds of a forward of n tree tokens; `transposed`: the row counts routed to
    W @ x^T (every count up to `limit`; beyond it, and for counts not timed, the nearest timed count decides).
    """

    transposed: tuple[int, ...]
    limit: int
    ms: dict[str, dict[int, float]] = field(default_factory=dict)
    layers: int = 0

    def routes(self) -> tuple[bool, ...]:
        """routes()[m]: whether m rows take the transposed product, for m in 0..limit."""
        timed = sorted(set(self.ms.get(STOCK, {})) | set(self.transposed)) or [1]
        chosen = set(self.transposed)
        return tuple(m > 0 and min(timed, key=lambda t: (abs(t - m), t)) in chosen for m in range(self.limit + 1))

    def summary(self) -> str:
        """One line: the sizes routed each way and the forward times at one and two tokens."""
        if not self.layers:
            return "linear layers: the library's own product (nothing to route on this model or device)"
        stock, fast = self.ms.get(STOCK, {}), self.ms.get(TRANSPOSED, {})
        pairs = ", ".join(f"N={n}: {stock[n]:.1f} -> {min(stock[n], fast[n]):.1f} ms" for n in (1, 2)
                          if n in stock and n in fast)
        way = ",".join(map(str, self.transposed)) or "none"
        return f"linear layers: W @ x^T for row counts {way} of those timed ({self.layers} layers; {pairs})"


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


def _routed_forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A linear layer's forward that sends row counts m with self._tr_routes[m] to the transposed product (CPU
    tensors only). Bound to the layer as a method, so a deep copy of the model routes its own weights."""
    routes, d = self._tr_routes, x.shape[-1]
    rows = x.numel() // d if d else 0
    if rows < len(routes) and routes[rows] and x.device.type == "cpu" and x.dtype == self.weight.dtype:
        return transposed_linear(x, self.weight, self.bias, rows)
    return F.linear(x, self.weight, self.bias)


def linear_layers(model: Any) -> list[torch.nn.Linear]:
    """The layers a plan may route: exactly `nn.Linear` (not subclasses such as quantized layers), 2-D weights."""
    return [m for m in model.modules() if type(m) is torch.nn.Linear and m.weight.dim() == 2]


def install(model: Any, routes: tuple[bool, ...]) -> int:
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
    model.__dict__.pop(_ATTR, None)


def plan_of(model: Any) -> LinearPlan | None:
    """The plan installed on `model`, or None when it was never tuned."""
    return model.__dict__.get(_ATTR)


def set_plan(model: Any, plan: LinearPlan) -> None:
    """Install `plan` on `model` and keep it there (one plan per model, shared by every engine)."""
    layers = install(model, plan.routes())
    model.__dict__[_ATTR] = LinearPlan(plan.transposed, plan.limit, plan.ms, layers)


def describe_plan(model: Any) -> dict[str, Any]:
    """JSON-ready: how `model`'s linear layers multiply (the plan's sizes and timings, or the library's product)."""
    plan = plan_of(model)
    if plan is None:
        return {"summary": "linear layers: the library's own product (not tuned)", "transposed": []}
    return {"summary": plan.summary(), "transposed": list(plan.transposed), "layers": plan.layers,
            "ms": {way: {str(n): round(v, 3) for n, v in per.items()} for way, per in plan.ms.items()}}


def needs_tuning(model: Any, device: torch.device) -> bool:
    """True when `model` runs on a CPU, has linear layers to route and was never tuned."""
    return device.type == "cpu" and plan_of(model) is None and bool(linear_layers(model))


def choose(ms: dict[str, dict[int, float]]) -> tuple[int, ...]:
    """The timed row counts whose transposed forward was faster than the library's."""
    stock, fast = ms.get(STOCK, {}), ms.get(TRANSPOSED, {})
    return tuple(n for n in sorted(stock) if n in fast and fast[n] < stock[n])


def tune(runner: Any, context: list[int], sizes: tuple[int, ...] = TUNE_SIZES, repeats: int = 2) -> LinearPlan:
    """Time whole forwards of each size both ways on this machine (interleaved), install the faster per size and
    return the plan. About 3-5 s on a 2-core CPU for the embedded model."""
    from .cost import ForwardTimer

    model = runner.model
    all_rows = tuple(True for _ in range(max(sizes) + 1))
    times: dict[str, dict[int, list[float]]] = {STOCK: {n: [] for n in sizes}, TRANSPOSED: {n: [] for n in sizes}}
    with ForwardTimer(runner, context[-256:]) as timer:
        for rep in range(repeats + 1):  # the first round warms both ways up and is not kept
            for n in sizes:
                order = (STOCK, TRANSPOSED) if (rep + n) % 2 else (TRANSPOSED, STOCK)
                for way in order:
                    install(model, all_rows if way == TRANSPOSED else ())
                    ms = timer.time(n)
                    if rep:
                        times[way][n].append(ms)
    best = {way: {n: min(v) for n, v in per.items()} for way, per in times.items()}  # the least disturbed run
    plan = LinearPlan(choose(best), max(sizes), best)
    set_plan(model, plan)
    return plan_of(model)


def ensure_tuned(runner: Any, context: list[int]) -> LinearPlan | None:
    """Tune `runner`'s model once (CPU only; later calls and other engines of the same model reuse the plan)."""
    if not needs_tuning(runner.model, runner.device):
        return plan_of(runner.model)
    with _LOCK:
        if needs_tuning(runner.model, runner.device):
            tune(runner, context or [0])
    return plan_of(runner.model)
