"""Does drawing the live view slow decoding? Gradio-free paired A/B (runs where gradio is not installed, e.g. a GPU box).

A: the engine alone.  B: `record_live` (engine in its worker thread) with the studio's redraw on every batch:
draft tree, matrix window, chart (as JSON), coloured answer text. Same prompt, matrix reset before every run.
Prints tokens/s (engine-timed) of both, the per-pair ratio, and the drawing thread's CPU time.

    python scripts/measure_live_overhead.py [--model M] [--device cuda] [--max-new 128] [--pairs 5] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tr_core import DecodeConfig, Engine, load_model  # noqa: E402
from present.chart import accepted_chart  # noqa: E402
from present.chat import coloured_markdown  # noqa: E402
from present.heatmap import MatrixTracker, heatmap_figure  # noqa: E402
from present.meter import MeterView as Speed, meter_html  # noqa: E402
from present.tree import tree_figure  # noqa: E402
from studio.recording import record_live  # noqa: E402
from tr_core.trace import Trace, boundaries_from_texts  # noqa: E402

PROMPTS = [
    "Write a Python function that checks whether a string is a palindrome, with a short docstring.",
    "Summarize in two sentences why the sky is blue.",
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None)
    p.add_argument("--device", default=None)
    p.add_argument("--max-new", type=int, default=128)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--template", default="2.2.2")
    p.add_argument("--every", type=float, default=0.25, help="redraw interval (s), as in the app")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model(args.model, device=args.device)
    engine = Engine(model, tokenizer, topk_candidates=8)
    cfg = DecodeConfig(max_new_tokens=args.max_new, template=args.template)

    def direct(ids: list[int]) -> float:
        engine.matrix.reset()
        return list(engine.generate(ids, cfg))[-1].tokens_per_s

    def live(ids: list[int]) -> tuple[float, int, float]:
        engine.matrix.reset()
        trace, tracker = Trace(), MatrixTracker()
        text_of = trace.cached_text(engine.token_text)
        redraws, cpu0 = 0, time.thread_time()
        for new in record_live(engine, ids, cfg, trace, threading.Event(), args.every):
            for ev in new:
                tracker.update(ev)
            ev = trace.steps[-1]
            for fig in (tree_figure(ev, text_of), heatmap_figure(tracker, ev, text_of), accepted_chart(trace.steps)):
                fig.to_json()
            coloured_markdown(trace.answer, boundaries_from_texts(trace.step_texts))
            meter_html(Speed(tr_tps=1.0))
            redraws += 1
        return trace.summary.tokens_per_s, redraws, time.thread_time() - cpu0

    rows = []
    for prompt in PROMPTS:
        ids = engine.encode_chat([{"role": "user", "content": prompt}])
        direct(ids), live(ids)  # warm-up
        for rep in range(args.pairs):
            d = direct(ids)
            a, redraws, cpu = live(ids)
            rows.append(dict(prompt=prompt[:40], direct_tps=d, live_tps=a, ratio=a / d, redraws=redraws, draw_cpu_s=cpu))
            print(f"{prompt[:30]!r} pair {rep}: engine alone {d:.1f} tok/s, live view {a:.1f} tok/s (ratio {a / d:.3f}); "
                  f"{redraws} redraws, drawing thread CPU {cpu:.3f} s", flush=True)
    ratio = statistics.median(r["ratio"] for r in rows)
    meta = dict(device=str(engine.device), dtype=str(engine.dtype), template=args.template, max_new=args.max_new,
                gpu=torch.cuda.get_device_name() if torch.cuda.is_available() else None, median_ratio=ratio,
                date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()))
    print(f"median ratio live / engine alone: {ratio:.3f}  ({meta})")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))


if __name__ == "__main__":
    main()
