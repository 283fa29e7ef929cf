"""A preallocated KV cache that an unmodified transformers model writes into, compacted in place after verification.

Each layer owns a doubling buffer (no concatenation per forward); accepted nodes' entries move into place."""
from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

from .invariant import storage_dtype

ROW_GROWTH = 8  # spare rows a batch's cache gains when an answer joins a full buffer


def _used_part(buffer: str) -> property:
    """A view of the used part of the layer's `buffer`, cut when read; assigning a tensor replaces the buffer."""

    def get(layer: "_BufferLayer") -> torch.Tensor | None:
        data = getattr(layer, buffer)
        return None if data is None else data[: layer.rows, :, : layer.length]

    def put(layer: "_BufferLayer", value: torch.Tensor | None) -> None:
        setattr(layer, buffer, value)
        layer.length = 0 if value is None else value.shape[2]
        layer.rows = None

    return property(get, put)


class _BufferLayer(DynamicLayer):
    """One layer's keys and values in a growing buffer [row capacity, H, capacity, D]; `length` and `rows` are the
    truth and `keys`/`values` are views cut when read (so compaction only sets `length`). `rows` is None for an
    answer's own cache (every row of the buffer); a batch's buffer keeps spare rows, zero, for answers joining."""

    _k: torch.Tensor | None = None
    _v: torch.Tensor | None = None
    length = 0
    rows: int | None = None
    starts: tuple[torch.Tensor, torch.Tensor] | None = None  # (row, slot) indices [B, N] where the next update writes
    starts_end = 0  # the entries a batch's forward reads: its last start + N
    keys = _used_part("_k")
    values = _used_part("_v")

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Empty buffers of the states' shape, in the dtype they are stored in (float64 in exact mode: invariant.py)."""
        self.device = key_states.device
        self.length = 0
        self._k = key_states.new_empty(*key_states.shape[:2], 0, key_states.shape[3],
                                       dtype=storage_dtype(key_states.dtype))
        self._v = value_states.new_empty(*value_states.shape[:2], 0, value_states.shape[3],
                                         dtype=storage_dtype(value_states.dtype))
        self.is_initialized = True

    def reserve(self, needed: int, kept: int | None = None) -> None:
        """Room for `needed` entries, the first `kept` (default `length`) copied when it grows. It grows by a quarter
        (256 at least): every new slot is zeroed, and a batch's buffer is rows x its longest row, so doubling it for a
        tree's few slots cost three forwards' time (SmolLM2-135M, 8 rows, 2026-12-07)."""
        capacity = self._k.shape[2]
        if needed <= capacity:
            return
        new_cap = max(needed, capacity + max(capacity // 4, 256))
        for name in ("_k", "_v"):
            old = getattr(self, name)
            # zeros: a batch's row may read slots past its own that no forward wrote yet (masked, but an
            # uninitialised value, NaN or 1e306 in float64, would survive a finite mask)
            new = old.new_zeros(*old.shape[:2], new_cap, old.shape[3])
            n = self.length if kept is None else kept
            new[:, :, :n].copy_(old[:, :, :n])
            setattr(self, name, new)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.starts is not None:  # a batch's forward: each row's entries go right after its own (BatchKVCache)
            return self._update_rows(key_states, value_states)
        n = key_states.shape[2]
        self.reserve(self.length + n)
        self._k[: self.rows, :, self.length : self.length + n].copy_(key_states)
        self._v[: self.rows, :, self.length : self.length + n].copy_(value_states)
        self.length += n
        return self.keys, self.values

    def _update_rows(self, key_states: torch.Tensor, value_states: torch.Tensor):
        """Write row r's N new entries at starts[r], starts[r] + 1, ... (once: the forward's starts are used up), in
        room BatchKVCache.begin_forward reserved."""
        (rows, slots), end = self.starts, self.starts_end
        self.starts = None
        self._k[rows, :, slots] = key_states.transpose(1, 2).to(self._k.dtype)  # [B, N] index: [B, N, H, D] values
        self._v[rows, :, slots] = value_states.transpose(1, 2).to(self._v.dtype)
        self.length = end
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

    def add_row(self, own: "_BufferLayer", rows: int) -> None:
        """Put the one row of an answer's own layer `own` after this layer's first `rows` rows (BatchKVCache). A
        spare row is used when there is one and it is long enough; else the buffer grows by ROW_GROWTH rows at once
        (answers joining one by one would otherwise copy the whole batch's cache each), keeping every slot of the
        rows before (their lengths are the batch's, not `length`). Every slot stays finite (masked ones too)."""
        if not self.is_initialized:
            self.lazy_initialization(own.keys[:, :, :0], own.values[:, :, :0])
        spare, long_enough = self._k.shape[0] > rows, self._k.shape[2] >= own.length
        for name, part in (("_k", own.keys), ("_v", own.values)):
            buffer = getattr(self, name)
            if not (spare and long_enough):
                old = buffer
                buffer = old.new_zeros(max(old.shape[0], rows + ROW_GROWTH), old.shape[1],
                                       max(old.shape[2], own.length, 256), old.shape[3])
                buffer[:rows, :, : old.shape[2]] = old[:rows]
                setattr(self, name, buffer)
            buffer[rows, :, : own.length] = part[0]
        self.rows = rows + 1

    def repeated(self, count: int, length: int, capacity: int) -> "_BufferLayer":
        """A layer of `count` rows, each starting with this layer's first `length` entries (of its first row), with
        room for `capacity` entries a row."""
        out = _BufferLayer()
        out.device, out.is_initialized, out.length = self.device, True, length
        for name in ("_k", "_v"):
            old = getattr(self, name)
            new = old.new_zeros(count, old.shape[1], max(capacity, length), old.shape[3])
            new[:, :, :length] = old[:1, :, :length]
            setattr(out, name, new)
        return out

    def row_view(self, row: int, length: int) -> "_BufferLayer":
        """Row `row`'s first `length` entries as a layer of its own, sharing this one's buffers (no copy)."""
        own = _BufferLayer()
        own.device, own.is_initialized = self.device, True
        own.keys, own.values = self._k[row : row + 1], self._v[row : row + 1]  # whole buffers: then cut
        own.length = length
        return own

    def close_gaps(self, keep: list[int], lengths: list[int]) -> None:
        """Keep the rows `keep` (ascending), row keep[i] moving to row i with its first lengths[i] entries (the
        rest of a row is stale)."""
        for new, (old, n) in enumerate(zip(keep, lengths)):
            if new != old:
                self._k[new, :, :n].copy_(self._k[old, :, :n])
                self._v[new, :, :n].copy_(self._v[old, :, :n])
        self.rows = len(keep)

    def move_row(self, row: int, start: int, src: torch.Tensor) -> None:
        """Row `row`'s entries src[i] move to start + i."""
        for buffer in (self._k, self._v):
            buffer[row, :, start : start + len(src)] = buffer[row].index_select(1, src)

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


def repeated_cache(cache: TreeKVCache, count: int, length: int, capacity: int) -> TreeKVCache:
    """A cache of `count` rows, each starting with `cache`'s first `length` entries (ModelRunner.prefill_rows
    after a shared prefix), with room for `capacity` entries a row."""
    out = TreeKVCache()
    out.layers = [layer.repeated(count, length, capacity) for layer in cache.layers]
    return out


def row_caches(cache: TreeKVCache, lengths: list[int]) -> list[TreeKVCache]:
    """The rows of a cache prefilled for several answers at once (ModelRunner.prefill_rows) as answers' own caches:
    row i's first lengths[i] entries, views of the shared buffers (BatchKVCache.add_row copies them)."""
    solos = []
    for i, n in enumerate(lengths):
        solo = TreeKVCache()
        solo.layers = [layer.row_view(i, n) for layer in cache.layers]
        solos.append(solo)
    return solos


class BatchKVCache(TreeKVCache):
    """Several answers' caches as the rows of one (batch.py). Row r's committed entries are [0, rows[r]); a forward
    writes each row's tree right after them, at [rows[r], rows[r] + width), so each row's keys are one run from 0
    (row-wise attention reads no other row's padding: rows_attention.py), and a row whose accepted nodes lead its
    tree keeps them where they are. Entries past a row's own are stale: masked out."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []  # committed entries per row
        self.written_at: list[int] = []  # where the last forward wrote each row's tree

    def add_row(self, solo: TreeKVCache) -> None:
        """Append an answer prefilled alone (its entries copied; the solo cache can then be dropped)."""
        if not self.rows:
            self.layers = [_BufferLayer() for _ in solo.layers]
        for layer, own in zip(self.layers, solo.layers):
            layer.add_row(own, len(self.rows))
        self.rows.append(solo.layers[0].length)

    def drop_rows(self, keep: list[int]) -> None:
        """Keep only the rows `keep` (ascending): finished or abandoned answers leave, and the rows after a gap
        move down over it, each copying only its own entries."""
        if keep != sorted(keep):
            raise ValueError("rows kept must be in ascending order")
        self.rows = [self.rows[r] for r in keep]
        self.written_at = []
        if not self.rows:
            self.layers = []
            return
        for layer in self.layers:
            layer.close_gaps(keep, self.rows)

    def begin_forward(self, tree_width: int) -> list[int]:
        """Before a forward of `tree_width` tokens a row: each row's tree goes right after its committed entries;
        returns where each row's starts (the forward reads max(starts) + tree_width entries)."""
        self.written_at = list(self.rows)
        device = self.layers[0].device
        slots = torch.tensor(self.rows, dtype=torch.long, device=device)[:, None] + \
            torch.arange(tree_width, device=device)[None]
        rows = torch.arange(len(self.rows), device=device)[:, None].expand_as(slots)
        for layer in self.layers:
            layer.starts, layer.starts_end = (rows, slots), max(self.rows) + tree_width
            layer.reserve(layer.starts_end, max(self.rows))  # grown here, not in the timed forward (batch_cost.py)
        return self.written_at

    def keep_row(self, row: int, start: int, accepted: list[int], forwarded: bool) -> None:
        """Row `row` committed the accepted nodes of a tree rooted at `start`: move their entries (written after
        the row's own when `forwarded`, else already in place from its prefill) to start, start + 1, ..."""
        if forwarded:
            at = self.written_at[row]
            if at != start or accepted != list(range(len(accepted))):  # else already in place
                src = torch.tensor(accepted, dtype=torch.long, device=self.layers[0].device) + at
                for layer in self.layers:
                    layer.move_row(row, start, src)
        self.rows[row] = start + len(accepted)


class BatchRow:
    """One row of a BatchKVCache, standing in for an answer's own cache in the engine's commit."""

    def __init__(self, batch: BatchKVCache, row: int) -> None:
        self.batch, self.row, self.forwarded = batch, row, False

    def keep(self, start: int, accepted: list[int]) -> None:
        self.batch.keep_row(self.row, start, accepted, self.forwarded)
