"""Token Recycling Studio: chat with a small LLM decoded by Token Recycling and watch every step, live.

Run `python app.py` and open http://127.0.0.1:7860 (options: --host, --port, --model, --share).
The engine runs in its own thread and times itself; the page only reads its step events and redraws
a few times per second, so the tokens/s shown are the engine's, not the browser's.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr

from tr_core.config import DecodeConfig
from tr_core.events import StepEvent, SummaryEvent
from tr_core.figures import MatrixTracker, Speed, accepted_chart, coloured_markdown, heatmap_figure, meter_html, tree_figure
from tr_core.trace import Trace, TraceError, boundaries_from_texts, record_live

try:  # Hugging Face ZeroGPU: borrow a GPU for the duration of a generation; a no-op elsewhere.
    import spaces  # type: ignore

    gpu = spaces.GPU(duration=120)
    ZEROGPU = True
except Exception:  # noqa: BLE001 - any failure means "not on ZeroGPU"
    ZEROGPU = False

    def gpu(fn):  # type: ignore[no-redef]
        return fn

ASSETS = Path(__file__).resolve().parent / "assets"
RENDER_EVERY_S = 0.25  # redraw figures at most this often while streaming
MODEL_ENV = "TR_MODEL"  # environment variable naming the default model (hub id, folder or .gguf); empty = embedded
EMBEDDED_LABEL = "embedded (SmolLM2-135M-Instruct)"
LIMITS = dict(max_new_tokens=(1, 1024), temperature=(0.0, 2.0), top_p=(0.05, 1.0), top_k=(0, 1000), seed=(0, 2**31 - 1),
              k=(1, 16), delay=(0.0, 3.0))

EXAMPLES = [
    ("Conversation", "I have a job interview tomorrow. Give me three short tips to stay calm."),
    ("Code", "Write a Python function that checks whether a string is a palindrome, with a short docstring."),
    ("Translation", "Translate to French: The weather is nice today, so we are going to the beach."),
    ("Summarization", "Summarize in two sentences: Token Recycling stores the top-k next-token candidates of every "
                        "token it has seen in an adjacency matrix. Each step it builds a draft tree from that matrix, "
                        "verifies the whole tree with one forward pass, accepts the longest correct path and then "
                        "overwrites the matrix rows with fresh candidates from the same forward pass. It needs no "
                        "extra model and no training."),
    ("Math", "A shop sells pencils at 3 for $1. How much do 12 pencils cost? Explain step by step."),
    ("RAG QA", "Context: The Eiffel Tower was completed in 1889 for the World's Fair in Paris. It is 330 metres tall "
                 "and was the tallest man-made structure until 1930.\n\nQuestion: When was the Eiffel Tower completed "
                 "and how tall is it?"),
]


# ----------------------------------------------------------------------------------------------- models


class ModelStore:
    """Models loaded in this process, shared by all sessions (each session still has its own matrix)."""

    def __init__(self, default: str | None) -> None:
        self.default = default or None
        self._models: dict[str, tuple[Any, Any]] = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(name: str | None) -> str:
        return (name or "").strip() or "embedded"

    def get(self, name: str | None) -> tuple[Any, Any]:
        """(model, tokenizer) for a name, loading it once; raises tr_core.ModelLoadError on failure."""
        from tr_core.models import load_model

        key = self.key(name)
        with self._lock:
            if key not in self._models:
                if len(self._models) >= 2:  # keep memory bounded on shared deployments
                    self._models.pop(next(k for k in self._models if k != self.key(self.default)), None)
                self._models[key] = load_model(None if key == "embedded" else key)
            return self._models[key]


STORE = ModelStore(os.environ.get(MODEL_ENV))
WARM = threading.Event()  # cleared while the start-up warm-up runs, so that no answer is timed alongside it
WARM.set()


@dataclass
class Session:
    """One browser session: its engine (and so its adjacency matrix), conversation and last trace."""

    model_name: str | None = None
    engine: Any = None
    k: int = 8
    history: list[dict[str, str]] = field(default_factory=list)  # plain text turns sent to the model
    display: list[dict[str, str]] = field(default_factory=list)  # the same turns as shown (coloured runs)
    trace: Trace | None = None
    plain_tps: float | None = None  # last measured plain tokens/s with this model (for labelled estimates)
    stop: threading.Event = field(default_factory=threading.Event)
    files: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="tr-studio-")))

    def ensure_engine(self, k: int) -> list[str]:
        """Create the engine on first use or when k changed (a new k needs a new matrix); return notes."""
        from tr_core.engine import Engine

        notes = []
        if self.engine is None or k != self.k:
            if self.engine is not None:
                notes.append(f"Candidates per row changed to k = {k}: the adjacency matrix starts empty.")
            model, tokenizer = STORE.get(self.model_name if self.model_name is not None else STORE.default)
            self.engine = Engine(model, tokenizer, topk_candidates=k)
            self.k = k
        return notes


def _session(s: Session | None) -> Session:
    return s if isinstance(s, Session) else Session()


# ------------------------------------------------------------------------------------------- helpers


def clamp(name: str, value: Any, notes: list[str], cast=float) -> Any:
    """Clamp a setting into its range (noting it), treating empty input as the range's low end."""
    lo, hi = LIMITS[name]
    try:
        v = cast(value)
    except (TypeError, ValueError):
        notes.append(f"{name} {value!r} is not a number; using {lo}.")
        return cast(lo)
    if v != v:  # NaN
        v = lo
    if v < lo or v > hi:
        notes.append(f"{name} = {value} is outside [{lo}, {hi}]; clamped.")
    return cast(min(max(v, lo), hi))


