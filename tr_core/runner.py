"""Model plumbing shared by the engine and the profiler: one forward of [1, N] tokens over a TreeKVCache.

Grouped key/value heads on a CPU: with a mask, transformers' SDPA copies every key/value head per query head unless
GQA_SWITCH is set; then torch's SDPA (2.5+) reads them itself, bitwise the same and faster (98 against 125 ms, 8
tokens after 2,000). The switch is process-wide: every CPU model of the process gets it unless the user set it."""
from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from . import invariant
from .kv_cache import TreeKVCache, repeated_cache
from .tree import attention_bias

GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"  # transformers: "1" = SDPA shares grouped key/value heads even with a mask


def share_kv_heads(config: Any, device: torch.device) -> bool:
    """Set GQA_SWITCH for a grouped-heads CPU model (torch 2.5+) unless already set; True when on for this model."""
    heads, kv_heads = getattr(config, "num_attention_heads", None), getattr(config, "num_key_value_heads", None)
    grouped = isinstance(heads, int) and isinstance(kv_heads, int) and 0 < kv_heads < heads
    able = torch.__version__ >= "2.5"
    if device.type == "cpu" and grouped and able:
        os.environ.setdefault(GQA_SWITCH, "1")
    return grouped and os.environ.get(GQA_SWITCH) == "1"


TREE_LAYERS = ("full_attention", "sliding_attention")  # the layer kinds a tree passes through exactly


def _flag(obj: Any, name: str) -> bool:
    """`obj.name` (an attribute, or a key of a dict config) is True."""
    value = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return value is True


def text_config(model: Any) -> Any:
    """The config of the model's text decoder (the model's own config for a plain causal LM)."""
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def tree_blocker(config: Any) -> str | None:
    """Why a draft tree cannot go through this model in one exact forward (every layer must read positions from
    `position_ids` and visibility from the mask), or None when it can."""
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if "flash" in attn or "flex" in attn:
        return f"attention '{attn}' cannot take a tree mask; load the model with attn_implementation='sdpa'"
    kinds = sorted({str(k) for k in (getattr(config, "layer_types", None) or [])} - set(TREE_LAYERS))
    if "chunked_attention" in kinds:
        return "chunked-attention models are not supported yet"
    model_type = getattr(config, "model_type", "") or "this model"
    if kinds:
        return (f"{model_type} has layers of kind {', '.join(kinds)}: only full and sliding attention over a "
                "per-token cache take a draft tree exactly (recurrent and convolution layers carry a running state, "
                "through which sibling drafts would mix)")
    if model_type == "bloom" or _flag(config, "alibi") or _flag(getattr(config, "attn_config", None) or {}, "alibi"):
        return (f"{model_type} uses ALiBi position biases, computed from cache slots rather than positions: a draft "
                "tree's nodes would get the wrong biases")
    if "local" in (getattr(config, "attention_layers", None) or []):
        return (f"{model_type}'s local attention layers count their window in cache slots rather than positions: a "
                "draft tree's nodes would shift it")
    return None


