"""One timed answer: through the engine (`vanilla`, `recycling`) or transformers' `generate` (`hf`, `pld`), cut the
same way at the stop token."""
from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterable
from typing import Any

import torch
from transformers import GenerationConfig

from ..config import DecodeConfig
from ..cost import sync  # wall times wait for queued GPU work
from ..events import StepEvent, SummaryEvent
from ..kernels import installed


def cut_at_stop(ids: list[int], stop_ids: set[int], max_new_tokens: int) -> tuple[list[int], list[int]]:
    """Return (emitted, answer): ids cut at max_new_tokens and after the first stop token; answer drops the stop."""
    ids = list(ids[:max_new_tokens])
    for i, t in enumerate(ids):
        if t in stop_ids:
            return ids[: i + 1], ids[:i]
    return ids, ids


def timed_decode(device, events: Iterable[tuple[int, Any]]) -> tuple[float, list[StepEvent], dict[int, SummaryEvent]]:
    """Consume a decode's (row, event) pairs: the wall seconds, the step events and each row's summary."""
    steps, summaries = [], {}
    sync(device)
    t0 = time.perf_counter()
    for row, ev in events:
        if isinstance(ev, StepEvent):
            steps.append(ev)
        elif isinstance(ev, SummaryEvent):
            summaries[row] = ev
    sync(device)
    return time.perf_counter() - t0, steps, summaries


def engine_answer(engine, cfg: DecodeConfig, ids: list[int], stop_ids: set[int]) -> dict:
    """Answer `ids` through the engine; returns emitted/answer ids, seconds, steps, accepted lengths, tree nodes."""
    seconds, steps, summaries = timed_decode(engine.device, ((0, ev) for ev in engine.generate(ids, cfg)))
    emitted, answer = cut_at_stop(summaries[0].tokens, stop_ids, cfg.max_new_tokens)
    return {"emitted": emitted, "answer": answer, "seconds": seconds, "steps": summaries[0].steps,
            "accepted": [len(s.emitted) for s in steps], "tree_nodes": sum(len(s.tokens) for s in steps)}


def generation_config(kind: str, max_new: int, stop_ids: set[int], args: argparse.Namespace) -> GenerationConfig:
    """transformers' GenerationConfig of the `hf` or `pld` baseline, with the run's sampling settings."""
    sample = args.temperature > 0
    stop = sorted(stop_ids)
    gen = dict(max_new_tokens=max_new, do_sample=sample, eos_token_id=stop, pad_token_id=stop[0],
               repetition_penalty=args.repetition_penalty)
    if sample:
        gen.update(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    if kind == "pld":
        gen.update(prompt_lookup_num_tokens=args.pld_tokens, max_matching_ngram_size=args.pld_ngram)
    return GenerationConfig(**gen)


def transformers_batch(model, prompts: list[list[int]], max_new: int, stop_ids: set[int], args: argparse.Namespace,
                       tuned: bool, seed: int, kind: str = "hf") -> dict:
    """transformers' `generate` on all `prompts` at once, left-padded with attention masks: per-prompt emitted/answer
    ids, the wall seconds and the model's forwards; with `tuned`, through the engines' timed matrix products."""
    config = generation_config(kind, max_new, stop_ids, args)
    device = next(model.parameters()).device
    width = max(len(ids) for ids in prompts)
    pad = [width - len(ids) for ids in prompts]
    inputs = torch.tensor([[config.pad_token_id] * n + list(ids) for n, ids in zip(pad, prompts)], device=device)
    mask = torch.tensor([[0] * n + [1] * len(ids) for n, ids in zip(pad, prompts)], device=device)
    forwards: list[int] = []  # one item per forward, counted by a hook (the public nn.Module API)
    handle = model.register_forward_pre_hook(lambda module, inp: forwards.append(1))
    try:
        if config.do_sample:
            torch.manual_seed(seed)
        with torch.inference_mode(), installed(model) if tuned else contextlib.nullcontext():
            sync(device)
            t0 = time.perf_counter()
            out = model.generate(inputs, attention_mask=mask, generation_config=config)
            sync(device)
            seconds = time.perf_counter() - t0
    finally:
        handle.remove()
    cut = [cut_at_stop(row[width:].tolist(), stop_ids, max_new) for row in out]
    return {"emitted": [e for e, _ in cut], "answers": [a for _, a in cut], "seconds": seconds,
            "forwards": len(forwards), "steps": None, "tree_nodes": 0}  # steps: one forward serves every row


def transformers_answer(model, kind: str, ids: list[int], max_new: int, stop_ids: set[int],
                        args: argparse.Namespace, tuned: bool, seed: int) -> dict:
    """Answer `ids` with `generate` (`kind` "hf" or "pld"), counting the model's forwards as steps."""
    out = transformers_batch(model, [ids], max_new, stop_ids, args, tuned, seed, kind)
    return {"emitted": out["emitted"][0], "answer": out["answers"][0], "seconds": out["seconds"],
            "steps": out["forwards"] or None, "accepted": [], "tree_nodes": 0}
