"""Row-wise attention for a batch's forward: each row reads only its own keys, not the longest row's length.

A batch's rows are ragged: one answer's prompt may hold 950 tokens and another's 80. One attention call over the
padded batch reads every row's keys up to the longest row's end, masked or not, and attention is bound by those
reads (a one-token step of 8 such rows on a 2-core AMD EPYC spent more time in attention than in the linear
layers). BatchKVCache writes each row's tree right after that row's own entries, so row r's keys are the run
[0, lengths[r]); while `rows(...)` is active, the model's attention calls its usual function once per row on that
run. Each row then computes exactly what it computes decoding alone: the same keys, the same mask, the same call.

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

from .invariant import attention_configs

PREFIX = "tr_rows:"  # registered as PREFIX + the wrapped function's name (its masks are that function's)
_LOCAL = threading.local()  # .rows: (lengths, masked) of this thread's batched forward
_LOCK = threading.Lock()
_USERS: dict[int, int] = {}  # id(config) -> forwards using the row-wise name now (the name goes when none do)


def attention(inner: str, module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention `inner`, once per row of this thread's batched forward on that row's own keys
    (with its mask, or none when `masked` is False); a forward of any other shape calls `inner` as it is."""
    from transformers import AttentionInterface

    function = AttentionInterface._global_mapping[inner]
    spec = getattr(_LOCAL, "rows", None)
    if spec is None or len(spec[0]) != query.shape[0]:
        return function(module, query, key, value, attention_mask, **kwargs)
    lengths, masked = spec
    outs = []
    for i, n in enumerate(lengths):
        mask = attention_mask[i : i + 1, :, :, :n] if masked and attention_mask is not None else None
        outs.append(function(module, query[i : i + 1], key[i : i + 1, :, :n], value[i : i + 1, :, :n], mask,
                             **kwargs)[0])
    return torch.cat(outs), None


def wrappable(runner: Any) -> str | None:
    """The registered attention this runner's model uses, when row-wise calls pay (on a CPU); else None."""
    from transformers import AttentionInterface

    name = getattr(runner.config, "_attn_implementation", None) or ""
    if name.startswith(PREFIX):
        name = name[len(PREFIX):]
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
    """This thread's next forwards of `runner`'s model read row r's keys [0, lengths[r]) alone (see the module);
    `masked` False: each row sees every key it reads (one token a row), so no mask is passed, as alone."""
    inner = wrappable(runner)
    if inner is None:
        yield
        return
    name, configs = register(inner), _configs(runner.model)
    with _LOCK:
        for config in configs:
            _USERS[id(config)] = _USERS.get(id(config), 0) + 1
            config._attn_implementation_internal = name
    _LOCAL.rows = (lengths, masked)
    try:
        yield
    finally:
        _LOCAL.rows = None
        with _LOCK:
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
