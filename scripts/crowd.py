"""A class at once: N visitors ask the studio different questions at the same moment, measured from outside.

Launches `app.py --public` on a free port (or uses --url), starts N gradio_client visitors in threads, each with
its own session and a different question, and prints: how many were answered, when the first answer text reached
each (median, p95, last), the crowd's total tokens/s, and whether every answer equals that question answered
alone by a fresh engine with the same settings (the studio's warm start, tree and token budget).

    python scripts/crowd.py --visitors 30 --tokens 64
    python scripts/crowd.py --visitors 1 --tokens 64          # one visitor alone, for the ratio
"""
from __future__ import annotations

import argparse
import html
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PLACE = "In line for the shared batch: place"  # studio/answer.py waiting_status


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(port: int, public: bool = True, extra: tuple[str, ...] = ()) -> subprocess.Popen:
    """`app.py` on `port` (in public mode, as a Space serves it, unless `public` is False), with `extra` options."""
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
    return subprocess.Popen([sys.executable, str(ROOT / "app.py"), *(["--public"] if public else []), "--host",
                             "127.0.0.1", "--port", str(port), *extra], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def connect(url: str, timeout_s: float = 300.0):
    from gradio_client import Client

    end = time.monotonic() + timeout_s
    while True:
        try:
            return Client(url, verbose=False)
        except Exception:  # noqa: BLE001 - not up yet
            if time.monotonic() > end:
                raise
            time.sleep(2)


def plain(text: str) -> str:
    """The answer as text: tags and entities of the chat's HTML removed, whitespace collapsed."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", "", text))).strip()


def answer_of(result) -> str:
    """The assistant's last message in a chat output."""
    chat = result[0] if isinstance(result, (list, tuple)) else result
    for message in reversed(chat or []):
        if isinstance(message, dict) and message.get("role") == "assistant":
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(str(c.get("text", c)) if isinstance(c, dict) else str(c) for c in content)
            text = plain(str(content or "")).rstrip("▌ ").strip()
            return "" if text == "…" else text  # "…": the page's placeholder before the first token
    return ""


def trace_tokens(result) -> list[int] | None:
    """The answer's tokens, from the trace file the page offers for download (output 10 of /chat: an update whose
    value is the server's path, read here as this script launches the app on this machine)."""
    try:
        path = result[9]
        path = (path.get("path") or path.get("value")) if isinstance(path, dict) else path
        return json.loads(Path(path).read_text())["summary"]["tokens"]
    except (TypeError, IndexError, KeyError, OSError, ValueError):
        return None


def visitor(url: str, question: str, tokens: int, template: str, go: threading.Event, out: dict) -> None:
    """One visitor: a session of their own, one question, every update timed; whether they waited in line for a
    worker (Gradio's queue) or for a row of the shared batch, and whether they were shown their place meanwhile."""
    from gradio_client.utils import Status

    client = connect(url)
    go.wait()
    start = time.monotonic()
    job = client.submit(question, tokens, 0.0, 1.0, 0, 0, template, False, 8, 0.0, False, 1.0, api_name="/chat")
    first, queued, shown, read = None, False, False, 0
    while not job.done():
        status, outputs = job.status(), job.outputs()
        if status.code == Status.QUEUE_FULL:
            out.update(error="refused: the queue is full")
        if status.code == Status.IN_QUEUE:
            queued, shown = True, shown or status.rank is not None
        for update in outputs[read:]:  # each update read once: the client stands in for a visitor's own machine
            if any(PLACE in part for part in update if isinstance(part, str)):
                queued = shown = True
            if first is None and answer_of(update):
                first = time.monotonic() - start
        read = len(outputs)
        time.sleep(0.05)
    try:
        result = job.result()
    except Exception as exc:  # noqa: BLE001 - counted as not answered
        out.update(error=repr(exc))
        return
    out.update(first_s=first if first is not None else time.monotonic() - start, done_s=time.monotonic() - start,
               text=answer_of(result), tokens=trace_tokens(result), queued=queued, shown_place=shown)


def alone_answers(questions: list[str], tokens: int, template: str) -> list[list[int]]:
    """Each question answered by a fresh warm-started engine, as a new session of the studio is."""
    from tr_core import DecodeConfig, Engine, load_model
    from tr_core.warm import warm_start

    model, tokenizer = load_model()
    answers = []
    for q in questions:
        engine = Engine(model, tokenizer)
        warm_start(engine, None, learn=False)
        ids = engine.encode_chat([{"role": "user", "content": q}])
        summary = list(engine.generate(ids, DecodeConfig(max_new_tokens=tokens, template=template)))[-1]
        answers.append(list(summary.tokens))
    return answers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--visitors", type=int, default=30)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--template", default="hybrid")
    ap.add_argument("--questions", default=str(ROOT / "bench/data/spec_bench_dev.jsonl"))
    ap.add_argument("--url", help="a running studio (default: launch one)")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--no-compare", action="store_true",
                    help="skip answering every question alone to compare tokens (long for hundreds of visitors)")
    args = ap.parse_args()
    from tr_core.bench.questions import load_questions

    pool = [q.turns[0] for q in load_questions(args.questions)]
    if not pool:
        sys.exit(f"{args.questions} holds no questions")
    questions = [pool[i % len(pool)] for i in range(args.visitors)]  # more visitors than questions: some repeat
    proc = None
    url = args.url
    if url is None:
        port = free_port()
        proc, url = launch(port), f"http://127.0.0.1:{port}/"
    try:
        # the app is up, its model loaded and this machine's forwards timed: one short answer first, not measured
        connect(url).predict("Hello!", 4, 0.0, 1.0, 0, 0, args.template, False, 8, 0.0, False, 1.0, api_name="/chat")
        go, outs = threading.Event(), [dict() for _ in questions]
        threads = [threading.Thread(target=visitor, args=(url, q, args.tokens, args.template, go, o))
                   for q, o in zip(questions, outs)]
        for t in threads:
            t.start()
        time.sleep(3.0)  # every visitor connected
        began = time.monotonic()
        go.set()
        for t in threads:
            t.join()
        wall = time.monotonic() - began
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=30)
    report(args, questions, outs, wall)