def trim_to_context(encode, messages: list[dict[str, str]], limit: int, max_new: int) -> tuple[list[int], int, int]:
    """Drop the oldest turns until prompt + answer fit the context; return (ids, turns dropped, max_new)."""
    dropped = 0
    msgs = list(messages)
    ids = encode(msgs)
    while len(ids) + max_new > limit and len(msgs) > 1:
        cut = 2 if len(msgs) > 2 and msgs[0]["role"] == "user" else 1
        msgs = msgs[cut:]
        dropped += cut
        ids = encode(msgs)
    if len(ids) + max_new > limit:
        max_new = limit - len(ids)
        if max_new < 1:
            raise ValueError(f"the message alone is {len(ids)} tokens, longer than the model's context ({limit}); shorten it")
    return ids, dropped, max_new


def summary_from_steps(steps: list[StepEvent], prompt_tokens: int, method: str, template: str) -> SummaryEvent:
    """A summary for an answer stopped early (the engine's own summary never came): engine timings only."""
    tokens = [t for e in steps for t in e.emitted]
    decode_s = sum(e.timings.get("total", 0.0) for e in steps) / 1000.0
    return SummaryEvent(tokens=tokens, prompt_tokens=prompt_tokens, new_tokens=len(tokens), steps=len(steps),
                        mean_accepted=len(tokens) / max(len(steps), 1), tokens_per_s=len(tokens) / decode_s if decode_s else 0.0,
                        prefill_s=0.0, decode_s=decode_s, wall_s=decode_s, stop_reason="stopped", method=method,
                        template=template, matrix_rows_filled=0, matrix_mb=0.0)


def matrix_info(s: Session) -> str:
    """One line about the whole matrix: rows filled, size."""
    if s.engine is None:
        return "**Adjacency matrix**: not created yet (first message loads the model)."
    m = s.engine.matrix
    rows = getattr(m.table, "shape", [0])[0]
    return (f"**Adjacency matrix** · {m.rows_filled:,} / {rows:,} rows filled · k = {s.k} · "
            f"{m.size_mb:.1f} MB · persists over this conversation")


