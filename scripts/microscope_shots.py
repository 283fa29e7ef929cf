"""Screenshots of one step under the microscope: the studio's view (`microscope_view`) beside the step's tree, and
the offline HTML replay on the same step, both drawn by Chromium, to look at as a lecture hall would.

    python scripts/microscope_shots.py [--trace t.json] [--step 4] [--out /tmp/microscope]

Without --trace it records a short answer of the embedded SmolLM2 (CPU, hybrid tree). Writes live.png,
replay.png and the trace (trace.json) into --out.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from present.tree import tree_figure  # noqa: E402
from present.microscope import microscope_view  # noqa: E402
from present.replay import PLOTLY_CONFIG, json_script, plotly_js, replay_html  # noqa: E402
from studio.recording import record_live  # noqa: E402
from tr_core.trace import Trace  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
QUESTION = "List the first five prime numbers, then list them again in reverse order."


def record(template: str, tokens: int) -> Trace:
    """A short answer of the embedded model, recorded as the studio records one."""
    from tr_core import DecodeConfig, Engine, load_model

    from tr_core.warm import warm_start

    model, tokenizer = load_model(device="cpu")
    engine = Engine(model, tokenizer)
    warm_start(engine, "embedded", learn=False)  # as a new studio session starts: the shipped warm start
    messages = [{"role": "user", "content": QUESTION}]
    trace = Trace(model="SmolLM2-135M-Instruct", settings={"template": template}, messages=messages)
    cfg = DecodeConfig(max_new_tokens=tokens, template=template, provenance=True)  # the microscope's rows
    for _ in record_live(engine, engine.encode_chat(messages), cfg, trace, every_s=0.1):
        pass
    trace.record_texts(engine.token_text)
    return trace


def live_page(trace: Trace, step: int) -> str:
    """The studio's two panels side by side: the step's tree (plotly) and its microscope (escaped HTML)."""
    tree = {"fig": tree_figure(trace.steps[step], trace.token_text), "config": PLOTLY_CONFIG}
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'></head><body style='margin:8px;background:#f8fafc'>"
            "<div style='display:flex;gap:12px;align-items:flex-start'><div id='tree' style='width:640px'></div>"
            f"<div style='width:600px'>{microscope_view(trace, step)}</div></div>"
            f"<script>{plotly_js()}</script>{json_script(tree, 'tree-data')}"
            "<script>var d=JSON.parse(document.getElementById('tree-data').textContent);"
            "Plotly.newPlot('tree', d.fig.data, d.fig.layout, d.config);</script></body></html>")


def shoot(pages: dict[str, tuple[Path, int]], out: Path) -> None:
    """Open each page in headless Chromium (1280 wide), step the replay to the chosen step, screenshot it."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--headless", "--disable-gpu"])
        for name, (path, step) in pages.items():
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(path.resolve().as_uri(), wait_until="load")
            page.wait_for_timeout(800)
            if name == "replay":
                for _ in range(step):
                    page.click("#tr-next")
                page.wait_for_timeout(500)
                page.evaluate("window.scrollTo(0, 0)")  # from the top: the sticky step bar covers nothing
            page.screenshot(path=str(out / f"{name}.png"), full_page=True)
            page.close()
        browser.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, help="a saved trace (default: record one with the embedded model)")
    parser.add_argument("--step", type=int, default=-1, help="0-based step (default: the step that emitted most)")
    parser.add_argument("--template", default="hybrid", help="draft tree when recording")
    parser.add_argument("--tokens", type=int, default=48, help="tokens to record")
    parser.add_argument("--out", type=Path, default=Path("/tmp/microscope"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    trace = Trace.load(args.trace) if args.trace else record(args.template, args.tokens)
    trace.save(args.out / "trace.json")
    step = args.step if args.step >= 0 else max(range(len(trace.steps)), key=lambda i: len(trace.steps[i].emitted))
    (args.out / "live.html").write_text(live_page(trace, step), encoding="utf-8")
    (args.out / "replay.html").write_text(replay_html(trace), encoding="utf-8")
    shoot({"live": (args.out / "live.html", step), "replay": (args.out / "replay.html", step)}, args.out)
    print(f"step {step + 1} of {len(trace.steps)}: {args.out / 'live.png'}, {args.out / 'replay.png'}")


if __name__ == "__main__":
    main()