def report(args, questions: list[str], outs: list[dict], wall: float) -> None:
    answered = [o for o in outs if o.get("text")]
    firsts = sorted(o["first_s"] for o in answered)
    alone = [None] * len(questions) if args.no_compare else alone_answers(questions, args.tokens, args.template)
    same = [o.get("tokens") == tokens for o, tokens in zip(outs, alone) if tokens is not None]
    total = sum(len(o.get("tokens") or []) for o in answered)
    figures = {"visitors": len(outs), "answered": len(answered), "tokens": args.tokens, "template": args.template,
               "first_text_median_s": statistics.median(firsts) if firsts else None,
               "first_text_p95_s": firsts[min(len(firsts) - 1, int(0.95 * len(firsts)))] if firsts else None,
               "first_text_last_s": firsts[-1] if firsts else None, "wall_s": wall,
               "crowd_tokens_per_s": total / wall,
               "tokens_identical_to_alone": sum(same) if not args.no_compare else "not compared",
               "waited_in_line": sum(bool(o.get("queued")) for o in outs),
               "shown_their_place": sum(bool(o.get("shown_place")) for o in outs),
               "done_s": sorted(round(o["done_s"], 1) for o in answered),
               "errors": [o["error"] for o in outs if "error" in o]}
    print(json.dumps(figures, indent=1))
    for i, (o, tokens) in enumerate(zip(outs, alone)):
        if tokens is not None and o.get("tokens") != tokens:
            print(f"visitor {i} differs:\n  crowd: {o.get('tokens')}\n  alone: {tokens}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