def speed_of(trace: Trace | None, s: Session, live: bool = False) -> Speed:
    """Meter numbers for a trace: measured where measured, labelled estimates otherwise."""
    if trace is None or not trace.steps:
        return Speed(note="Send a message to measure.")
    if trace.summary is not None:
        tr_tps, mean = trace.summary.tokens_per_s, trace.summary.mean_accepted
    else:
        ms = sum(e.timings.get("total", 0.0) for e in trace.steps)
        n = sum(len(e.emitted) for e in trace.steps)
        tr_tps, mean = (n / ms * 1000 if ms else None), n / len(trace.steps)
    if trace.plain is not None:
        return Speed(tr_tps=tr_tps, plain_tps=trace.plain.tokens_per_s, plain_is_estimate=False, mean_accepted=mean,
                     identical=trace.identical, live=live,
                     note=f"{trace.summary.new_tokens if trace.summary else '?'} tokens · engine-timed, UI excluded")
    note = ("plain tok/s is an estimate from this session's previous plain run" if s.plain_tps
            else "plain decoding not measured (turn on “compare with plain decoding”)")
    return Speed(tr_tps=tr_tps, plain_tps=s.plain_tps, plain_is_estimate=True, mean_accepted=mean, live=live, note=note)


def step_views(trace: Trace, step: int) -> tuple[Any, Any, Any]:
    """Tree, heatmap and chart of one recorded step (0-based), from the trace alone."""
    step = max(0, min(step, len(trace.steps) - 1))
    tracker = MatrixTracker()
    for ev in trace.steps[: step + 1]:
        tracker.update(ev)
    ev = trace.steps[step]
    return (tree_figure(ev, trace.token_text), heatmap_figure(tracker, ev, trace.token_text),
            accepted_chart(trace.steps, current=step))


def coloured_answer(trace: Trace, upto: int | None = None, colour: bool = True) -> str:
    """The answer's markdown with alternating colours per step (up to a step, for replay)."""
    texts = trace.step_texts if upto is None else trace.step_texts[: upto + 1]
    text = "".join(texts)
    return coloured_markdown(text, boundaries_from_texts(texts)) if colour else text


# ------------------------------------------------------------------------------------------- handlers


