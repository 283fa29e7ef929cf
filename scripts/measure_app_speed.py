"""Does the studio slow decoding? Paired A/B in one process, same prompt, matrix reset before every run.

A: the engine alone (what `python -m tr_core generate` does).
B: the app's `respond()` handler: engine in its worker thread, the handler building figures and text, and every
   yielded update post-processed and JSON-encoded as Gradio would before sending it to the browser.

Prints tokens/s of both (engine-timed, SummaryEvent.tokens_per_s), their ratio per pair, and the CPU time the
handler thread used per answer. Not a pytest test (timings on a shared CPU are noisy); run it by hand:

    python scripts/measure_app_speed.py [max_new_tokens=64] [torch_threads=1] [pairs=5]
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from studio import handlers as h  # noqa: E402
from studio.config import StudioConfig  # noqa: E402
from studio.models import ModelCatalog  # noqa: E402
from studio.page import build_demo  # noqa: E402
from studio.session import Session  # noqa: E402
from tr_core import DecodeConfig, Engine, load_model  # noqa: E402

PROMPT = "Write a Python function that checks whether a string is a palindrome, with a short docstring."


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 64
    torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
    pairs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    studio = h.Studio(config=StudioConfig(), catalog=ModelCatalog(StudioConfig()), default_template="2.2.2")
    demo = build_demo(studio)
    components = {key: next(c for c in demo.blocks.values() if getattr(c, "elem_id", None) == elem)
                  for key, elem in (("chat", "tr-chat"), ("tree", "tr-tree"), ("heat", "tr-heat"), ("chart", "tr-chart"),
                                    ("meter", "tr-meter-box"), ("status", "tr-status"))}
    model, tokenizer = load_model()
    engine = Engine(model, tokenizer, topk_candidates=8)
    ids = engine.encode_chat([{"role": "user", "content": PROMPT}])

    def direct() -> float:
        engine.matrix.reset()
        return list(engine.generate(ids, DecodeConfig(max_new_tokens=n)))[-1].tokens_per_s

    def via_app() -> tuple[float, int, float, float]:
        engine.matrix.reset()
        session = Session(engine=engine, k=8)
        updates, cpu0, wall0 = 0, time.thread_time(), time.perf_counter()
        notes: list[str] = []
        settings = h.parse_settings(studio, dict(max_new_tokens=n, template="2.2.2", compare=False), notes)
        for out in h.respond(studio, session, PROMPT, settings, notes):
            for key, value in out.items():  # what Gradio does with every yield
                if key not in components:
                    continue
                data = components[key].postprocess(value)
                json.dumps(data.model_dump() if hasattr(data, "model_dump") else data, default=str)
            updates += 1
        return session.trace.summary.tokens_per_s, updates, time.thread_time() - cpu0, time.perf_counter() - wall0

    direct(), via_app()  # warm-up
    ratios = []
    for rep in range(pairs):
        if rep % 2 == 0:  # alternate the order (ABBA) so that a drifting machine load favours neither side
            d = direct()
            a, updates, cpu, wall = via_app()
        else:
            a, updates, cpu, wall = via_app()
            d = direct()
        ratios.append(a / d)
        print(f"pair {rep}: engine alone {d:.2f} tok/s, through the app {a:.2f} tok/s (ratio {a / d:.3f}); "
              f"{updates} UI updates, handler thread CPU {cpu:.2f} s of {wall:.1f} s", flush=True)
    print(f"median ratio app / engine alone: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
