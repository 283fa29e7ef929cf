"""The page: layout built from small panel functions, and the wiring of events to handlers.

Handlers (handlers.py, traces.py) take a session and inputs and return a view (a dict keyed by views.KEYS); the
wrappers here find the visitor's session, call the handler and turn the view into component updates.
Endpoint names are the documented API: /chat, /stop, /new_chat, /replay, /load_trace, /load_model,
/reset_matrix, /save_matrix, /load_matrix, /export_html, /compare_methods, /tour.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import gradio as gr

from present.chat import safe_markdown
from present.glossary import glossary_html
from present.tasks import caption_of, task_runs, task_speedup_figure, task_speedups
from present.tour import TOUR_CSS
from tr_core.machine import speed_label

from . import handlers as h
from . import side_by_side, traces
from .decode_loop import crowd
from .models import label
from .session import Session, Studio, decode_slot, new_session
from .page_js import (CHAT_FOLLOW_JS, DOWNLOAD_JS, MICROSCOPE_JS, PRESENT_FROM_URL_JS, PRESENT_JS, PRESENT_LABELS,
                      RACE_JS, SIDES_INSTALL_JS, TOUR_INSTALL_JS, TOUR_OPEN_JS)
from .settings import parse_settings
from .texts import DRAFTING, DRAFTING_INFO, EXAMPLES, HOW_IT_WORKS, PAPER, PAPER_SHORT, WHY_NUMBERS
from .views import KEYS, blank_views, matrix_info

ASSETS = Path(__file__).resolve().parents[1] / "assets"
RESULTS = ASSETS.parent / "bench" / "results"  # the benchmark's result files (bench/README.md)
CSS = (ASSETS / "studio.css").read_text(encoding="utf-8") + TOUR_CSS


class Registry:
    """The live sessions by Gradio session hash, so that a closed tab's session can be cleaned up at once.

    A tab that closes is cleaned up by Gradio's unload; a caller that never kept a connection open (a raw
    HTTP script) is cleaned up once idle for `idle_s`, and at most `max_sessions` are kept (oldest first out).
    """

    def __init__(self, studio: Studio, idle_s: float = 1800.0, max_sessions: int = 1000) -> None:
        self.studio = studio
        self.idle_s, self.max_sessions = idle_s, max_sessions
        self.sessions: dict[str, Session] = {}
        self.seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def get(self, state: Any, request: gr.Request | None) -> Session:
        """The visitor's session: the State's, else the one registered for this tab, else a new one."""
        key = getattr(request, "session_hash", None) or ""
        with self._lock:
            s = state if isinstance(state, Session) else self.sessions.get(key) or new_session(self.studio.config)
            if key:
                self.sessions.setdefault(key, s)
                self.seen[key] = time.monotonic()
            self._sweep()  # this tab was just seen: it is the newest, never swept here
            return s

    def _sweep(self) -> None:
        """Close sessions idle for too long, then the oldest beyond the cap (never one that is answering)."""
        now = time.monotonic()
        by_age = sorted(self.seen, key=self.seen.get)
        over = len(by_age) - self.max_sessions
        for i, key in enumerate(by_age):
            if (now - self.seen[key] > self.idle_s or i < over) and not self.sessions[key].answering:
                self._drop(key)

    def _drop(self, key: str) -> None:
        s = self.sessions.pop(key, None)
        self.seen.pop(key, None)
        if s is not None:
            s.close()

    def close(self, request: gr.Request) -> None:
        """The tab closed (Gradio's unload): stop its answer, remove its files."""
        with self._lock:
            self._drop(getattr(request, "session_hash", None) or "")

    def discard(self, session: Any) -> None:
        """Gradio deleted a session's State: close it and forget it."""
        if not isinstance(session, Session):
            return
        with self._lock:
            for key in [k for k, v in self.sessions.items() if v is session]:
                self.sessions.pop(key, None)
                self.seen.pop(key, None)
        session.close()


def _update(ui: dict[str, Any], view: dict[str, Any]) -> dict:
    """A handler's view as Gradio component updates."""
    out: dict = {}
    for key, value in view.items():
        comp = ui[key]
        if key in ("status", "warm"):
            value = safe_markdown(value)
        elif key == "replay":
            value = gr.Slider(interactive=True, **value)
        elif key in ("trace_file", "matrix_file"):
            value = gr.DownloadButton(value=value, interactive=value is not None)
        elif key == "replay_html":
            value = gr.DownloadButton(value=value, interactive=value is not None)
        out[comp] = value
    return out


# -------------------------------------------------------------------------------------------- panels


def _chat_panel(ui: dict, template: str) -> None:
    ui["chat"] = gr.Chatbot(label="Chat (colours take turns: one per step)", height=430, elem_id="tr-chat",
                            buttons=["copy"], feedback_options=None, placeholder="Ask something, or click an example.",
                            latex_delimiters=[])  # "$$...$$" from a visitor, a model or a trace stays text
    with gr.Row(elem_id="tr-input-row"):
        ui["msg"] = gr.Textbox(show_label=False, placeholder="Type here and press Enter", scale=5, lines=1,
                               max_lines=6, elem_id="tr-msg")
        ui["send"] = gr.Button("Send", variant="primary", scale=1, min_width=80, elem_id="tr-send")
        ui["stop"] = gr.Button("Stop", variant="stop", scale=1, min_width=70, elem_id="tr-stop")
        ui["clear"] = gr.Button("New chat", scale=1, min_width=90, elem_id="tr-new-chat")
        ui["race_btn"] = gr.Button("⚑ Race", scale=1, min_width=80, elem_id="tr-race")
    ui["decoding"] = gr.HTML("", elem_id="tr-decoding")  # greedy or sampling: said where the answer is
    ui["status"] = gr.Markdown("", elem_id="tr-status", latex_delimiters=[])
    ui["drafting"] = gr.Radio([(label, name) for name, label in DRAFTING], label="Drafting",
                              value=template if template in {name for name, _ in DRAFTING} else None,
                              info=DRAFTING_INFO, elem_id="tr-drafting")
    ui["paper_mode"] = gr.Button("Paper mode: its tree, an empty matrix", size="sm", elem_id="tr-paper-mode")
    ui["examples"] = gr.Dataset(components=[gr.Textbox(visible=False)], samples=[[t] for _, t in EXAMPLES],
                                sample_labels=[lab for lab, _ in EXAMPLES], type="index", label="Examples",
                                elem_id="tr-examples", samples_per_page=6)


def _step_panel(ui: dict, blank: dict[str, Any]) -> None:
    with gr.Column(scale=6):
        ui["heat"] = gr.Plot(blank["heat"], show_label=False, elem_id="tr-heat")
        ui["matrix"] = gr.Markdown(matrix_info(None, 8), elem_id="tr-matrix-info")
        ui["warm"] = gr.Markdown("", elem_id="tr-warm")  # where the session's matrix came from (a handler says)
        ui["microscope"] = gr.HTML(blank["microscope"], elem_id="tr-microscope")
    with gr.Column(scale=5):
        ui["chart"] = gr.Plot(blank["chart"], show_label=False, elem_id="tr-chart")
        with gr.Group(elem_id="tr-nav"):
            ui["replay"] = gr.Slider(1, 2, value=1, step=1, label="Replay step", interactive=True, elem_id="tr-replay")
            with gr.Row(elem_id="tr-nav-buttons"):
                ui["prev"] = gr.Button("◀ Previous step", size="sm", elem_id="tr-prev")
                ui["next"] = gr.Button("Next step ▶", size="sm", elem_id="tr-next")
                ui["micro_btn"] = gr.Button("Microscope", size="sm", elem_id="tr-micro-btn")
                ui["tour_btn"] = gr.Button("▶ Tour this step", size="sm", variant="primary",
                                           elem_id="tr-tour-btn")
        ui["tour"] = gr.HTML("", elem_id="tr-tour-box")  # present/tour.py: an overlay while open
        with gr.Row(elem_id="tr-delay-row"):
            ui["delay"] = gr.Slider(0.0, 3.0, value=0.0, step=0.1, label="Slow motion: pause per step (s)", scale=3)
            ui["colour"] = gr.Checkbox(True, label="Colour each step's run in the chat", scale=2)
        with gr.Row():
            ui["trace_file"] = gr.DownloadButton("Download this answer's trace (JSON)", value=None, size="sm",
                                                 interactive=False, elem_id="tr-trace-download")
            ui["trace_upload"] = gr.UploadButton("Load a trace to replay (no model needed)", file_types=[".json"],
                                                 size="sm", elem_id="tr-trace-upload")
        with gr.Row():
            ui["export_html"] = gr.Button("Download replay (HTML)", size="sm", elem_id="tr-export-html")
            # written on click, then downloaded by a click on this hidden button (see _wire)
            ui["replay_html"] = gr.DownloadButton("Save replay.html", value=None, size="sm", interactive=False,
                                                  visible="hidden", elem_id="tr-export-html-file")


def _shown_step_panel(ui: dict, blank: dict[str, Any]) -> None:
    """The meter, then the shown step: its tree, story and cost; the race opens below (or over the page when presenting)."""
    ui["meter"] = gr.HTML(blank["meter"], elem_id="tr-meter-box")
    ui["tree"] = gr.Plot(blank["tree"], show_label=False, elem_id="tr-tree")
    ui["story"] = gr.HTML(blank["story"], elem_id="tr-story")
    ui["cost"] = gr.HTML(blank["cost"], elem_id="tr-cost")
    ui["race"] = gr.HTML(blank["race"], elem_id="tr-race-box")
    ui["compare_methods"] = gr.Button(f"⚖ {side_by_side.TITLE}", size="md",
                                      elem_id="tr-compare-methods")


def _settings_panel(ui: dict, studio: Studio) -> None:
    from tr_core.tree import TEMPLATE_NAMES

    with gr.Accordion("Decoding settings", open=False, elem_id="tr-settings"):
        with gr.Row():
            ui["max_new"] = gr.Slider(1, studio.config.max_new_tokens, value=128, step=1, label="Max new tokens")
            ui["temperature"] = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)")
            ui["top_p"] = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p")
            ui["top_k"] = gr.Number(0, label="Top-k (0 = off)", precision=0, minimum=0)
            ui["seed"] = gr.Number(0, label="Seed", precision=0, minimum=0)
            ui["repetition_penalty"] = gr.Slider(0.5, 2.0, value=1.0, step=0.05, label="Repetition penalty (1 = off)")
        with gr.Row():
            ui["template"] = gr.Dropdown(list(TEMPLATE_NAMES), value=studio.default_template,
                                         label="Draft tree template",
                                         info="2.2.2 = the paper's 80-node tree (GPU); adaptive = grown by probability, "
                                              "sized to this device; adaptive-fixed = the same tree at the full 80-node budget; "
                                              "hybrid(-fixed) = the same, plus runs copied from the conversation or the sample answers learned beforehand (squares in the tree; diamonds: both)")
            ui["k"] = gr.Slider(1, 16, value=8, step=1, label="Candidates per matrix row (k)")
            ui["compare"] = gr.Checkbox(True, label="Measure the speedup against plain decoding after each answer")


