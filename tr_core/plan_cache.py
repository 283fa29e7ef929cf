"""The timed choice of matrix products (kernels.py), kept on disk per machine and model shape.

Timing every way at every row count costs whole forwards: 12-15 s for the embedded model on a 2-core CPU, about
30 s for a 0.5B model. The choice depends only on the machine (its CPU, cores, torch threads, torch build) and on
the shapes and dtype of the model's linear layers, so it is timed once and kept in a small JSON file
($TR_PLAN_CACHE, else `linear_plans.json` in the model cache folder; TR_PLAN_CACHE= with nothing disables it).
A later process on the same machine takes it from there, and says so in the plan's summary. A plan that cannot be
used as it is (a way this torch build lacks, no room now for oneDNN's packed copies) is timed again.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from .kernels import ONEDNN, LinearPlan, available_ways, linear_layers, no_room_for_packs, weight_dtype

PLAN_CACHE_ENV = "TR_PLAN_CACHE"
MAX_PLANS = 64  # plans kept in the file (the oldest go first)


def plan_cache_path() -> Path | None:
    """The cache file, or None when $TR_PLAN_CACHE is set to nothing."""
    value = os.environ.get(PLAN_CACHE_ENV)
    if value is not None:
        return Path(value).expanduser() if value.strip() else None
    from .models import cache_dir

    return cache_dir() / "linear_plans.json"


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def plan_key(model: Any) -> str:
    """What a plan depends on: this machine, torch's build and threads, the linear layers' shapes and dtype."""
    shapes = Counter((layer.in_features, layer.out_features, layer.bias is not None) for layer in linear_layers(model))
    what = [cpu_name(), os.cpu_count(), torch.get_num_threads(), torch.__version__, str(weight_dtype(model)),
            sorted(shapes.items())]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:32]


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def plan_to_dict(plan: LinearPlan) -> dict[str, Any]:
    return {"ways": {str(n): way for n, way in plan.ways.items()}, "limit": plan.limit,
            "ms": {way: {str(n): v for n, v in per.items()} for way, per in plan.ms.items()}, "note": plan.note,
            "timed": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def plan_from_dict(data: dict[str, Any], where: Path) -> LinearPlan | None:
    """The plan a cache entry holds, or None when the entry is malformed."""
    try:
        ways = {int(n): str(way) for n, way in data["ways"].items()}
        ms = {str(way): {int(n): float(v) for n, v in per.items()} for way, per in data["ms"].items()}
        limit = int(data["limit"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    if not ways or limit < max(ways) or any(n not in ms.get(way, {}) for n, way in ways.items()):
        return None
    return LinearPlan(ways, limit, ms, note=str(data.get("note", "")),
                      cached=f"timed on this machine {data.get('timed', 'earlier')}, kept in {where}")


def load_plan(model: Any) -> LinearPlan | None:
    """This machine's plan for `model`'s shapes, when one was kept and can be used now."""
    path = plan_cache_path()
    if path is None:
        return None
    entry = _read(path).get(plan_key(model))
    plan = plan_from_dict(entry, path) if isinstance(entry, dict) else None
    if plan is None:
        return None
    usable = set(available_ways(weight_dtype(model)))
    if not set(plan.ways.values()) <= usable or (ONEDNN in plan.ways.values() and no_room_for_packs(model)):
        return None
    return plan


def save_plan(model: Any, plan: LinearPlan) -> None:
    """Keep `plan` for `model`'s shapes on this machine (best effort: an unwritable cache is skipped)."""
    path = plan_cache_path()
    if path is None or not plan.ways:
        return
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
    except OSError:
        pass
