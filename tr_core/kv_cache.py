"""A preallocated KV cache that an unmodified transformers model writes into, compacted in place after verification.

Each layer owns a doubling buffer (no concatenation per forward); accepted nodes' entries move into place."""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer


def _used_part(buffer: str) -> property:
    """A view of the used part of the layer's `buffer`, cut when read; assigning a tensor replaces the buffer."""

    def get(layer: "_BufferLayer") -> torch.Tensor | None:
        data = getattr(layer, buffer)
        return None if data is None else data[:, :, : layer.length]

    def put(layer: "_BufferLayer", value: torch.Tensor | None) -> None:
        setattr(layer, buffer, value)
        layer.length = 0 if value is None else value.shape[2]

    return property(get, put)


class _BufferLayer(DynamicLayer):
    """One layer's keys and values in a growing buffer [B, H, capacity, D]; `length` is the truth and
    `keys`/`values` are views cut when read (so compaction only sets `length`)."""

    _k: torch.Tensor | None = None
    _v: torch.Tensor | None = None
    length = 0
    keys = _used_part("_k")
    values = _used_part("_v")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        self.length = 0
        self._k = key_states.new_empty(*key_states.shape[:2], 0, key_states.shape[3])
        self._v = value_states.new_empty(*value_states.shape[:2], 0, value_states.shape[3])
        self.is_initialized = True

    def _reserve(self, needed: int) -> None:
        capacity = self._k.shape[2]
        if needed <= capacity:
            return
        new_cap = max(needed, 2 * capacity, 256)
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_empty(*old.shape[:2], new_cap, old.shape[3])
            new[:, :, : self.length].copy_(old[:, :, : self.length])
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n = key_states.shape[2]
        self._reserve(self.length + n)
        self._k[:, :, self.length : self.length + n].copy_(key_states)
        self._v[:, :, self.length : self.length + n].copy_(value_states)
        self.length += n
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, max_length: int) -> None:
        """As transformers' DynamicLayer.crop: keep the first `max_length` entries; negative removes -max_length."""
        if not self.is_initialized:
            return
        if max_length < 0:
            max_length = self.length + max_length
        self.length = max(min(self.length, max_length), 0)

    def reset(self) -> None:
        if self.is_initialized:
            self.length = 0

    def keep(self, start: int, src: torch.Tensor | None, count: int) -> None:
        """Keep `count` entries after `start`: move entries start + src[i] to start + i (src None: already in place)."""
        if src is not None:
            idx = src + start
            self._k[:, :, start : start + count].copy_(self._k.index_select(2, idx))
            self._v[:, :, start : start + count].copy_(self._v.index_select(2, idx))
        self.length = start + count


class CacheInvariantError(RuntimeError):
    """The cache no longer matches the committed text: a bug, reported instead of decoding wrong tokens."""


class TreeKVCache(Cache):
    """The engine's cache: one `_BufferLayer` per model layer, created lazily on the first forward."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=_BufferLayer)

    def require_length(self, committed: int) -> None:
        """Raise CacheInvariantError unless every layer holds exactly `committed` entries."""
        for i, layer in enumerate(self.layers):
            have = layer.length if layer.is_initialized else 0
            if have != committed:
                raise CacheInvariantError(
                    f"KV cache layer {i} holds {have} entries but {committed} tokens are committed")

    def keep(self, start: int, accepted: list[int]) -> None:
        """After a tree forward that began at `start`, keep only the accepted nodes' entries, in path order."""
        count = len(accepted)
        src = None if accepted == list(range(count)) else \
            torch.tensor(accepted, dtype=torch.long, device=self.layers[0].device)  # None: already in place
        for layer in self.layers:
            if layer.is_initialized:
                if layer.length < start + max(accepted) + 1:
                    raise CacheInvariantError(f"cache holds {layer.length} entries, shorter than the verified tree "
                                              f"({start} + {max(accepted) + 1})")
                layer.keep(start, src, count)

    def truncate(self, length: int) -> None:
        """Cut every layer back to `length` entries."""
        for layer in self.layers:
            if layer.is_initialized:
                layer.length = min(layer.length, length)