def _model_panel(ui: dict, studio: Studio) -> None:
    cfg = studio.config
    with gr.Accordion("Model and matrix", open=False, elem_id="tr-model-panel"):
        with gr.Row():
            info = ("models offered on this instance" if cfg.public
                    else "embedded, a Hugging Face hub id, a local folder or a .gguf path")
            ui["model"] = gr.Dropdown([label(m) for m in cfg.models], value=label(cfg.default_model), scale=4,
                                      allow_custom_value=True, label="Model", info=info, elem_id="tr-model")
            ui["load"] = gr.Button("Load model", scale=1)
        with gr.Row():
            ui["reset"] = gr.Button("Reset matrix to what it learned beforehand")
            ui["empty"] = gr.Button("Empty matrix")
            ui["save"] = gr.Button("Save matrix")
            ui["matrix_upload"] = gr.UploadButton("Load matrix", file_types=[".pt", ".pth", ".bin"])
            ui["matrix_file"] = gr.DownloadButton("Download the saved matrix", value=None, interactive=False)


def _layout(studio: Studio) -> dict[str, Any]:
    """Every component of the page, by name."""
    ui: dict[str, Any] = {}
    blank = blank_views()  # the panels before any answer (New chat shows them again)
    with gr.Row(equal_height=False, elem_id="tr-head"):
        with gr.Column(scale=8, elem_id="tr-title-col"):
            gr.Markdown("# ♻ Token Recycling Studio\nWatch **Token Recycling** speculative decoding draft, check and "
                        f"recycle, step by step. {PAPER_SHORT}.", elem_id="tr-title", latex_delimiters=[])
        with gr.Column(scale=1, min_width=210):
            ui["present"] = gr.Button(PRESENT_LABELS[0], size="sm", elem_id="tr-present")
    with gr.Row(equal_height=False, elem_id="tr-top"):
        with gr.Column(scale=5, min_width=420, elem_id="tr-left"):
            _chat_panel(ui, studio.default_template)
        with gr.Column(scale=6, min_width=520, elem_id="tr-right"):
            _shown_step_panel(ui, blank)
    with gr.Row(elem_id="tr-sides-row"):  # the paper's method beside the hybrid, full width (side_by_side.py)
        ui["sides"] = gr.HTML("", elem_id="tr-sides", padding=False)
    with gr.Row(equal_height=False, elem_id="tr-steps"):
        _step_panel(ui, blank)
    _settings_panel(ui, studio)
    _model_panel(ui, studio)
    with gr.Accordion("How it works", open=False, elem_id="tr-how"):
        diagram = ASSETS / "how_it_works.svg"
        if diagram.is_file():
            gr.HTML(f'<div style="max-width:980px;margin:auto">{diagram.read_text(encoding="utf-8")}</div>')
        gr.Markdown(HOW_IT_WORKS)
    with gr.Accordion("Glossary: every term in one sentence", open=False, elem_id="tr-glossary"):
        gr.HTML(glossary_html())  # the same sentences the page shows on hover or tap (present/glossary.py)
    with gr.Accordion("Why these numbers: the speedup formula, CPU against GPU, the paper", open=False,
                      elem_id="tr-why"):
        _task_panel()
        gr.Markdown(WHY_NUMBERS + PAPER + ".", latex_delimiters=[])
    return ui


