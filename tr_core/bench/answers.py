"""One timed answer, as the benchmark measures it: through the engine (`vanilla`, `recycling`) or through
transformers' own `generate` (`hf`, and `pld`: its prompt lookup decoding), cut the same way at the stop token; and
`generate` on several prompts at once, left-padded (`hf` under `--concurrency`)."""
from __future__ import annotations

import argparse
import contextlib
import time

from ..config import DecodeConfig
from ..cost import sync  # wall times wait for queued GPU work


def cut_at_stop(ids: list[int], stop_ids: set[int], max_new_tokens: int) -> tuple[list[int], list[int]]:
    """Return (emitted, answer): ids cut at max_new_tokens and after the first stop token; answer drops the stop."""
    ids = list(ids[:max_new_tokens])
    for i, t in enumerate(ids):
        if t in stop_ids:
            return ids[: i + 1], ids[:i]
    return ids, ids


def engine_answer(engine, cfg: DecodeConfig, ids: list[int], stop_ids: set[int]) -> dict:
    """Answer `ids` through the engine; returns emitted/answer ids, seconds, steps, accepted lengths, tree nodes."""
    from ..events import StepEvent, SummaryEvent

    accepted: list[int] = []
    nodes = 0
    summary = None
    sync(engine.device)
    t0 = time.perf_counter()
    for ev in engine.generate(ids, cfg):
        if isinstance(ev, StepEvent):
            accepted.append(len(ev.emitted))
            nodes += len(ev.tokens)
        elif isinstance(ev, SummaryEvent):
            summary = ev
    sync(engine.device)
    seconds = time.perf_counter() - t0
    assert summary is not None, "the engine must end with a SummaryEvent"
    emitted, answer = cut_at_stop(summary.tokens, stop_ids, cfg.max_new_tokens)
    return {"emitted": emitted, "answer": answer, "seconds": seconds, "steps": summary.steps,
            "accepted": accepted, "tree_nodes": nodes}


def generation_config(kind: str, max_new: int, stop_ids: set[int], args: argparse.Namespace):
    """transformers' GenerationConfig of the `hf` or `pld` baseline, with the run's sampling settings."""
    from transformers import GenerationConfig

    sample = args.temperature > 0
    stop = sorted(stop_ids)
    gen = dict(max_new_tokens=max_new, do_sample=sample, eos_token_id=stop, pad_token_id=stop[0],
               repetition_penalty=args.repetition_penalty)
    if sample:
        gen.update(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    if kind == "pld":
        gen.update(prompt_lookup_num_tokens=args.pld_tokens, max_matching_ngram_size=args.pld_ngram)
    return GenerationConfig(**gen)


def transformers_answer(model, kind: str, ids: list[int], max_new: int, stop_ids: set[int],
                        args: argparse.Namespace, tuned: bool, seed: int) -> dict:
    """Answer `ids` with transformers' `generate` (`kind` "hf" or "pld"), counting the model's forwards as steps; with
    `tuned`, through the engines' timed matrix products, so that a speedup measures the method alone."""
    import torch

    from ..kernels import installed

    config = generation_config(kind, max_new, stop_ids, args)
    device = next(model.parameters()).device
    inputs = torch.tensor([ids], dtype=torch.long, device=device)
    forwards: list[int] = []  # one item per forward, counted by a hook (the public nn.Module API)
    handle = model.register_forward_pre_hook(lambda module, inp: forwards.append(1))
    try:
        if config.do_sample:
            torch.manual_seed(seed)
        with torch.inference_mode(), installed(model) if tuned else contextlib.nullcontext():
            sync(device)
            t0 = time.perf_counter()
            out = model.generate(inputs, attention_mask=torch.ones_like(inputs), generation_config=config)
            sync(device)
            seconds = time.perf_counter() - t0
    finally:
        handle.remove()
    emitted, answer = cut_at_stop(out[0, inputs.shape[1]:].tolist(), stop_ids, max_new)
    return {"emitted": emitted, "answer": answer, "seconds": seconds, "steps": len(forwards) or None,
            "accepted": [], "tree_nodes": 0}


def transformers_batch(model, prompts: list[list[int]], max_new: int, stop_ids: set[int], args: argparse.Namespace,
                       tuned: bool, seed: int) -> dict:
    """transformers' `generate` (`hf`) on all `prompts` at once, left-padded, each row with its attention mask: the
    per-prompt emitted/answer ids and the wall seconds of the whole batch (steps unknown: one forward serves all)."""
    import torch

    from ..kernels import installed

    config = generation_config("hf", max_new, stop_ids, args)
    device = next(model.parameters()).device
    width = max(len(ids) for ids in prompts)
    pad = [width - len(ids) for ids in prompts]
    inputs = torch.tensor([[config.pad_token_id] * n + list(ids) for n, ids in zip(pad, prompts)], device=device)
    mask = torch.tensor([[0] * n + [1] * len(ids) for n, ids in zip(pad, prompts)], device=device)
    if config.do_sample:
        torch.manual_seed(seed)
    with torch.inference_mode(), installed(model) if tuned else contextlib.nullcontext():
        sync(device)
        t0 = time.perf_counter()
        out = model.generate(inputs, attention_mask=mask, generation_config=config)
        sync(device)
        seconds = time.perf_counter() - t0
    cut = [cut_at_stop(row[width:].tolist(), stop_ids, max_new) for row in out]
    return {"emitted": [e for e, _ in cut], "answers": [a for _, a in cut], "seconds": seconds, "steps": None,
            "tree_nodes": 0}
