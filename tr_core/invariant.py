"""Row-invariant products: every row of a forward gets the bits a one-token forward of that row would give.

A tree forward multiplies N rows at once, plain decoding one; most BLAS kernels round a row differently with the
row count, and in bfloat16 near ties between the two best tokens then flip (docs/exactness.md). Exact mode routes
both through products whose rows do not depend on how many share them:
- linear layers in chunks of at most `width` rows, a product this machine's kernels were *probed* to round the
  same at every count up to `width` (`choose`), on the model's own layer shapes: whole matrix products where they
  hold, else the faster here of each row alone (`bmm_product`) and chunks padded to a fixed width;
- attention in float64, where q.k of bfloat16 or float32 inputs is exact and a sum's order moves it by 1e-16,
  rounded back to the model's dtype (`attention`); the KV cache stores its entries in float64 meanwhile (exactly:
  they are bfloat16 or float32 values), so that each forward converts only its new entries (`wide_storage`).
Plain decoding in the same engine uses the same products, so Token Recycling equals it token for token.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from .machine import sync

LOW_PRECISION = (torch.bfloat16, torch.float16)  # the dtypes exact mode is on in by default (near ties are common)
NAME = "tr_row_invariant"  # the attention implementation registered with transformers while exact mode runs
# chunks of any count up to width (ANY: one row as it is; RAGGED: one row as two, off the matrix-vector path), or
# padded to width
ANY, RAGGED, PADDED = "any", "ragged", "padded"
MM, ONEDNN, BMM, BMV = "mm", "onednn", "bmm", "bmv"  # W @ c^T by torch.mm, by oneDNN on weights packed once
# (kernels.py supplies it), each row alone in one batched call (bmm_product), or the same with a lone row through
# F.linear (bmv_product: a plain step's matrix-vector product, where it was probed to give bmm's bits)
# the first of FAST row-invariant on every layer shape is used: oneDNN is the fastest tree product on CPUs that
# have it, then whole matrix products of ragged chunks
FAST = ((ONEDNN, ANY, 32), (ONEDNN, RAGGED, 32), (MM, RAGGED, 64), (MM, RAGGED, 32), (MM, RAGGED, 16))
# else the fastest of these that is row-invariant, timed on this device (`fallback_cost`): each row alone (a CPU
# without bfloat16 matrix products multiplies a row at a time anyway), or chunks padded to a fixed width (the
# batch-invariant way, cheap where a product of 32 rows costs about one of 1, as on a GPU)
FALLBACKS = ((BMM, ANY, 32), (MM, PADDED, 32), (MM, PADDED, 16), (MM, PADDED, 8))
Product = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (chunk [n, d], weight [out, d]) -> [n, out]


@dataclass(frozen=True)
class Chunking:
    """How exact mode multiplies: `kind` (RAGGED or PADDED) chunks of at most `width` rows, by `product`."""

    kind: str
    width: int
    product: str = MM

    def describe(self) -> str:
        if self.product in (BMM, BMV):
            lone = ", a lone row by the library's product" if self.product == BMV else ""
            return (f"row-invariant products: each row alone, {self.width} rows a batched call{lone} (probed on this "
                    "device)")
        how = {ANY: "any count up to", RAGGED: "any count (one row as two) up to"}.get(self.kind, "padded to")
        return f"row-invariant products: {self.product}, chunks of {how} {self.width} rows (probed on this device)"


def mm_product(chunk: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.mm(weight, chunk.t()).t()


def bmm_product(chunk: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Each row of chunk [n, d] times weight^T on its own, in one batched call: no two rows share a sum, so a row
    gets the same bits at any n wherever the batched kernel multiplies its batch entries alike (probed)."""
    n = chunk.shape[0]
    return torch.bmm(chunk.unsqueeze(1), weight.t().unsqueeze(0).expand(n, -1, -1)).squeeze(1)


def bmv_product(chunk: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """`bmm_product`, but a lone row (every plain step) by F.linear: a CPU's matrix-vector product is about 30%
    faster than a batched call of one (576x576 bfloat16: 0.066 against 0.095 ms on an AMD EPYC, 2026-12-08). Row-
    invariant only where F.linear rounds a row as bmm does: the probe (`is_row_invariant`) decides."""
    return F.linear(chunk, weight) if chunk.shape[0] == 1 else bmm_product(chunk, weight)


# what every device has (kernels.py adds oneDNN)
PRODUCTS: dict[str, Product] = {MM: mm_product, BMM: bmm_product, BMV: bmv_product}


def chunked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, rows: int,
                   chunking: Chunking, product: Product = mm_product) -> torch.Tensor:
    """F.linear of x [..., d] (`rows` rows) by `product` over chunks of the rows, each as `chunking` says."""
    flat = x.reshape(rows, x.shape[-1])
    if rows <= chunking.width:  # one chunk (every tree on a CPU, and each plain step): no list, no cat
        out = _chunk_product(flat, weight, chunking, product).contiguous()
    else:
        out = torch.cat([_chunk_product(flat[i:i + chunking.width], weight, chunking, product)
                         for i in range(0, rows, chunking.width)])
    if bias is not None:
        out = out + bias
    return out.view(*x.shape[:-1], weight.shape[0])