def _task_panel() -> None:
    """Per-task speedups from the project's own benchmark files, beside the paper's ~2x (present/tasks.py): those
    of this machine's CPU where the repository holds some, else the newest; the caption says whose they are."""
    runs = task_runs(RESULTS, speed_label())
    gr.Markdown("**Per task, on this project's benchmark** (not this page's answers)")
    gr.Plot(task_speedup_figure(task_speedups(runs)), show_label=False, elem_id="tr-tasks")
    gr.Markdown(caption_of(runs) or "No benchmark results were found in bench/results.", elem_classes="tr-caption")


# -------------------------------------------------------------------------------------------- wiring


def _sides_fn(registry: Registry, ui: dict):
    """The /compare_methods endpoint: the paper's method beside the hybrid on the session's last question."""
    def sides(state, request: gr.Request):
        s = registry.get(state, request)
        where = h.precision(s.engine)["machine"] if s.engine is not None else ""  # where it runs, not the trace's
        cfg = registry.studio.config  # the meter's budget and turn length: the cards read as the meter does
        views = side_by_side.compare_methods(s, crowd, decode_slot, where, cfg.measure_max_s, cfg.measure_chunk_ms)
        for view in views:
            yield {**_update(ui, view), ui["state"]: s}
    return sides


def _chat_fn(studio: Studio, registry: Registry, ui: dict):
    """The /chat endpoint (keyword arguments are its parameter names)."""
    def chat(message, max_new_tokens, temperature, top_p, top_k, seed, template, compare, k, delay, colour,
             repetition_penalty, state, request: gr.Request):
        s = registry.get(state, request)
        notes: list[str] = []
        settings = parse_settings(studio, dict(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                                 top_k=top_k, seed=seed, template=template, compare=compare, k=k,
                                                 delay=delay, colour=colour, repetition_penalty=repetition_penalty),
                                   notes)
        conversation = s.conversation
        shown: dict[str, Any] = {}
        for i, view in enumerate(h.respond(studio, s, message, settings, notes)):
            shown.update(view)
            yield _update(ui, view) | ({ui["state"]: s} if i == 0 else {})  # the session, with the first view
        shown.pop("msg", None)  # the box holds what the visitor typed meanwhile
        if shown and s.conversation == conversation:  # the last update carries every output, so an API caller's
            yield _update(ui, shown)                   # result is complete (not after New chat: it is all gone)
    return chat


