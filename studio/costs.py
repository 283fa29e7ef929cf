"""This machine's forward costs: timed once per model and shared by every session (`share_costs`), and the curve
t(n)/t(1) the cost panel divides by (`cost_curve`)."""
from __future__ import annotations

import copy
from typing import Any

from tr_core.trace import Trace

from .cost_panel import CostCurve, meter_curve
from .models import label
from .session import Session, Studio


MAX_RETIMES = 3  # a machine busy this often keeps its unsteady curve, flagged as such on the page


def steady(cost: Any) -> bool:
    """Whether a measured cost curve was timed on a quiet machine (ForwardCost.steady; True where not known)."""
    return bool(getattr(cost, "steady", True))


def share_costs(studio: Studio, model: str, engine: Any, before_answer: bool = False) -> None:
    """One timing of this machine's forwards per model, for every session: an engine whose cost-sized drafters have
    measured a steady curve leaves a copy with the studio, and one that has not takes a copy before it answers (else
    each visitor's first adaptive or hybrid answer would pause seconds to time the forwards again). A curve timed
    while the machine was busy is never shared: `before_answer`, the engine drops it to time the forwards again in
    that answer (up to MAX_RETIMES per model), after which it is kept for that session only and the page flags it."""
    for name, cost in engine.forward_costs().items():
        key = (model, name)
        known = studio.costs.get(key)
        if cost.measured and steady(cost):
            studio.costs.setdefault(key, copy.deepcopy(cost))
        elif known is not None:
            engine.use_forward_cost(name, copy.deepcopy(known))
        elif before_answer and cost.measured and studio.retimed.get(key, 0) < MAX_RETIMES:
            studio.retimed[key] = studio.retimed.get(key, 0) + 1
            engine.use_forward_cost(name, type(cost)())  # unmeasured: the next answer times the forwards again


def cost_curve(s: Session, trace: Trace | None) -> CostCurve:
    """What a step of n tokens costs: from the meter's timings once it measured the trace (views.meter_curve: its
    own record, also for a trace loaded from a file), else this machine's measured t(n)/t(1) from the session's engine
    (the adaptive and hybrid trees time forwards of every size on their first answer, then refine it with every
    step), or why it cannot be shown."""
    live = engine_curve(s, trace)
    metered = meter_curve(trace.speed if trace is not None else None,
                          shape=live.ms if live.relative is not None and live.steady else None)
    return metered or live


def engine_curve(s: Session, trace: Trace | None) -> CostCurve:
    """This machine's measured t(n)/t(1) from the session's engine's cost-sized drafter, or why there is none."""
    engine = s.engine
    if engine is None:
        return CostCurve(None, "no model has answered in this tab yet")
    if trace is not None and trace.model and trace.model != label(s.model):
        return CostCurve(None, f"this trace was recorded with another model ({trace.model[:60]})")
    template = str((trace.settings if trace is not None else {}).get("template", ""))
    names = ("hybrid", "adaptive") if template.startswith("hybrid") else ("adaptive", "hybrid")
    costs = engine.forward_costs()
    for name in names:
        cost = costs.get(name)
        if cost is not None and getattr(cost, "measured", False) and cost(1) > 0:
            spread = float(getattr(cost, "spread", 0.0) or 0.0)
            return CostCurve(lambda n, c=cost: c(n) / c(1), source=f"the {name} tree on this machine",
                             steady=steady(cost), note="" if steady(cost) else f"its repeats spread ±{spread:.0%}",
                             ms=cost)
    return CostCurve(None, "only the adaptive and hybrid trees time forwards of every size (on their first answer, "
                           "in a few seconds); the static trees never do, so ask once with one of them")