def respond(message, s, max_new, temperature, top_p, top_k, seed, template, k, compare, delay, colour):
    """Answer one chat message with Token Recycling, streaming text and figures; then optionally time plain decoding."""
    s = _session(s)
    notes: list[str] = []
    message = (message or "").strip()
    if not message:
        yield {status: "Type a message first (or click an example).", state: s}
        return
    max_new = clamp("max_new_tokens", max_new, notes, int)
    temperature = clamp("temperature", temperature, notes)
    top_p = clamp("top_p", top_p, notes) if top_p else 1.0
    top_k = clamp("top_k", top_k, notes, int)
    seed = clamp("seed", seed, notes, int)
    k = clamp("k", k, notes, int)
    delay = clamp("delay", delay, notes)
    s.stop.clear()
    display = s.display + [{"role": "user", "content": message}, {"role": "assistant", "content": "…"}]
    yield {chatbot: display, msg: "", status: "Loading the model…" if s.engine is None else "Drafting…", state: s}
    try:
        WARM.wait(timeout=300)
        notes += s.ensure_engine(k)
        engine = s.engine
        template_name = template or "2.2.2"
        from tr_core.tree import TEMPLATE_NAMES

        if template_name not in TEMPLATE_NAMES:
            notes.append(f"Unknown template {template_name!r}; using 2.2.2.")
            template_name = "2.2.2"
        messages = s.history + [{"role": "user", "content": message}]
        ids, dropped, max_new2 = trim_to_context(engine.encode_chat, messages, engine.context_limit, max_new)
        if dropped:
            notes.append(f"⚠ The conversation is longer than the model's context ({engine.context_limit} tokens): "
                         f"the oldest {dropped} message(s) were left out of the prompt.")
        if max_new2 < max_new:
            notes.append(f"Max new tokens reduced to {max_new2} to fit the context.")
        cfg = DecodeConfig(max_new_tokens=max_new2, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                           template=template_name)
    except Exception as exc:  # noqa: BLE001 - model load / settings errors are shown, the session goes on
        yield {chatbot: s.display, msg: message, status: f"✗ {type(exc).__name__}: {exc}", state: s,
               matrix_md: matrix_info(s)}
        return

    trace = Trace(model=s.model_name or STORE.default or EMBEDDED_LABEL,
                  settings=dict(cfg.__dict__, k=k), messages=messages)
    text_of = trace.cached_text(engine.token_text)
    tracker = MatrixTracker()
    note_md = "  \n".join(notes)
    error = None
    try:
        for new_steps in record_live(engine, ids, cfg, trace, s.stop, RENDER_EVERY_S, delay):
            for ev in new_steps:
                tracker.update(ev)
            last_ev = trace.steps[-1]
            shown = coloured_answer(trace, colour=colour)
            yield {chatbot: display[:-1] + [{"role": "assistant", "content": shown + " ▌"}],
                   tree_plot: tree_figure(last_ev, text_of),
                   heat_plot: heatmap_figure(tracker, last_ev, text_of),
                   chart_plot: accepted_chart(trace.steps), meter: meter_html(speed_of(trace, s, live=True)),
                   status: note_md or f"Step {last_ev.step + 1} · {sum(len(e.emitted) for e in trace.steps)} tokens",
                   state: s}
    except Exception as exc:  # noqa: BLE001 - shown in the page; the session goes on
        error = exc

    trace.record_texts(engine.token_text)  # decoding is over: now every token's string, for the saved trace
    if trace.summary is None and trace.steps:
        trace.summary = summary_from_steps(trace.steps, len(ids), "recycling", template_name)
    elif delay > 0 and trace.summary is not None:  # the pauses fell inside the engine's wall clock: use step timings
        timed = summary_from_steps(trace.steps, len(ids), "recycling", template_name)
        trace.summary = dataclasses.replace(trace.summary, tokens_per_s=timed.tokens_per_s, decode_s=timed.decode_s)
        notes.append("Slow motion: tokens/s computed from the engine's step timings (pauses excluded).")
    if error is not None:
        notes.append(f"✗ Generation failed: {type(error).__name__}: {error}")
        traceback.print_exception(error)
    stopped = s.stop.is_set() or (trace.summary is not None and trace.summary.stop_reason == "stopped")
    if stopped:
        notes.append("■ Stopped: the answer so far is kept.")
    answer = trace.answer
    if trace.steps:
        s.history = messages + [{"role": "assistant", "content": answer}]
        s.display = display[:-1] + [{"role": "assistant", "content": coloured_answer(trace, colour=colour)}]
    else:  # nothing generated: show what was sent, but keep it out of the conversation the model sees
        s.display = display[:-1]
    s.trace = trace
    final = dict(_trace_outputs(s, trace, colour, live=False))
    final.update({chatbot: s.display, status: "  \n".join(notes) or "✓ Done.", state: s, matrix_md: matrix_info(s)})

    if compare and trace.steps and error is None and not stopped:
        final[status] = "  \n".join(notes + ["Measuring plain decoding on the same prompt and settings…"])
        yield final
        try:
            plain = None
            for ev in engine.generate(ids, cfg.with_(plain=True, max_new_tokens=cfg.max_new_tokens)):
                if isinstance(ev, SummaryEvent):
                    plain = ev
                if s.stop.is_set():
                    break
            if plain is not None:
                trace.plain = plain
                s.plain_tps = plain.tokens_per_s
                if not trace.identical:
                    notes.append("⚠ Token Recycling and plain decoding produced different tokens.")
        except Exception as exc:  # noqa: BLE001
            notes.append(f"✗ Plain decoding failed: {type(exc).__name__}: {exc}")
        final = dict(_trace_outputs(s, trace, colour, live=False))
        final.update({chatbot: s.display, status: "  \n".join(notes) or "✓ Done.", state: s, matrix_md: matrix_info(s)})
    yield final


def _trace_outputs(s: Session, trace: Trace, colour: bool, live: bool) -> dict:
    """Figures, meter, slider and download file of a finished (or loaded) trace, at its longest accepted step."""
    out: dict = {meter: meter_html(speed_of(trace, s, live=live))}
    if trace.steps:
        n = len(trace.steps)
        best = max(range(n), key=lambda i: (len(trace.steps[i].emitted), i))  # show the most telling step
        t, h, c = step_views(trace, best)
        out.update({tree_plot: t, heat_plot: h, chart_plot: c,
                    replay: gr.Slider(minimum=1, maximum=max(n, 2), value=best + 1, step=1, interactive=True,
                                      label=f"Replay step (1–{n}; showing the longest accepted run)")})
    path = s.files / "trace.json"
    trace.save(path)
    out[trace_file] = gr.DownloadButton(value=str(path), interactive=True)
    return out


