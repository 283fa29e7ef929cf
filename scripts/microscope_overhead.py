"""What the microscope's provenance costs: the engine's overhead per step (SummaryEvent.overhead_ms: step time minus
the model forward) with `DecodeConfig(provenance=True)` (every step gathers and syncs the rows it read and its
candidates' origins, as every step did before provenance became opt-in) and without it, answers interleaved.

    python scripts/microscope_overhead.py [--templates hybrid,2.2.2] [--rounds 2] [--tokens 64] [--threads 1]

Embedded SmolLM2 on this machine's device, started from its shipped warm start as the studio starts; every answer
begins from the same state (a snapshot restored), greedy, so both variants decode the same tokens (a cost-sized tree
may size a few steps differently: its sizes follow the measured step times).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tr_core import DecodeConfig, Engine, StepEvent, SummaryEvent, load_model  # noqa: E402
from tr_core.warm import warm_start  # noqa: E402

PROMPTS = ["Write a Python function that returns the n-th Fibonacci number, with a docstring.",
           "List the planets of the solar system in order, one per line, with one fact each.",
           "Explain in three sentences why the sky is blue."]
VARIANTS = ("provenance on", "provenance off")


def answer(engine: Engine, start: dict, prompt: list[int], cfg: DecodeConfig) -> tuple[float, list[float], list[float]]:
    """(SummaryEvent.overhead_ms, per drafted step: overhead ms, sync ms) of one answer from the state `start`."""
    engine.restore(start)
    steps, syncs = [], []
    for ev in engine.generate(prompt, cfg):
        if isinstance(ev, StepEvent) and len(ev.tokens) > 1:
            steps.append(ev.timings["total"] - ev.timings["forward"])
            syncs.append(ev.timings.get("sync", 0.0))
        elif isinstance(ev, SummaryEvent):
            return ev.overhead_ms, steps, syncs
    raise RuntimeError("no summary")


def measure(engine: Engine, start: dict, template: str, rounds: int, tokens: int) -> dict[str, tuple]:
    """Per variant: (per-answer overhead_ms, per-drafted-step overhead ms, sync ms), the variants alternating first."""
    runs = {name: ([], [], []) for name in VARIANTS}
    prompts = [engine.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    for r in range(rounds):
        for j, prompt in enumerate(prompts):
            for name in VARIANTS if (r + j) % 2 == 0 else VARIANTS[::-1]:
                cfg = DecodeConfig(template=template, max_new_tokens=tokens, provenance=name == VARIANTS[0])
                summary, steps, syncs = answer(engine, start, prompt, cfg)
                runs[name][0].append(summary)
                runs[name][1].extend(steps)
                runs[name][2].extend(syncs)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--templates", default="hybrid,2.2.2")
    parser.add_argument("--rounds", type=int, default=2, help="rounds over the prompts (each: both variants)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model()
    engine = Engine(model, tokenizer)
    print(warm_start(engine, None, learn=False).describe())
    for template in args.templates.split(","):
        warm_up = DecodeConfig(template=template, max_new_tokens=16)
        list(engine.generate(engine.encode_chat([{"role": "user", "content": "hi"}]), warm_up))  # tuning, probes
        start = engine.snapshot()
        runs = measure(engine, start, template, args.rounds, args.tokens)
        for name, (summaries, steps, syncs) in runs.items():
            print(f"{template:8s} {name:15s}: {len(summaries)} answers, {len(steps)} drafted steps; overhead_ms per "
                  f"step, median over answers {statistics.median(summaries):.3f} ms; per drafted step median "
                  f"{statistics.median(steps) if steps else 0:.3f} ms, sync median "
                  f"{statistics.median(syncs) if syncs else 0:.3f} ms")
        on, off = (statistics.median(runs[name][0]) for name in VARIANTS)
        print(f"{template:8s} provenance costs {on - off:+.3f} ms per step ({(on - off) / max(off, 1e-9):+.0%} of the "
              f"overhead without it)")


if __name__ == "__main__":
    main()
