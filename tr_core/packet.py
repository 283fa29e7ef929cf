"""The step's one host sync: device tensors registered by name, copied to the host in one go, split back by name
(float64 carries every token id < 2^53 and every float32 probability exactly)."""
from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=8)
def _empty_float64(device: torch.device) -> torch.Tensor:
    """An empty float64 tensor: the part that makes `cat` promote every other part to float64."""
    return torch.empty(0, dtype=torch.float64, device=device)


class SyncPacket:
    """Collects named device tensors; `sync()` returns {name: list} with one device-to-host copy."""

    def __init__(self) -> None:
        self._parts: dict[str, torch.Tensor] = {}

    def add(self, name: str, tensor: torch.Tensor) -> "SyncPacket":
        """Register a tensor (any shape; flattened) under a unique name."""
        if name in self._parts:
            raise ValueError(f"packet already holds {name!r}")
        self._parts[name] = tensor.reshape(-1)
        return self

    def update(self, tensors: dict[str, torch.Tensor]) -> "SyncPacket":
        for name, tensor in tensors.items():
            self.add(name, tensor)
        return self

    def sync(self) -> dict[str, list]:
        """The one host sync: {name: list of ints (integer tensors) or floats}."""
        if not self._parts:
            return {}
        parts = list(self._parts.values())  # cat promotes them to float64 itself: no per-part copies
        flat = torch.cat([*parts, _empty_float64(parts[0].device)]).tolist()
        out, start = {}, 0
        for name, part in self._parts.items():
            values = flat[start : start + part.numel()]
            out[name] = values if part.is_floating_point() else [int(v) for v in values]
            start += part.numel()
        return out
