"""The step's one host sync: device tensors registered by name, copied to the host in one go, split back by name
(float64 carries every token id < 2^53 and every float32 probability exactly)."""
from __future__ import annotations

from functools import lru_cache

import torch


@lru_cache(maxsize=8)
def _empty_float64(device: torch.device) -> torch.Tensor:
    """An empty float64 tensor on the device: the part that makes `cat` promote every other part to float64."""
    return torch.empty(0, dtype=torch.float64, device=device)


class SyncPacket:
    """Collects named device tensors; `sync()` returns {name: list} with one device-to-host copy."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._parts: list[torch.Tensor] = []
        self._integer: list[bool] = []

    def add(self, name: str, tensor: torch.Tensor) -> "SyncPacket":
        """Register a tensor (any shape; flattened) under a unique name."""
        if name in self._names:
            raise ValueError(f"packet already holds {name!r}")
        self._names.append(name)
        self._parts.append(tensor.reshape(-1))
        self._integer.append(not tensor.is_floating_point())
        return self

    def update(self, tensors: dict[str, torch.Tensor]) -> "SyncPacket":
        """Register several tensors."""
        for name, tensor in tensors.items():
            self.add(name, tensor)
        return self

    def sync(self) -> dict[str, list]:
        """The one host sync: {name: list of ints (integer tensors) or floats}."""
        if not self._parts:
            return {}
        # cat promotes every part to float64 itself (the empty float64 part sets the type): no per-part copies
        flat = torch.cat([*self._parts, _empty_float64(self._parts[0].device)]).tolist()
        out, start = {}, 0
        for name, part, integer in zip(self._names, self._parts, self._integer):
            values = flat[start : start + part.numel()]
            out[name] = [int(v) for v in values] if integer else values
            start += part.numel()
        return out