def stop_generation(s):
    """Ask the running generation to stop after its current step (answer so far is kept)."""
    if isinstance(s, Session):
        s.stop.set()
    return "■ Stopping after the current step…"


def replay_step(step, s, colour):
    """Show any recorded step of the last answer: tree, matrix window, chart and the text up to that step."""
    s = _session(s)
    if s.trace is None or not s.trace.steps:
        return {status: "Nothing to replay yet: send a message or load a trace."}
    i = int(step or 1) - 1
    i = max(0, min(i, len(s.trace.steps) - 1))
    t, h, c = step_views(s.trace, i)
    disp = list(s.display)
    if disp and disp[-1]["role"] == "assistant":
        disp[-1] = {"role": "assistant", "content": coloured_answer(s.trace, upto=i, colour=colour)}
    return {tree_plot: t, heat_plot: h, chart_plot: c, chatbot: disp,
            status: f"Replaying step {i + 1} of {len(s.trace.steps)}"}


def step_by(delta: int):
    def move(step, s):
        s = _session(s)
        n = len(s.trace.steps) if s.trace else 1
        return max(1, min(int(step or 1) + delta, n))
    return move


def load_trace(file, s):
    """Load a recorded trace (JSON) and show it; needs no model."""
    s = _session(s)
    if file is None:
        return {status: "No file."}
    try:
        trace = Trace.load(file if isinstance(file, str) else file.name)
    except TraceError as exc:
        return {status: f"✗ {exc}", state: s}
    if not trace.steps:
        return {status: "✗ The trace has no steps.", state: s}
    s.trace = trace
    s.display = [dict(m) for m in trace.messages] + [{"role": "assistant", "content": coloured_answer(trace)}]
    out = dict(_trace_outputs(s, trace, True, live=False))
    out.update({chatbot: s.display, state: s,
                status: f"Loaded a trace of {len(trace.steps)} steps recorded with {trace.model or 'an unknown model'}; "
                        "use the replay slider."})
    return out


def load_model_clicked(name, s, progress=gr.Progress()):
    """Switch this session to another model; on failure keep the previous one and say why."""
    s = _session(s)
    name = (name or "").strip()
    target = None if name in ("", "embedded", EMBEDDED_LABEL) else name
    progress(0.1, desc=f"Loading {target or EMBEDDED_LABEL} (a first GGUF conversion takes about a minute)…")
    try:
        model, tokenizer = STORE.get(target)
        from tr_core.engine import Engine

        s.engine = Engine(model, tokenizer, topk_candidates=s.k)
        s.model_name = target
        s.history, s.display, s.trace = [], [], None
        s.plain_tps = None
        return {status: f"✓ Loaded {target or EMBEDDED_LABEL}; new conversation, empty matrix.", state: s,
                chatbot: [], matrix_md: matrix_info(s)}
    except Exception as exc:  # noqa: BLE001
        keep = s.model_name or STORE.default or EMBEDDED_LABEL
        return {status: f"✗ Could not load {name!r}: {exc}  \nStill using {keep}.", state: s}


def reset_matrix(s):
    s = _session(s)
    if s.engine is not None:
        s.engine.matrix.reset()
    return {status: "Adjacency matrix cleared.", matrix_md: matrix_info(s), state: s}


def save_matrix(s):
    s = _session(s)
    if s.engine is None:
        return {status: "No matrix yet: send a message first.", state: s}
    path = s.files / "adjacency_matrix.pt"
    s.engine.matrix.save(path)
    return {matrix_file: gr.DownloadButton(value=str(path), interactive=True), status: f"Matrix saved ({s.engine.matrix.rows_filled:,} rows filled).", state: s}


def load_matrix(file, s, k):
    s = _session(s)
    if file is None:
        return {status: "No file.", state: s}
    try:
        s.ensure_engine(int(k))
        s.engine.matrix.load(file if isinstance(file, str) else file.name)
    except Exception as exc:  # noqa: BLE001 - the matrix is left untouched on a bad file
        return {status: f"✗ Could not load the matrix: {exc}", state: s, matrix_md: matrix_info(s)}
    return {status: "Matrix loaded.", state: s, matrix_md: matrix_info(s)}


