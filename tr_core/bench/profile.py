"""`python -m tr_core profile`: the forward cost curve t(N)/t(1) of verifying N draft tree tokens.

Token Recycling verifies a whole draft tree in one forward, so its speedup is roughly
    mean accepted tokens per step / (t(N) / t(1)),
with N the tree size (root included) and t(N) the time of one forward of N query tokens over a KV cache of
realistic length. This measures t(N) for the loaded model or a Llama-shaped one with random weights (`--config
llama-1b|llama-8b`, bf16 on CUDA) and, given a measured mean accepted length (`--mean-accepted X` or a real model's
`bench --json` file), prints the projected speedup: an upper bound, as it ignores the engine's own per-step work and
the prefill. Random weights make drafts meaningless: acceptance is never measured here.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import torch

from ..cost import interpolate, measure_forward_costs
from ..kernels import describe_plan, installed
from ..runner import ModelRunner
from ..tuning import ensure_tuned
from .results import environment, utc_now

DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 80, 128)

# Llama 3.2 1B and Llama 3.1 8B shapes; "llama-tiny" is for tests.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=512, tie_word_embeddings=True),
    "llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0),
    "llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False, rope_theta=500000.0),
}


class ProfileInputError(ValueError):
    """Bad profile input, found before any model is built or loaded."""


def parse_sizes(text: str) -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique, 1 always included); raises ProfileInputError."""
    try:
        sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        raise ProfileInputError(f"--sizes: expected a comma list of integers, got {text!r}") from None
    if not sizes or sizes[0] < 1:
        raise ProfileInputError(f"--sizes: sizes must be >= 1, got {text!r}")
    return sorted({1, *sizes})


def read_bench_json(path: str | Path) -> dict[str, dict[str, float]]:
    """{method: {"mean_accepted": x, "tree_nodes": n}} of each recycling method in a `bench --json` file; raises
    ProfileInputError naming the file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ProfileInputError(f"{path}: no such file") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ProfileInputError(f"{path}: not a readable JSON file ({exc})") from None
    methods = data.get("methods") if isinstance(data, dict) else None
    if not isinstance(methods, dict):
        raise ProfileInputError(f"{path}: no 'methods' object (is it a `bench --json` file?)")
    out = {name: {"mean_accepted": float(m["mean_accepted"]), "tree_nodes": float(m["mean_tree_nodes"])}
           for name, m in methods.items()
           if m.get("kind") == "recycling" and m.get("mean_accepted") and m.get("mean_tree_nodes")}
    if not out:
        raise ProfileInputError(f"{path}: no recycling method with mean_accepted and mean_tree_nodes")
    return out


def build_random_model(name: str, device, dtype):
    """A Llama-shaped causal LM with random weights, built directly on `device` in `dtype`."""
    from transformers import LlamaConfig, LlamaForCausalLM  # seconds to import: only here

    config = LlamaConfig(**CONFIGS[name], max_position_embeddings=8192)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(previous)
    return model.to(device=device, dtype=dtype).eval()


def random_context(model, context: int) -> list[int]:
    """`context` random (seeded) token ids: what the profiler's forwards attend over."""
    gen = torch.Generator().manual_seed(0)
    return torch.randint(0, model.config.vocab_size, (context,), generator=gen).tolist()


def measure_curve(model, sizes: list[int], context: int, repeats: int, warmup: int) -> dict[int, list[float]]:
    """Seconds of one forward of N tree tokens over a `context`-token KV cache, `repeats` times per N, through the
    engine's own path and matrix products (cost.measure_forward_costs): the curve the adaptive tree acts on."""
    with torch.inference_mode(), installed(model):
        ms = measure_forward_costs(ModelRunner(model), random_context(model, context), sizes, repeats, warmup)
    return {n: [t / 1e3 for t in v] for n, v in ms.items()}


def tune_linears(model, context: int) -> dict[str, Any]:
    """Choose the linear layers' product on this machine (tuning; CPU only) and describe the choice."""
    ensure_tuned(ModelRunner(model), random_context(model, context))
    return describe_plan(model)


def summarize(times: dict[int, list[float]]) -> dict[int, dict[str, float]]:
    """Median milliseconds per N and the ratio t(N)/t(1)."""
    med = {n: statistics.median(v) for n, v in times.items()}
    return {n: {"ms": med[n] * 1e3, "ratio": med[n] / med[1], "min_ms": min(times[n]) * 1e3} for n in sorted(med)}


def projections(curve: dict[int, dict[str, float]], mean_accepted: float | None,
                bench: dict[str, dict[str, float]] | None, tree_nodes: float) -> list[dict[str, float | str]]:
    """Projected speedup = mean accepted / (t(N)/t(1)) for the given measurements."""
    ratios = {n: c["ratio"] for n, c in curve.items()}
    given = [("--mean-accepted", mean_accepted, tree_nodes)] if mean_accepted is not None else []
    given += [(name, m["mean_accepted"], m["tree_nodes"]) for name, m in (bench or {}).items()]
    rows = []
    for source, accepted, nodes in given:
        r = interpolate(ratios, nodes)
        rows.append({"source": source, "mean_accepted": accepted, "tree_nodes": nodes, "cost_ratio": r,
                     "projected_speedup": accepted / r})
    return rows


def format_report(meta: dict[str, Any], curve: dict[int, dict[str, float]], rows: list[dict]) -> str:
    """Markdown: the cost curve, then the projections."""
    lines = [f"Forward cost of N query tokens over a {meta['context']}-token KV cache: {meta['model']} on "
             f"{meta['device']} ({meta['machine']}, {meta['threads']} torch threads), {meta['dtype']}, "
             f"median of {meta['repeats']}, {meta['date']}",
             "", meta.get("linear", {}).get("summary", ""), "", "| N | ms | t(N)/t(1) |", "| ---: | ---: | ---: |"]
    lines += [f"| {n} | {c['ms']:.2f} | {c['ratio']:.2f} |" for n, c in curve.items()]
    if rows:
        lines += ["", "Projected speedup = mean accepted / (t(N)/t(1)) (upper bound: ignores drafting/verify overhead)",
                  "", "| mean accepted from | mean accepted | tree nodes N | t(N)/t(1) | projected speedup |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['source']} | {r['mean_accepted']:.2f} | {r['tree_nodes']:.1f} | {r['cost_ratio']:.2f} | "
                  f"{r['projected_speedup']:.2f}x |" for r in rows]
    return "\n".join(lines)


def run_meta(args: argparse.Namespace, model, name: str, device) -> dict[str, Any]:
    """What was measured where, for the report."""
    params = sum(p.numel() for p in model.parameters())
    return {"model": f"{name}, {params / 1e6:.1f}M params", **environment(model, device), "context": args.context,
            "repeats": args.repeats, "threads": torch.get_num_threads(), "date": utc_now()}