def _chunk_product(chunk: torch.Tensor, weight: torch.Tensor, chunking: Chunking, product: Product) -> torch.Tensor:
    """One chunk's product: as it is (ANY), one row as two (RAGGED: a one-row product would take the
    matrix-vector path), or padded to the width (PADDED)."""
    n = chunk.shape[0]
    if chunking.kind == PADDED and n < chunking.width:
        chunk = torch.cat((chunk, chunk.new_zeros(chunking.width - n, chunk.shape[1])))
    elif n == 1 and chunking.kind == RAGGED:
        chunk = chunk.expand(2, -1) if product is mm_product else torch.cat((chunk, chunk))
    else:
        return product(chunk, weight)
    return product(chunk, weight)[:n]


def is_row_invariant(weight: torch.Tensor, chunking: Chunking, product: Product = mm_product, seed: int = 0) -> bool:
    """Whether every row of chunked products of several row counts (within and across chunks) has the bits of
    that row multiplied alone, on random inputs of `weight`'s shape, dtype and device (False where it fails)."""
    w = chunking.width
    counts = sorted({1, 2, 3, 5, 8, w // 2 + 1, w - 1, w, w + 1, 2 * w + 3} - {0})
    g = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(max(counts), weight.shape[1], generator=g).to(weight.device, weight.dtype)
    try:
        alone = torch.cat([chunked_linear(x[r:r + 1], weight, None, 1, chunking, product) for r in range(len(x))])
        return all(torch.equal(chunked_linear(x[:n], weight, None, n, chunking, product), alone[:n]) for n in counts)
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):  # a product this build cannot run
        return False


def choose(weights: list[torch.Tensor], products: dict[str, Product] | None = None) -> Chunking | None:
    """The chunking exact mode multiplies `weights` by, among `products` (default: torch.mm and bmm_product): the
    first of FAST that is row-invariant on every distinct layer shape, else the fastest of FALLBACKS here that is
    (None: none is)."""
    products = products or PRODUCTS
    layers = Counter((tuple(w.shape), w.stride(), w.dtype, w.device) for w in weights)
    layouts = tuple(sorted(layers.items(), key=str))
    key = (layouts, tuple(sorted(products)))
    if key not in _CHOSEN:  # the probe depends only on the layouts and products: once per process
        _CHOSEN[key] = _probe(layouts, products)
    return _CHOSEN[key]


_CHOSEN: dict[tuple, Chunking | None] = {}


def _probe(layouts: tuple, products: dict[str, Product]) -> Chunking | None:
    samples = [(torch.empty_strided(shape, stride, dtype=dtype, device=device).normal_(0, 0.05), count)
               for (shape, stride, dtype, device), count in layouts]

    def holds(chunking: Chunking) -> bool:
        return chunking.product in products and all(is_row_invariant(w, chunking, products[chunking.product])
                                                    for w, _ in samples)

    fast = (Chunking(kind, width, name) for name, kind, width in FAST)
    chosen = next((chunking for chunking in fast if holds(chunking)), None)
    if chosen is not None:
        return chosen
    offered = [Chunking(kind, width, name) for name, kind, width in FALLBACKS if name in products]
    if len(offered) > 1:  # timed first (a probe of wide padded chunks takes longer than timing them)
        offered.sort(key=lambda chunking: fallback_cost(samples, chunking, products[chunking.product]))
    chosen = next((chunking for chunking in offered if holds(chunking)), None)
    if chosen is not None and chosen.product == BMM:  # a plain step's faster product where it rounds as bmm does
        lone = replace(chosen, product=BMV)  # (not timed: the two differ at one row only, where noise would decide)
        chosen = lone if holds(lone) else chosen
    return chosen


COST_ROWS = (1, 8)  # a plain step's row, and a tree's rows on a CPU: what a fallback is timed on


def fallback_cost(samples: list[tuple[torch.Tensor, int]], chunking: Chunking, product: Product) -> float:
    """Seconds one forward's products take by `chunking`, at each of COST_ROWS rows (their sum): every (weight,
    number of layers of its shape), the median of 3 after a first call."""
    total = 0.0
    for weight, count in samples:
        for rows in COST_ROWS:
            x = torch.randn(rows, weight.shape[1], dtype=weight.dtype, device=weight.device)
            times = []
            for _ in range(4):
                sync(weight.device)
                began = time.perf_counter()
                chunked_linear(x, weight, None, rows, chunking, product)
                sync(weight.device)
                times.append(time.perf_counter() - began)
            total += count * sorted(times[1:])[1]
    return total


def attention(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
              softcap: float | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """Attention as transformers' eager one computes it, in float64: query [B, H, N, d], key and value
    [B, Hkv, L, d], an additive or boolean mask [B, 1, N, >=L] (None: every key); returns [B, N, H, d] in query's
    dtype. torch's fused attention runs it (its keys in blocks, no [N, L] scores kept: 2x faster than the eager
    steps at 40 rows of 600 keys on an AMD EPYC, 2026-12-06); soft-capped scores take the eager steps."""
    if softcap:
        return _eager_attention(query, key, value, attention_mask, scaling, softcap), None
    wide = torch.float64 if not is_relaxed() else query.dtype  # a prompt's forward: the model's own dtype
    mask = None if attention_mask is None else attention_mask[..., : key.shape[2]]
    if mask is not None and mask.dtype != torch.bool:
        mask = mask.to(wide)
    out = F.scaled_dot_product_attention(query.to(wide), key.to(wide), value.to(wide), attn_mask=mask, scale=scaling,
                                         enable_gqa=query.shape[1] != key.shape[1])
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _eager_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attention_mask: torch.Tensor | None,
                     scaling: float | None, softcap: float) -> torch.Tensor:
    """`attention` step by step (soft-capping between the product and the softmax), in float64."""
    b, heads, n, d = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    groups = heads // kv_heads  # grouped heads share a key: their queries are rows of one product with it
    q = query.double().reshape(b, kv_heads, groups * n, d)
    scores = torch.matmul(q, key.double().transpose(2, 3)).view(b, kv_heads, groups, n, length)
    scores *= scaling if scaling is not None else d ** -0.5
    scores = torch.tanh(scores / softcap) * softcap
    if attention_mask is not None:
        mask = attention_mask[..., :length].unsqueeze(2)  # [B, 1, 1, N, L]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    weights = torch.softmax(scores, dim=-1).view(b, kv_heads, groups * n, length)
    out = torch.matmul(weights, value.double()).to(query.dtype)
    return out.view(b, heads, n, d).transpose(1, 2).contiguous()


_WIDE = threading.local()  # how deep this thread is in exact mode's forwards (kernels.installed)
_RELAXED = threading.local()  # how deep this thread is in a prompt's forward (`relaxed`)


@contextlib.contextmanager
def relaxed() -> Iterator[None]:
    """This thread's forwards in the block take the library's products and attention in the model's dtype: a
    prompt's forward (all but its last token). Plain decoding and every tree run it alike, with the same rows, and
    no other forward's rows are compared with its rows, so it needs no row-invariant products; the prompt's last
    token goes through the first step's forward, which has them. 1.4-1.8x faster than float64 attention and chunked
    products over 298 prompt tokens (SmolLM2-135M in bfloat16, 2 AMD EPYC cores, 2026-12-07, two runs). A batch in
    exact mode runs each prompt's forward alone (batch.prefill_together), so that its rows equal those alone."""
    _RELAXED.depth = getattr(_RELAXED, "depth", 0) + 1
    try:
        yield
    finally:
        _RELAXED.depth -= 1


def is_relaxed() -> bool:
    """Whether this thread is inside `relaxed`."""
    return getattr(_RELAXED, "depth", 0) > 0


@contextlib.contextmanager
def wide_storage() -> Iterator[None]:
    """KV caches first written by this thread inside the block store float64 (`storage_dtype`)."""
    _WIDE.depth = getattr(_WIDE, "depth", 0) + 1
    try:
        yield
    finally:
        _WIDE.depth -= 1


def storage_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a KV cache first written now stores `dtype` entries in: float64 inside exact mode's forwards."""
    return torch.float64 if getattr(_WIDE, "depth", 0) and dtype.is_floating_point else dtype


def register() -> None:
    """Make NAME an attention implementation transformers knows (with the eager additive mask); idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface, eager_mask

    if NAME not in ALL_MASK_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, attention)
        AttentionMaskInterface.register(NAME, eager_mask)


def attention_configs(model: Any) -> list[Any]:
    """Every config object `model`'s modules read their attention implementation from (each once)."""
    found: dict[int, Any] = {}
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "_attn_implementation_internal"):
            found.setdefault(id(config), config)
    return list(found.values())


# held while a model's attention name is changed: here, and by rows_attention for one batched forward
ATTENTION_LOCK = threading.RLock()
ROWS_PREFIX = "tr_rows:"  # rows_attention's names: its prefix, then the name of the attention it calls


def own_name(name: str | None) -> str | None:
    """The attention a name runs: rows_attention's name without its prefix."""
    return name[len(ROWS_PREFIX):] if name and name.startswith(ROWS_PREFIX) else name


@contextlib.contextmanager
def attention_installed(model: Any) -> Iterator[None]:
    """`model`'s attention computed by `attention` for the block; every config gets its own value back."""
    register()
    configs = attention_configs(model)
    with ATTENTION_LOCK:
        held = [own_name(config._attn_implementation_internal) for config in configs]
        for config in configs:
            config._attn_implementation_internal = NAME
    try:
        yield
    finally:
        with ATTENTION_LOCK:
            for config, value in zip(configs, held):
                config._attn_implementation_internal = value