def new_chat(s):
    s = _session(s)
    s.history, s.display = [], []
    return {chatbot: [], status: "New conversation (the matrix keeps what it learned).", state: s}


# ------------------------------------------------------------------------------------------------- page

CSS = """
.gradio-container {max-width: 1500px !important}
#tr-title h1 {font-size: 2.0rem; margin: 0.2rem 0 0 0}
#tr-title p {font-size: 1.05rem; color: #475569; margin: 0.2rem 0}
.tr-run-a {background: #dcfce7; border-radius: 3px}
.tr-run-b {background: #dbeafe; border-radius: 3px}
.tr-meter {padding: 10px 14px; border-radius: 12px; background: linear-gradient(135deg, #f0fdf4, #eff6ff);
           border: 1px solid #e2e8f0}
.tr-big {display: flex; align-items: baseline; gap: 12px}
.tr-ratio {font-size: 3.2rem; font-weight: 800; color: #15803d; line-height: 1.1}
.tr-biglabel {font-size: 1.05rem; color: #334155}
.tr-live {background: #fee2e2; color: #b91c1c; border-radius: 6px; padding: 1px 6px; font-size: 0.8rem}
.tr-cells {display: flex; gap: 18px; flex-wrap: wrap; margin: 4px 0 6px 0}
.tr-cell {display: flex; flex-direction: column}
.tr-val {font-size: 1.7rem; font-weight: 700; color: #1e3a8a}
.tr-lab {font-size: 0.85rem; color: #475569}
.tr-flag {display: inline-block; border-radius: 8px; padding: 2px 10px; font-weight: 600; font-size: 0.95rem}
.tr-flag-ok {background: #dcfce7; color: #166534}
.tr-flag-bad {background: #fee2e2; color: #991b1b}
.tr-flag-none {background: #f1f5f9; color: #475569}
.tr-note {font-size: 0.8rem; color: #64748b; margin-top: 4px}
#tr-status {min-height: 1.5rem}
#tr-chat {font-size: 1.05rem}
"""

HOW_IT_WORKS = """
**Token Recycling** (Luo et al., 2025) speeds up decoding without a draft model:

1. **Adjacency matrix** `M [V, k]`: for every token, the top-k next tokens the model predicted the last time it saw it.
2. **Draft tree**: starting from the last token, candidates are read from `M` level by level following a fixed
   template (the paper's *2.2.2* tree has 80 nodes over 6 levels).
3. **One forward pass** verifies the whole tree with a tree attention mask.
4. **Accept** the longest path that agrees with the model, plus one **bonus** token the model predicts after it.
5. **Recycle**: the top-k of every tree node's logits overwrite that token's row of `M`, so the matrix keeps learning.

Greedy (or seeded) output is token-identical to plain decoding; only the number of forward passes drops.
"""


def default_template() -> str:
    """$TR_TEMPLATE, else the paper's tree on a GPU and the hardware-aware adaptive tree on a CPU (tree.default_template)."""
    import torch

    from tr_core.tree import default_template as for_device

    return os.environ.get("TR_TEMPLATE") or for_device("cuda" if torch.cuda.is_available() else "cpu")


def _diagram() -> str:
    path = ASSETS / "how_it_works.svg"
    return (f'<div style="max-width:980px;margin:auto">{path.read_text(encoding="utf-8")}</div>'
            if path.is_file() else "")


