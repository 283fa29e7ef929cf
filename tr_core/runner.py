"""Model plumbing shared by the engine and the profiler: one forward of [1, N] tokens over a TreeKVCache.

Everything model-specific lives here: which keyword the model takes its cache under, whether it can return
the last position's logits only, its attention kind (flash/flex and chunked attention cannot take a tree
mask) and its sliding windows (which need a sliding tree mask of their own).

Grouped key/value heads on a CPU. A tree forward passes a mask, and with a mask transformers' SDPA path copies
every key/value head once for each query head it serves (`repeat_kv`) in every layer, unless its switch
GQA_SWITCH is set; then torch's SDPA (2.5 or later) reads the shared heads itself. The logits are bitwise the
same; the copy is gone. On the 2-core AMD EPYC with 2 threads (the embedded model: 9 query heads share 3
key/value heads) an 8-token tree forward took 98 ms against 125 ms after 2,000 tokens of context, 79 against 93
after 1,000 and 74 against 80 after 400 (median of 8, interleaved). A one-token step passes no mask and shares the
heads either way. The switch is transformers' own and process-wide: on a CPU every model of the process, the
benchmark's PLD and transformers-generate baselines included, gets it (`share_kv_heads`), unless the user set it.
"""
from __future__ import annotations

import inspect
import os
from typing import Any

import torch

from .kv_cache import TreeKVCache
from .tree import attention_bias

GQA_SWITCH = "TRANSFORMERS_SDPA_FORCE_GQA"  # transformers: "1" = SDPA shares grouped key/value heads even with a mask


def share_kv_heads(config: Any, device: torch.device) -> bool:
    """Set GQA_SWITCH for a CPU model whose query heads share key/value heads (torch 2.5+, which takes
    `enable_gqa`), unless the environment already sets it; True when the switch is on for this model."""
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
    """Why a draft tree cannot go through this model in one exact forward, or None when it can.

    A tree forward needs every layer to read each token's position from `position_ids` and whom it sees from the
    mask. Refused, each with a test of the family (tests/test_engine_design.py) rather than left to give other
    tokens than plain decoding or an obscure error deep in the model:
    - flash and flex attention kernels take no arbitrary mask;
    - layers other than full or sliding attention over a per-token cache (`layer_types` such as "linear_attention",
      "conv", "mamba", "hybrid": Mamba, Jamba, Qwen3-Next, LFM2, Granite 4 hybrids, Falcon-H1) keep a running
      state, through which sibling drafts would mix; Llama 4's "chunked_attention" and kinds not checked here
      (e.g. "indexed_attention") are refused too;
    - ALiBi position biases (Bloom, MPT, Falcon with alibi=True) are computed from cache slots, not positions;
    - GPT-Neo's local layers count their window in cache slots too (a tree's nodes would shift it).
    """
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

    def prefill(self, ids: list[int], cache: TreeKVCache) -> torch.Tensor | None:
        """Run `ids` from position 0 into the cache (the model's own causal mask); the last token's logits [1, V]
        (None when `ids` is empty). The engine passes the whole prompt, or all but the last token when the first
        step's tree needs its own forward."""
        if not ids:
            return None
        t = torch.tensor([ids], dtype=torch.long, device=self.device)
        return self.forward(t, torch.arange(len(ids), device=self.device)[None], None, cache, last_only=True)

    def mask(self, tree_mask: torch.Tensor, depths: torch.Tensor, past: int) -> Any:
        """The additive tree mask for this model: one tensor, or one per layer type for mixed sliding models.

        tree_mask: [N, N] bool ancestry; depths: [N]. A one-token step sees everything (within any window):
        no mask, so the model keeps its usual fast path.
        """
        n = tree_mask.shape[0]
        if n == 1 and (self.window is None or past + 1 < self.window):
            return None
        full = attention_bias(tree_mask, past, self.dtype)
        if self.window is None:
            return full
        sliding = attention_bias(tree_mask, past, self.dtype, self.window, depths)
        return {"full_attention": full, "sliding_attention": sliding} if self.mixed_layers else sliding

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