class ModelRunner:
    """Runs an unmodified transformers causal LM on a draft tree: tokens, position ids and a tree mask."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.config = config = text_config(model)
        blocker = tree_blocker(config)
        if blocker is not None:
            raise ValueError(blocker)
        layer_types = getattr(config, "layer_types", None) or []
        self.window: int | None = getattr(config, "sliding_window", None)
        self.mixed_layers = "sliding_attention" in layer_types
        if layer_types and not self.mixed_layers:
            self.window = None  # the config names a window but no layer uses it (e.g. Qwen2 defaults)
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"
        self.has_logits_to_keep = "logits_to_keep" in params
        if getattr(config, "_attn_implementation", None) == "sdpa":
            share_kv_heads(config, self.device)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Any, cache: TreeKVCache,
                last_only: bool = False) -> torch.Tensor:
        """One forward of input_ids [1, N] at position_ids [1, N]; returns logits [N, V] ([1, V] with last_only)."""
        kwargs = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": mask,
                  self.cache_arg: cache, "use_cache": True}
        if last_only and self.has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        logits = self.model(**kwargs).logits[0]
        return logits[-1:] if last_only else logits

    def forward_rows(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Any,
                     cache: TreeKVCache) -> torch.Tensor:
        """One forward of several rows, input_ids [B, N] at position_ids [B, N]; returns logits [B, N, V]."""
        return self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                          **{self.cache_arg: cache}, use_cache=True).logits

    def prefill(self, ids: list[int], cache: TreeKVCache) -> torch.Tensor | None:
        """Run `ids` from position 0 into the cache (causal mask); the last token's logits [1, V], None if empty. In
        exact mode, through the library's products (`invariant.relaxed`)."""
        if not ids:
            return None
        t = torch.tensor([ids], dtype=torch.long, device=self.device)
        with invariant.relaxed():  # exact mode's prompts: the library's products (invariant.relaxed says why)
            return self.forward(t, torch.arange(len(ids), device=self.device)[None], None, cache, last_only=True)

    def prefill_rows(self, rows: list[list[int]], past: TreeKVCache | None = None,
                     start: int = 0) -> tuple[torch.Tensor, TreeKVCache]:
        """Several prompts in ONE forward, right-padded: causal attention keeps every real token's view free of
        padding. With `past`, a one-row cache of the `start` tokens that every prompt begins with (prefix.py), the
        rows hold only what follows them, from position `start`. Returns each row's last-token logits [B, V] and
        the cache, whose row i holds valid entries [0, start + len(rows[i])) (kv_cache.row_caches splits it).
        Needs `logits_to_keep` (has_logits_to_keep)."""
        lengths = [len(r) for r in rows]
        if not lengths or min(lengths) < 1:
            raise ValueError("every row needs at least one token")
        ids = torch.zeros(len(rows), max(lengths), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        ids = ids.to(self.device)
        positions = torch.arange(start, start + ids.shape[1], device=self.device)[None].expand(len(rows), -1)
        keep = sorted({n - 1 for n in lengths})  # the positions whose logits are read, shared by all rows
        cache = TreeKVCache() if past is None else repeated_cache(past, len(rows), start, start + ids.shape[1])
        logits = self.model(input_ids=ids, position_ids=positions, attention_mask=None, use_cache=True,
                            logits_to_keep=torch.tensor(keep, device=self.device), **{self.cache_arg: cache}).logits
        pick = torch.tensor([keep.index(n - 1) for n in lengths], device=self.device)
        return logits[torch.arange(len(rows), device=self.device), pick], cache

    def mask(self, tree_mask: torch.Tensor, depths: torch.Tensor, past: int) -> Any:
        """The additive mask for tree_mask [N, N], depths [N]: one tensor, or one per layer type for mixed sliding
        models; None for a one-token step within any window (the model keeps its fast path)."""
        n = tree_mask.shape[0]
        if n == 1 and self.sees_every_key(past):
            return None
        full = attention_bias(tree_mask, past, self.dtype)
        if self.window is None:
            return full
        sliding = attention_bias(tree_mask, past, self.dtype, self.window, depths)
        return {"full_attention": full, "sliding_attention": sliding} if self.mixed_layers else sliding

    def sees_every_key(self, past: int) -> bool:
        """Whether one token at position `past` sees every key before it (no sliding window hides any): then it
        needs no mask."""
        return self.window is None or past + 1 < self.window

    def context_limit(self) -> int:
        """The longest sequence the model takes (its position table), or 2^30 when it names none."""
        for name in ("max_position_embeddings", "n_positions", "n_ctx"):
            value = getattr(self.config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return 1 << 30

    @torch.no_grad()
    def vocab_size(self) -> int:
        """V from the logits' last dimension (tokenizers often report fewer ids than the model scores)."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        return self.forward(ids, ids, None, TreeKVCache()).shape[-1]
