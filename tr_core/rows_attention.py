"""Row-wise attention for a batch's forward: each row reads only its own keys, not the longest row's length.

A batch's rows are ragged: one answer's prompt may hold 950 tokens and another's 80. One attention call over the
padded batch reads every row's keys up to the longest row's end, masked or not, and attention is bound by those
reads (a one-token step of 8 such rows on a 2-core AMD EPYC spent more time in attention than in the linear
layers). BatchKVCache writes each row's tree right after that row's own entries, so row r's keys are the run
[0, lengths[r]); while `rows(...)` is active, the model's attention calls its usual function once per row on that
run. A row read alone computes exactly what it computes decoding alone: the same keys, the same mask, the same
call. Every call has a fixed cost, so neighbouring rows of near lengths share one call, up to their longest
(`chunks`): thirty visitors' chat prompts of similar lengths are one call, as before.

The rows are handed over per thread; another thread's forwards of the same model, and this thread's other
forwards, run the usual function unchanged. On a GPU, and for attention functions transformers does not keep in
its registry (a model's own eager one), the padded call stays: the mask keeps it exact there too."""
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

import torch

from .invariant import ATTENTION_LOCK, ROWS_PREFIX, attention_configs, own_name

PREFIX = ROWS_PREFIX  # registered as PREFIX + the wrapped function's name (its masks are that function's)
_LOCAL = threading.local()  # .rows: (runs, lengths, masked) of this thread's batched forward
_USERS: dict[int, int] = {}  # id(config) -> forwards using the row-wise name now (the name goes when none do)


# one more attention call costs about as much as reading this many more keys in a row (an AMD EPYC, 2026-12-07:
# about 24 us a call, one row of 950 keys of SmolLM2-135M 0.09 us a key)
CALL_KEYS = 256


def chunks(lengths: list[int], call_keys: int | None = None) -> list[tuple[int, int, int]]:
    """The rows as runs (first, past the last, keys) of neighbours that one call reads up to their longest: a row
    joins the run before it where reading its neighbours' longer keys (or they its) costs less than a call."""
    call_keys = CALL_KEYS if call_keys is None else call_keys
    out: list[tuple[int, int, int]] = []
    for i, n in enumerate(lengths):
        if out:
            first, _, keys = out[-1]
            together, apart = (i - first + 1) * max(keys, n), (i - first) * keys + n + call_keys
            if together <= apart:
                out[-1] = (first, i + 1, max(keys, n))
                continue
        out.append((i, i + 1, n))
    return out


def attention(inner: str, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention `inner`, once per run of rows of this thread's batched forward, on the run's own
    keys (a row alone with no mask when `masked` is False: as it decodes alone); a forward of any other shape
    calls `inner` as it is."""
    from transformers import AttentionInterface

    function = AttentionInterface._global_mapping[inner]
    spec = getattr(_LOCAL, "rows", None)
    if spec is None or spec[0][-1][1] != query.shape[0]:
        return function(module, query, key, value, attention_mask, **kwargs)
    runs, lengths, masked = spec
    if len(runs) == 1 and runs[0][2] == key.shape[2]:
        return function(module, query, key, value, attention_mask, **kwargs)
    outs = []
    for first, last, n in runs:
        even = all(lengths[i] == n for i in range(first, last))
        mask = None if attention_mask is None or (even and not masked) else attention_mask[first:last, :, :, :n]
        outs.append(function(module, query[first:last], key[first:last, :, :n], value[first:last, :, :n], mask,
                             **kwargs)[0])
    return torch.cat(outs), None


def wrappable(runner: Any) -> str | None:
    """The registered attention this runner's model uses, when row-wise calls pay (on a CPU); else None."""
    from transformers import AttentionInterface

    name = own_name(getattr(runner.config, "_attn_implementation", None)) or ""
    return name if runner.device.type == "cpu" and name in AttentionInterface._global_mapping else None


def register(inner: str) -> str:
    """Register the row-wise form of `inner` (with `inner`'s mask function); returns its name. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    name = PREFIX + inner
    if name not in AttentionInterface._global_mapping:
        AttentionInterface.register(name, functools.partial(attention, inner))
        if inner in ALL_MASK_ATTENTION_FUNCTIONS._global_mapping:
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS._global_mapping[inner])
    return name


@contextlib.contextmanager
def rows(runner: Any, lengths: list[int], masked: bool) -> Iterator[None]:
    """This thread's next forwards of `runner`'s model read row r's keys [0, lengths[r]) (see the module), rows
    of near lengths side by side in one call (`chunks`); `masked` False: each row sees every key it reads (one
    token a row), so a row read alone gets no mask, as alone."""
    with ATTENTION_LOCK:  # exact mode's install (invariant.py) changes the names under it too
        inner = wrappable(runner)
        if inner is not None:
            name = register(inner)
            configs = [c for c in _configs(runner.model) if own_name(c._attn_implementation_internal) == inner]
            for config in configs:  # the decoder's; a vision tower with its own attention keeps it
                _USERS[id(config)] = _USERS.get(id(config), 0) + 1
                config._attn_implementation_internal = name
    if inner is None:
        yield
        return
    _LOCAL.rows = (chunks(lengths), lengths, masked)
    try:
        yield
    finally:
        _LOCAL.rows = None
        with ATTENTION_LOCK:
            for config in configs:
                _USERS[id(config)] -= 1
                if not _USERS[id(config)]:
                    del _USERS[id(config)]
                    if config._attn_implementation_internal == name:  # someone who changed it since keeps theirs
                        config._attn_implementation_internal = inner


def _configs(model: Any) -> list[Any]:
    """The model's attention configs, found once per model (a scan of every module)."""
    found = getattr(model, "_tr_attention_configs", None)
    if found is None:
        found = attention_configs(model)
        model._tr_attention_configs = found
    return found