def _simple(registry: Registry, ui: dict, handler, *extra):
    """Wrap `handler(session, *extra, *inputs)` as an event function taking the state, then the inputs."""
    def fn(state, request: gr.Request, *inputs):  # gradio passes the request at its position in the signature
        s = registry.get(state, request)
        out = _update(ui, handler(s, *extra, *inputs))
        out[ui["state"]] = s
        return out
    return fn


def _file_path(file: Any) -> str | None:
    return file if isinstance(file, str) or file is None else getattr(file, "name", None)


# Answers decode together in a shared batch (studio/decode_loop.py): this many chat requests run at once (each waits
# for a row there and draws its own figures); further ones wait in Gradio's queue, which shows each their place.
CHAT_CONCURRENCY = 32
QUEUE_SIZE = 1000  # requests a public instance queues before it turns one away: a lecture hall of them


def _wire(demo: gr.Blocks, studio: Studio, registry: Registry, ui: dict) -> None:
    outs = [ui[k] for k in KEYS] + [ui["state"]]
    chat_inputs = [ui[k] for k in ("msg", "max_new", "temperature", "top_p", "top_k", "seed", "template", "compare",
                                   "k", "delay", "colour", "repetition_penalty", "state")]
    run = dict(fn=_chat_fn(studio, registry, ui), inputs=chat_inputs, outputs=outs,
               concurrency_limit=CHAT_CONCURRENCY, concurrency_id="engine")
    ui["send"].click(**run, api_name="chat")
    ui["compare_methods"].click(_sides_fn(registry, ui), inputs=ui["state"], outputs=[ui["sides"], ui["status"],
                                ui["state"]], concurrency_limit=1, concurrency_id="compare", api_name="compare_methods")
    ui["msg"].submit(**run, api_visibility="undocumented")
    ui["examples"].click(lambda i: EXAMPLES[i][1], inputs=ui["examples"], outputs=ui["msg"], queue=False,
                         api_visibility="private").then(**run, api_visibility="undocumented")
    state = ui["state"]
    ui["stop"].click(_simple(registry, ui, h.stop_answer), inputs=state, outputs=outs, queue=False, api_name="stop")
    ui["clear"].click(_simple(registry, ui, h.new_chat), inputs=state, outputs=outs, queue=False, api_name="new_chat")
    # the chat's own trash button: the same new conversation, so that what it clears from view is forgotten too
    ui["chat"].clear(_simple(registry, ui, h.new_chat), inputs=state, outputs=outs, queue=False,
                     api_visibility="private")
    replay = _simple(registry, ui, traces.replay)
    replay_inputs = [state, ui["replay"], ui["colour"]]
    ui["replay"].release(replay, inputs=replay_inputs, outputs=outs, api_name="replay")
    for btn, delta in ((ui["prev"], -1), (ui["next"], 1)):
        move = _simple(registry, ui, lambda s, step, d=delta: {"replay": {"value": traces.step_by(s, step, d)}})
        btn.click(move, inputs=[state, ui["replay"]], outputs=outs, api_visibility="private").then(
            replay, inputs=replay_inputs, outputs=outs, api_visibility="private")
    ui["trace_upload"].upload(_simple(registry, ui, lambda s, f: traces.load_trace(studio, s, _file_path(f))),
                              inputs=[state, ui["trace_upload"]], outputs=outs, api_name="load_trace")
    ui["load"].click(_simple(registry, ui, lambda s, name: h.load_model(studio, s, name)), inputs=[state, ui["model"]],
                     outputs=outs, concurrency_limit=1, concurrency_id="load", api_name="load_model")
    export = ui["export_html"].click(_simple(registry, ui, traces.export_replay), inputs=state, api_name="export_html",
                                     outputs=[ui["status"], ui["replay_html"], state], concurrency_limit=1,
                                     concurrency_id="export")  # a few seconds of CPU for a long answer: one at a time
    export.then(None, js=DOWNLOAD_JS, api_visibility="private")
    _wire_views(demo, registry, ui)
    # the drafting switch and the template dropdown show the same choice (`input`: a visitor's change only, no loop)
    ui["drafting"].input(lambda name: name, inputs=ui["drafting"], outputs=ui["template"], queue=False,
                         api_visibility="private")
    names = {name for name, _ in DRAFTING}
    ui["template"].input(lambda name: name if name in names else None, inputs=ui["template"],
                         outputs=ui["drafting"], queue=False, api_visibility="private")
    ui["reset"].click(_simple(registry, ui, h.reset_matrix), inputs=state, outputs=outs, api_name="reset_matrix")
    ui["empty"].click(_simple(registry, ui, h.empty_matrix), inputs=state, outputs=outs, api_name="empty_matrix")
    ui["paper_mode"].click(_simple(registry, ui, lambda s, k: h.paper_mode(studio, s, k)), inputs=[state, ui["k"]],
                           outputs=outs + [ui["drafting"], ui["template"]], api_name="paper_mode")
    ui["save"].click(_simple(registry, ui, h.save_matrix), inputs=state, outputs=outs, api_name="save_matrix")
    ui["matrix_upload"].upload(_simple(registry, ui, lambda s, f, k: h.load_matrix(studio, s, _file_path(f), k)),
                               inputs=[state, ui["matrix_upload"], ui["k"]], outputs=outs, api_name="load_matrix")
    demo.unload(registry.close)