def build_demo() -> gr.Blocks:
    """The page; handlers read and write the per-session `Session` in a gr.State."""
    global state, chatbot, msg, status, meter, tree_plot, heat_plot, chart_plot, matrix_md, replay, trace_file, matrix_file
    from tr_core.tree import TEMPLATE_NAMES

    with gr.Blocks(title="Token Recycling Studio") as demo:
        state = gr.State(None)
        gr.Markdown("# ♻ Token Recycling Studio\nChat with a small LLM decoded by **Token Recycling** speculative "
                    "decoding and watch each step: the draft tree, what was accepted, and the adjacency matrix it "
                    "recycles.", elem_id="tr-title")
        with gr.Row(equal_height=False):
            with gr.Column(scale=5, min_width=420):
                chatbot = gr.Chatbot(label="Chat (each step's accepted run has its own colour)", height=430,
                                     elem_id="tr-chat", buttons=["copy"], feedback_options=None,
                                     placeholder="Ask something, or click an example below.")
                with gr.Row():
                    msg = gr.Textbox(show_label=False, placeholder="Type a message and press Enter", scale=5,
                                     lines=1, max_lines=6, elem_id="tr-msg")
                    send = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id="tr-send")
                    stop = gr.Button("Stop", variant="stop", scale=1, min_width=70, elem_id="tr-stop")
                    clear = gr.Button("New chat", scale=1, min_width=90)
                status = gr.Markdown("", elem_id="tr-status")
                examples = gr.Dataset(components=[gr.Textbox(visible=False)], samples=[[t] for _, t in EXAMPLES],
                                      sample_labels=[lab for lab, _ in EXAMPLES], type="index", label="Examples",
                                      elem_id="tr-examples", samples_per_page=6)
            with gr.Column(scale=6, min_width=520):
                meter = gr.HTML(meter_html(Speed(note="Send a message to measure.")), elem_id="tr-meter-box")
                tree_plot = gr.Plot(tree_figure(None, str), show_label=False, elem_id="tr-tree")
        with gr.Row(equal_height=False):
            with gr.Column(scale=6):
                heat_plot = gr.Plot(heatmap_figure(MatrixTracker(), None, str), show_label=False, elem_id="tr-heat")
                matrix_md = gr.Markdown(matrix_info(Session()), elem_id="tr-matrix-info")
            with gr.Column(scale=5):
                chart_plot = gr.Plot(accepted_chart([]), show_label=False, elem_id="tr-chart")
                with gr.Group():
                    replay = gr.Slider(1, 2, value=1, step=1, label="Replay step", interactive=True, elem_id="tr-replay")
                    with gr.Row():
                        prev_btn = gr.Button("◀ Previous step", size="sm")
                        next_btn = gr.Button("Next step ▶", size="sm")
                with gr.Row():
                    delay = gr.Slider(0.0, 3.0, value=0.0, step=0.1, label="Slow motion: pause per step (s)", scale=3)
                    colour = gr.Checkbox(True, label="Colour accepted runs in the chat", scale=2)
                with gr.Row():
                    trace_file = gr.DownloadButton("Download this answer's trace (JSON)", value=None, size="sm",
                                                   interactive=False, elem_id="tr-trace-download")
                    trace_upload = gr.UploadButton("Load a trace to replay (no model needed)", file_types=[".json"],
                                                   size="sm")
        with gr.Accordion("Decoding settings", open=False):
            with gr.Row():
                max_new = gr.Slider(*LIMITS["max_new_tokens"], value=128, step=1, label="Max new tokens")
                temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
                top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
                top_k = gr.Number(0, label="Top-k (0 = off)", precision=0, minimum=0)
                seed = gr.Number(0, label="Seed", precision=0, minimum=0)
            with gr.Row():
                template = gr.Dropdown(list(TEMPLATE_NAMES), value=default_template(), label="Draft tree template",
                                       info="2.2.2 = the paper's 80-node tree (GPU); adaptive = grown by probability, sized to this device; "
                                            "adaptive-fixed = the same tree at the full 80-node budget")
                k = gr.Slider(*LIMITS["k"], value=8, step=1, label="Candidates per matrix row (k)")
                compare = gr.Checkbox(True, label="Compare with plain decoding after each answer (measures speedup)")
        with gr.Accordion("Model and matrix", open=False):
            with gr.Row():
                model_box = gr.Textbox(value=STORE.default or EMBEDDED_LABEL, scale=4,
                                       label="Model: embedded, a Hugging Face hub id, a local folder or a .gguf path")
                load_btn = gr.Button("Load model", scale=1)
            with gr.Row():
                reset_btn = gr.Button("Reset matrix")
                save_btn = gr.Button("Save matrix")
                matrix_upload = gr.UploadButton("Load matrix", file_types=[".pt", ".pth", ".bin"])
                matrix_file = gr.DownloadButton("Download the saved matrix", value=None, interactive=False)
        with gr.Accordion("How it works", open=False):
            gr.HTML(_diagram())
            gr.Markdown(HOW_IT_WORKS)

        inputs = [msg, state, max_new, temperature, top_p, top_k, seed, template, k, compare, delay, colour]
        outputs = [chatbot, msg, status, meter, tree_plot, heat_plot, chart_plot, matrix_md, replay, trace_file, state]
        run = dict(fn=gpu(respond), inputs=inputs, outputs=outputs, concurrency_limit=1, concurrency_id="engine")
        send.click(**run, api_name="chat")
        msg.submit(**run, api_visibility="undocumented")
        examples.click(lambda i: EXAMPLES[i][1], inputs=examples, outputs=msg, queue=False,
                       api_visibility="private").then(**run, api_visibility="undocumented")
        stop.click(stop_generation, inputs=state, outputs=status, queue=False, api_name="stop")
        clear.click(new_chat, inputs=state, outputs=[chatbot, status, state])
        replay.release(replay_step, inputs=[replay, state, colour],
                       outputs=[tree_plot, heat_plot, chart_plot, chatbot, status], api_name="replay")
        for btn, d in ((prev_btn, -1), (next_btn, 1)):
            btn.click(step_by(d), inputs=[replay, state], outputs=replay, api_visibility="private").then(
                replay_step, inputs=[replay, state, colour], outputs=[tree_plot, heat_plot, chart_plot, chatbot, status],
                api_visibility="private")
        trace_upload.upload(load_trace, inputs=[trace_upload, state],
                            outputs=[chatbot, status, meter, tree_plot, heat_plot, chart_plot, replay, trace_file, state],
                            api_name="load_trace")
        load_btn.click(load_model_clicked, inputs=[model_box, state], outputs=[status, state, chatbot, matrix_md],
                       concurrency_limit=1, concurrency_id="engine", api_name="load_model")
        reset_btn.click(reset_matrix, inputs=state, outputs=[status, matrix_md, state])
        save_btn.click(save_matrix, inputs=state, outputs=[matrix_file, status, state])
        matrix_upload.upload(load_matrix, inputs=[matrix_upload, state, k], outputs=[status, state, matrix_md])
    demo.queue(default_concurrency_limit=4)
    return demo


