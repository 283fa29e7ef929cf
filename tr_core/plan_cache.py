"""The timed choice of matrix products, kept on disk per machine and model shape (`plan_key`; $TR_PLAN_CACHE, empty:
off); a kept entry is used only where its machine, steadiness, ways and memory still hold (and tuning.check_kept)."""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from .kernels import (ONEDNN, STEADY_SPREAD, LinearPlan, available_ways, linear_layers, no_room_for_packs,
                      weight_dtype)
from .machine import timing_key

PLAN_CACHE_ENV = "TR_PLAN_CACHE"
MAX_PLANS = 64  # plans kept in the file (the oldest go first)


def plan_cache_path() -> Path | None:
    """The cache file, or None when $TR_PLAN_CACHE is set to nothing."""
    value = os.environ.get(PLAN_CACHE_ENV)
    if value is not None:
        return Path(value).expanduser() if value.strip() else None
    from .models import cache_dir

    return cache_dir() / "linear_plans.json"


def plan_key(model: Any) -> str:
    """What a plan depends on: this machine, torch's build and threads, the linear layers' shapes and dtype."""
    shapes = Counter((layer.in_features, layer.out_features, layer.bias is not None) for layer in linear_layers(model))
    here = timing_key()
    what = [here["cpu"], here["cores"], here["threads"], here["torch"], str(weight_dtype(model)),
            sorted(shapes.items())]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def plan_to_dict(plan: LinearPlan) -> dict[str, Any]:
    """A cache entry: the plan, how steady its timings were, and the machine and time they were taken on."""
    return {"ways": {str(n): way for n, way in plan.ways.items()}, "limit": plan.limit,
            "ms": {way: {str(n): v for n, v in per.items()} for way, per in plan.ms.items()}, "note": plan.note,
            "spread": plan.spread, "agreement": plan.agreement, "machine": timing_key(),
            "timed": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def plan_from_dict(data: Any, where: Path) -> LinearPlan | None:
    """The plan a cache entry holds, or None when the entry is malformed."""
    try:
        ways = {int(n): str(way) for n, way in data["ways"].items()}
        ms = {str(way): {int(n): float(v) for n, v in per.items()} for way, per in data["ms"].items()}
        limit = int(data["limit"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not ways or limit < max(ways) or any(n not in ms.get(way, {}) for n, way in ways.items()):
        return None
    spread = data.get("spread")
    agreement = data.get("agreement") if isinstance(data.get("agreement"), dict) else {}
    return LinearPlan(ways, limit, ms, note=str(data.get("note", "")),
                      cached=f"timed on this machine {data.get('timed', 'earlier')}, kept in {where}",
                      spread=float(spread) if isinstance(spread, (int, float)) else float("inf"), agreement=agreement)


def load_plan(model: Any) -> tuple[LinearPlan | None, str]:
    """(this machine's kept plan for `model`'s shapes, "") when usable now; else (None, why not, "" if none kept)."""
    path = plan_cache_path()
    entry = None if path is None else _read(path).get(plan_key(model))
    if entry is None:
        return None, ""
    plan = plan_from_dict(entry, path)
    if plan is None:
        return None, f"the entry kept in {path} was malformed"
    if (recorded := entry.get("machine")) != timing_key():
        return None, f"the plan kept in {path} was timed on another machine or torch ({recorded})"
    if not plan.steady:
        return None, f"the plan kept in {path} has no steady timings"
    if not set(plan.ways.values()) <= set(available_ways(weight_dtype(model))):
        return None, f"the plan kept in {path} names a way this torch build lacks"
    if ONEDNN in plan.ways.values() and no_room_for_packs(model):
        return None, f"the plan kept in {path} takes oneDNN, and memory is short now"
    return plan, ""


def save_plan(model: Any, plan: LinearPlan) -> str:
    """Keep `plan` for `model`'s shapes on this machine when its timings were steady; what was done, in words."""
    path = plan_cache_path()
    if path is None:
        return "not kept: the plan store is off (TR_PLAN_CACHE is set to nothing)"
    if not plan.ways:
        return "not kept: nothing was timed"
    if not plan.steady:
        return (f"not kept: its timings were too unsteady (one size varied {plan.spread:.0%} between rounds, "
                f"more than {STEADY_SPREAD:.0%}); the next process times them again")
    plans = _read(path)
    plans.pop(key := plan_key(model), None)
    plans[key] = plan_to_dict(plan)
    while len(plans) > MAX_PLANS:
        plans.pop(next(iter(plans)))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(plans, indent=1) + "\n", encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        return f"not kept: cannot write {path} ({exc.strerror or exc})"
    return f"kept in {path} for later runs"