def _wire_views(demo: gr.Blocks, registry: Registry, ui: dict) -> None:
    """The ways of looking at an answer: the race, the presentation view, the microscope and the guided tour."""
    ui["race_btn"].click(None, js=RACE_JS, api_visibility="private")
    ui["present"].click(None, js=PRESENT_JS, api_visibility="private")
    ui["micro_btn"].click(None, js=MICROSCOPE_JS, api_visibility="private")
    state = ui["state"]
    ui["tour_btn"].click(_simple(registry, ui, traces.tour), inputs=[state, ui["replay"]], api_name="tour",
                         outputs=[ui["tour"], ui["status"], state]).then(None, js=TOUR_OPEN_JS,
                                                                         api_visibility="private")
    demo.load(None, js=PRESENT_FROM_URL_JS, api_visibility="private")
    demo.load(None, js=TOUR_INSTALL_JS, api_visibility="private")
    demo.load(None, js=SIDES_INSTALL_JS, api_visibility="private")
    demo.load(None, js=CHAT_FOLLOW_JS, api_visibility="private")


def build_demo(studio: Studio) -> gr.Blocks:
    """The page for one studio instance; every visitor gets their own session."""
    registry = Registry(studio)
    with gr.Blocks(title="Token Recycling Studio", delete_cache=(600, 3600)) as demo:
        ui = _layout(studio)
        ui["state"] = gr.State(None, delete_callback=registry.discard, time_to_live=registry.idle_s)
        _wire(demo, studio, registry, ui)
    demo.queue(default_concurrency_limit=4, max_size=QUEUE_SIZE if studio.config.public else None)
    demo.registry = registry  # for tests and operators: the live sessions
    return demo