def _preload() -> None:
    """Load the default model and run each decoding kind once, so first-click timings carry no one-time costs."""
    try:
        model, tokenizer = STORE.get(STORE.default)
        from tr_core.engine import Engine

        engine = Engine(model, tokenizer, topk_candidates=8)  # a throwaway matrix: sessions start empty
        ids = engine.encode_chat([{"role": "user", "content": "Say hello."}])
        for cfg in (DecodeConfig(max_new_tokens=8, template=default_template()), DecodeConfig(max_new_tokens=8, plain=True)):
            for _ in engine.generate(ids, cfg):
                pass
    except Exception as exc:  # noqa: BLE001 - the first message will show the error in the page
        print(f"could not preload the model: {exc}")
    finally:
        WARM.set()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Token Recycling Studio (Gradio app)")
    parser.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    parser.add_argument("--model", default=None, help=f"default model (else ${MODEL_ENV}, else the embedded SmolLM2-135M)")
    parser.add_argument("--share", action="store_true", help="create a public gradio.live link")
    parser.add_argument("--template", default=None,
                        help="default draft tree template on the page (else $TR_TEMPLATE; else 2.2.2 on GPU, adaptive on CPU)")
    parser.add_argument("--no-preload", action="store_true", help="load the model on the first message, not at start")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("TR_THREADS", 0)) or None, metavar="N",
                        help="CPU threads for torch (default: torch's choice, or $TR_THREADS); 1 is steadier on a busy "
                             "small machine")
    args = parser.parse_args(argv)
    if args.model:
        STORE.default = args.model
    if args.template:
        os.environ["TR_TEMPLATE"] = args.template
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    if not args.no_preload and not ZEROGPU:  # load the default model while the page opens, not on the first click
        WARM.clear()
        threading.Thread(target=_preload, daemon=True, name="tr-preload").start()
    demo = build_demo()
    demo.launch(server_name=args.host, server_port=args.port, share=args.share, css=CSS,
                theme=gr.themes.Soft(primary_hue="green", secondary_hue="blue"))


if __name__ == "__main__":
    main()
