"""What recording the rows each step read costs: the engine's median overhead per step (step time minus the model
forward) with the rows read gathered and synced, and without (the gather replaced by nothing), answers interleaved.

    python scripts/microscope_overhead.py [--template 2.2.2] [--answers 3] [--tokens 48]

Embedded SmolLM2 on this machine's device; greedy, so both variants decode the same tokens.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tr_core.engine as engine_module  # noqa: E402
from tr_core import DecodeConfig, Engine, StepEvent, load_model  # noqa: E402

PROMPTS = ["Write a Python function that returns the n-th Fibonacci number, with a docstring.",
           "List the planets of the solar system in order, one per line, with one fact each.",
           "Explain in three sentences why the sky is blue."]


@contextmanager
def without_reads():
    """The engine with nothing gathered for the rows read (an empty part in the sync, no decoding on the host)."""
    packed, decode = engine_module.packed_rows, engine_module.rows_read
    engine_module.packed_rows = lambda matrix, tokens: torch.empty(0, dtype=torch.float64, device=tokens.device)
    engine_module.rows_read = lambda host, sources, k: ([], [], [])
    try:
        yield
    finally:
        engine_module.packed_rows, engine_module.rows_read = packed, decode


def overheads(engine: Engine, prompt: list[int], cfg: DecodeConfig) -> tuple[list[float], list[float], int]:
    """Per step: engine overhead (ms, all but the forward), sync (ms); and the rows read over the answer."""
    engine.forget()  # each answer starts from the same empty matrix, so both variants draft the same trees
    over, sync, rows = [], [], 0
    for ev in engine.generate(prompt, cfg):
        if isinstance(ev, StepEvent) and len(ev.tokens) > 1:
            over.append(ev.timings["total"] - ev.timings["forward"])
            sync.append(ev.timings.get("sync", 0.0))
            rows += len(ev.rows_read)
    return over, sync, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--template", default="2.2.2")
    parser.add_argument("--answers", type=int, default=3, help="answers per variant (interleaved)")
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args()
    model, tokenizer = load_model()
    engine = Engine(model, tokenizer)
    cfg = DecodeConfig(template=args.template, max_new_tokens=args.tokens)
    runs = {"with reads": ([], [], 0), "without": ([], [], 0)}
    list(engine.generate(engine.encode_chat([{"role": "user", "content": "hi"}]), cfg))  # warm-up, not timed
    for j in range(args.answers):
        prompt = engine.encode_chat([{"role": "user", "content": PROMPTS[j % len(PROMPTS)]}])
        for name in (("with reads", "without") if j % 2 == 0 else ("without", "with reads")):
            if name == "without":
                with without_reads():
                    got = overheads(engine, prompt, cfg)
            else:
                got = overheads(engine, prompt, cfg)
            o, s, r = runs[name]
            runs[name] = (o + got[0], s + got[1], r + got[2])
    for name, (o, s, r) in runs.items():
        q = statistics.quantiles(o, n=4) if len(o) > 1 else [0, 0, 0]
        print(f"{args.template:8s} {name:10s}: {len(o)} drafted steps, {r} rows read; overhead median "
              f"{statistics.median(o):.3f} ms (IQR {q[0]:.3f}-{q[2]:.3f}), sync median {statistics.median(s):.3f} ms")


if __name__ == "__main__":
    main()
