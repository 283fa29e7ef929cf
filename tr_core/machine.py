"""The machine this process runs on: its CPU, cores, memory and what timings depend on (every reading of it)."""
from __future__ import annotations

import os
import platform
import re
from typing import Any

import torch


def sync(device: torch.device) -> None:
    """Wait for queued GPU work (no-op on a CPU): before and after anything timed."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_name() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what the platform says."""
    found = re.search(r"^model name\s*:(.*)$", _read_text("/proc/cpuinfo", "utf-8"), re.MULTILINE)
    return found[1].strip() if found else platform.processor() or platform.machine()


def describe(device: Any = None) -> str:
    """One line for a report's header: the GPU's name on a CUDA `device`, else the CPU's name and core count."""
    if device is not None and torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{cpu_name()}, {os.cpu_count()} cores"


def speed_label(device: Any = None) -> str:
    """The machine behind a speed figure, as the page names it: the GPU's name on a CUDA `device`, else the CPU's
    name and the threads torch decodes with (timings follow threads, not cores)."""
    if device is not None and torch.device(device).type == "cuda":
        return describe(device)
    threads = torch.get_num_threads()
    name = re.sub(r"\s+", " ", re.sub(r"\((R|TM)\)", "", cpu_name(), flags=re.IGNORECASE)).strip()
    return f"{name}, {threads} thread{'s' if threads != 1 else ''}"


def timing_key() -> dict[str, Any]:
    """What a timing here depends on besides the model: the CPU, its cores, torch's threads and build."""
    return {"cpu": cpu_name(), "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__}


def free_memory() -> int | None:
    """Bytes this process may still take: available memory or its cgroup's room, the smaller; None if unreadable."""
    available = re.search(r"^MemAvailable:\s+(\d+)\b", _read_text("/proc/meminfo"), re.MULTILINE)
    found = [int(available[1]) * 1024] if available else []
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),  # cgroup v2, then v1
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        cap, used = _read_text(limit).strip(), _read_text(usage).strip()
        if cap.isdigit() and used.isdigit():  # "max": no limit
            found.append(int(cap) - int(used))
    return min(found) if found else None


def _read_text(path: str, encoding: str = "ascii") -> str:
    try:
        with open(path, encoding=encoding, errors="replace") as f:
            return f.read()
    except (OSError, ValueError):
        return ""
