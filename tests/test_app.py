"""The app: handlers in process on a fake engine (no Gradio, no model), then `python app.py` driven by gradio_client.

Public-mode hosting, visitors at once, killed clients, temp folders and the meter under load are in
test_public_app.py; the real browser in test_browser.py.
"""
from __future__ import annotations

import html
import json
import re
import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import safetensors.torch
import torch

from conftest import unglossed
from conftest_app import running_app
from studio import costs, traces
from studio import handlers as h
from studio.config import StudioConfig, make_config, parse_models, wants_public
from studio.models import REFUSED, ModelCatalog, ModelRefused
from studio.session import InputError, Session, clean_text
from tr_core import warm
from present.style import ACCEPTED_COLOUR
from tr_core.trace import Trace

gradio_client = pytest.importorskip("gradio_client")

# ------------------------------------------------------------- handlers in process, on a fake engine


class FakeMatrix:
    rows_filled, size_mb, vocab_size, k = 3, 0.1, 100, 2

    def __init__(self):
        self.resets = 0
        self.stamps = torch.tensor([0, 1, 2] + [-1] * 97)  # its 3 rows, written by this conversation

    def reset(self):
        self.resets += 1

    def clone(self):
        return self


FAKE_ORIGIN = {"where": "prompt", "first": 2, "last": 3, "match": 2}  # where the fake's copied nodes were found


class FakeCosts:
    """Engine.forward_costs / use_forward_cost over a fake's `adaptive` and `hybrid` drafters (None: it has none)."""

    adaptive: Any = None
    hybrid: Any = None

    def forward_costs(self) -> dict:
        return {name: d.cost for name in ("adaptive", "hybrid") if (d := getattr(self, name)) is not None}

    def use_forward_cost(self, name: str, cost) -> None:
        getattr(self, name).cost = cost


class FakeEngine(FakeCosts):
    """Stands in for tr_core.Engine: 10 prompt tokens per message, `steps` steps of 2 tokens each."""

    context_limit = 50

    def __init__(self, fail: bool = False, steps: int = 2, step_s: float = 0.0):
        self.fail, self.steps, self.step_s = fail, steps, step_s
        self.matrix = FakeMatrix()
        self.adaptive = None
        self.hybrid = None  # the engine's drafters with state of their own (Engine.fork copies them)
        self.prompts: list[list[int]] = []
        self.running = 0

    def fork(self, sizes=None):  # Engine.fork: the speed meter's twin (the fake matrix is shared, as its clone is)
        return __import__("copy").copy(self)

    def encode_chat(self, messages):
        return [7] * (10 * len(messages))

    def times_forwards_first(self, cfg):
        return cfg.template == "adaptive" and not self.prompts  # the real engine: cost-sized, not yet timed

    def forget(self):
        self.matrix.reset()

    def decode(self, ids):
        return "".join(f"w{i} " for i in ids)

    def token_text(self, t):
        return f"w{t}"

    def generate(self, ids, cfg, stop=None):
        from tr_core.events import StepEvent, SummaryEvent

        self.prompts.append(list(ids))
        if self.fail:
            raise RuntimeError("boom")
        out, reason = [], "length"
        self.running += 1
        try:
            for step in range(self.steps * (2 if cfg.plain else 1)):  # plain: 1 token a step, TR: 2
                time.sleep(self.step_s)
                emitted = [8] if cfg.plain else [8, 9]
                hybrid = cfg.template.startswith("hybrid")  # node 2 copied from the context: rank k + 0
                ev = StepEvent(step=step, position=len(ids) + step, tokens=[7, 8, 9], parents=[-1, 0, 1],
                               depths=[0, 1, 2], ranks=[-1, 0, 2 if hybrid else 0], accepted=[0, 1], emitted=emitted,
                               bonus=emitted[-1], timings={"total": 10.0 if cfg.plain else 12.0, "forward": 8.0},
                               matrix_rows=[7, 8], matrix_values=[[8, 1], [9, 2]],
                               matrix_probs=[[0.9, 0.1], [0.8, 0.2]], template=cfg.template,
                               sources=["root", "both", "context"] if hybrid else None,
                               origins=[None, FAKE_ORIGIN, FAKE_ORIGIN] if hybrid else None)
                out += emitted
                yield ev
                if stop is not None and stop():
                    reason = "stopped"
                    break
        finally:
            self.running -= 1
        yield SummaryEvent(tokens=out, prompt_tokens=len(ids), new_tokens=len(out), steps=self.steps,
                           mean_accepted=2.0, tokens_per_s=100.0, prefill_s=0.0, decode_s=0.04, wall_s=0.04,
                           stop_reason=reason, method="plain" if cfg.plain else "recycling", template=cfg.template,
                           matrix_rows_filled=3, matrix_mb=0.1)


def studio_for(engine=None, **config) -> h.Studio:
    cfg = StudioConfig(**dict(dict(measure_chunk_ms=10.0), **config))
    return h.Studio(config=cfg, catalog=ModelCatalog(cfg, loader=lambda name: (None, None)), default_template="2.2.2")


def run(studio, session, message, into: list | None = None, **settings):
    """All views of one answer (appended to `into` as they come, when given)."""
    notes: list[str] = []
    s = h.parse_settings(studio, dict(dict(max_new_tokens=10, template="2.2.2", compare=True), **settings), notes)
    views = [] if into is None else into
    for view in h.respond(studio, session, message, s, notes):
        views.append(view)
    return views


def answer_in_background(studio, session, message, until, timeout=10.0, **settings):
    """Start answering in a thread; return (thread, views so far) once a view satisfies `until` (or at the timeout)."""
    views: list[dict] = []
    worker = threading.Thread(target=lambda: run(studio, session, message, into=views, **settings))
    worker.start()
    deadline = time.monotonic() + timeout
    while not any(until(v) for v in views) and time.monotonic() < deadline:
        time.sleep(0.01)
    return worker, views


def merged(views):
    out: dict = {}
    for v in views:
        out.update(v)
    return out


def test_answers_measure_the_speedup_trim_long_conversations_and_survive_errors():
    studio = studio_for()
    session = Session(engine=FakeEngine(steps=4), k=8)
    for i in range(3):
        views = run(studio, session, f"question {i}")
    final = merged(views)
    # 3 user turns + 2 answers = 50 prompt tokens > 50 - 10: the oldest question/answer pair is dropped
    assert "oldest 2 messages were left out" in final["status"] or "oldest 2 messages" in views[-2]["status"]
    assert len(session.history) == 6 and session.history[-1]["content"].startswith("w8 w9")
    # the fake's TR steps emit 2 tokens in 12 ms, plain steps 1 token in 10 ms: 2 x 10 / 12 = 1.67x
    assert "1.67× ± 0.00" in final["meter"] and "tr-ratio-up" in final["meter"]
    assert session.trace.speed["trusted"] and session.trace.speed["identical"] is False  # fake plain != TR tokens
    session.engine.fail = True
    views = run(studio, session, "this one fails")
    assert "Generation failed: RuntimeError: boom" in merged(views)["status"]
    assert len(session.history) == 6 and not session.answering  # the failed turn left the conversation as it was
    session.engine.fail = False
    run(studio, session, "and this works again")
    assert session.history[-1]["role"] == "assistant"


def test_bad_text_is_refused_before_the_session_changes():
    studio = studio_for()
    session = Session(engine=FakeEngine(), k=8)
    for bad, words in (("bad \ud800 text", "broken character"), ("bell \x07", "control character"),
                       ("x" * 9000, "limit"), (12, "must be text")):
        views = run(studio, session, bad)
        assert len(views) == 1 and words in views[0]["status"] and views[0]["status"].startswith("✗")
    assert session.engine.prompts == [] and session.history == [] and not session.answering
    assert len(run(studio, session, "  \n ")) == 1
    assert merged(run(studio, session, "fine now"))["chat"][-1]["role"] == "assistant"
    with pytest.raises(InputError):
        clean_text("a\x00b", "message", 100)
    assert clean_text("tab\tand\r\nnewline", "message", 100) == "tab\tand\nnewline"


def test_untrusted_text_is_shown_escaped_in_the_chat():
    studio = studio_for()
    session = Session(engine=FakeEngine(), k=8)
    final = merged(run(studio, session, '<img src="http://127.0.0.1:9/x.png"> ![a](http://127.0.0.1:9/y.png)'))
    user = final["chat"][-2]["content"]
    assert "<img" not in user and "&lt;img" in user and "![" not in user


def test_new_chat_during_an_answer_stops_it_and_nothing_comes_back():
    studio = studio_for()
    engine = FakeEngine(steps=200, step_s=0.02)
    session = Session(engine=engine, k=8)
    run(studio, session, "first question", compare=False)
    worker, views = answer_in_background(studio, session, "a long one", lambda v: "tree" in v, compare=False)
    assert session.answering
    # a second answer in the same tab is refused, so are matrix and trace changes
    assert "An answer is running" in run(studio, session, "again")[0]["status"]
    assert "An answer is running" in h.reset_matrix(session)["status"] and engine.matrix.resets == 0
    assert h.new_chat(session)["chat"] == []
    worker.join(timeout=5)
    assert not worker.is_alive() and engine.running == 0 and not session.answering
    assert views[-1]["chat"] == [] and session.history == [] and session.display == []
    final = merged(run(studio, session, "fresh start", compare=False))
    assert len(final["chat"]) == 2 and len(session.history) == 2


def test_new_chat_during_the_measurement_drops_the_answer_and_blanks_every_panel():
    studio = studio_for(measure_chunk_ms=50.0)
    engine = FakeEngine(steps=60, step_s=0.01)
    session = Session(engine=engine, k=8)
    run(studio, session, "first question", compare=False)
    worker, views = answer_in_background(studio, session, "measure me",
                                         lambda v: "Measuring the speedup…" in v.get("status", ""), timeout=20)
    cleared = h.new_chat(session)
    worker.join(timeout=10)
    assert not worker.is_alive() and not session.answering and engine.running == 0
    blank = views[-1]  # the last view says the answer is gone; nothing brings it back
    assert blank["chat"] == [] and "dropped" in blank["status"] and "Done" not in blank["status"]
    for view in (blank, cleared):
        assert "Send a message to measure" in view["meter"] and view["trace_file"] is None
        assert view["replay"]["value"] == 1 and "no answer to race yet" in view["race"]
    assert session.history == [] and session.display == [] and session.trace is None
    assert "Nothing to replay" in traces.replay(session, 3, True)["status"]  # the slider cannot redraw the old answer


def test_the_chat_endpoint_leaves_the_typed_message_alone_and_sends_nothing_back_after_new_chat():
    import gradio as gr

    from studio import page

    studio = studio_for()
    session = Session(engine=FakeEngine(steps=30, step_s=0.005), k=8)
    with gr.Blocks():
        ui = page._layout(studio)
        ui["state"] = gr.State(None)
    chat = page._chat_fn(studio, page.Registry(studio), ui)

    def ask(text):  # the page's inputs in order: message, settings..., state, request
        return chat(text, 10, 0.0, 1.0, 0, 0, "2.2.2", False, 8, 0.0, True, 1.0, session, None)

    out = list(ask("hello"))
    assert [i for i, u in enumerate(out) if ui["msg"] in u] == [0] and out[0][ui["msg"]] == ""  # cleared once, at
    assert {ui["chat"], ui["meter"], ui["tree"], ui["status"]} <= set(out[-1])  # the start; the last update is complete
    gen = ask("a second question")
    for update in gen:
        if ui["tree"] in update:
            break
    h.new_chat(session)
    rest = list(gen)  # the dropped answer's view comes back in none of them
    assert rest and all(u[ui["chat"]] == [] for u in rest if ui["chat"] in u)
    assert "dropped" in rest[-1][ui["status"]]


def test_stop_leaves_the_status_to_the_answer_and_the_meter_says_why_nothing_was_measured():
    studio = studio_for()
    engine = FakeEngine(steps=500, step_s=0.01)
    session = Session(engine=engine, k=8)
    assert h.stop_answer(session) == {"status": "Nothing is running."}
    worker, views = answer_in_background(studio, session, "go on", lambda v: "tree" in v, compare=True)
    # a status from Stop's own reply could arrive after the answer's final "Stopped" and overwrite it
    assert h.stop_answer(session) == {}
    worker.join(timeout=10)
    final = merged(views)
    assert "■ Stopped: the answer so far is kept." in final["status"]
    assert "stopped before its end" in final["meter"] and "turn on" not in final["meter"]


def test_the_meter_says_while_answering_whether_it_will_measure_and_shows_the_answers_own_mean():
    studio = studio_for()
    session = Session(engine=FakeEngine(steps=3), k=8)
    live = [v["meter"] for v in run(studio, session, "no measuring", compare=False) if "meter" in v]
    assert "not measured (turned off" in live[0] and "measured right after" not in live[0]
    live = [v["meter"] for v in run(studio, session, "measure it", compare=True) if "meter" in v]
    assert "measured right after the answer" in live[0]
    from studio.views import measured_meter
    from studio.meter import SpeedEstimate

    cut = SpeedEstimate(1.2, 0.05, 20.0, 16.0, 1.22, 33, 1, True, "")  # chunks over part of the answer only
    assert "1.22" in measured_meter(cut) and "1.45" in measured_meter(cut, answer_mean=1.45)
    assert "1.22" not in measured_meter(cut, answer_mean=1.45)  # the chart beside it shows the answer's 1.45


def test_stop_and_time_limit_keep_the_answer_so_far():
    studio = studio_for(time_limit_s=0.3)
    engine = FakeEngine(steps=500, step_s=0.01)
    session = Session(engine=engine, k=8)
    final = merged(run(studio, session, "go on forever"))
    assert "time limit" in final["status"] and session.trace.summary.stop_reason == "time limit"
    assert 0 < session.trace.summary.new_tokens < 1000 and "speed" not in json.dumps(final.get("meter", ""))[:0]
    assert session.history[-1]["role"] == "assistant" and engine.running == 0


def test_closing_the_request_stops_the_engine_within_a_step():
    studio = studio_for()
    engine = FakeEngine(steps=1000, step_s=0.01)
    session = Session(engine=engine, k=8)
    notes: list[str] = []
    gen = h.respond(studio, session, "long", h.parse_settings(studio, {"compare": False}, notes), notes)
    for view in gen:
        if "tree" in view:
            break
    assert engine.running == 1
    gen.close()  # what Gradio does when the visitor leaves or presses Stop
    assert engine.running == 0 and not session.answering
    assert len(engine.prompts) == 1


def test_settings_are_clamped_and_capped_with_notes():
    studio = studio_for(max_delay_s=0.5, max_new_tokens=64)
    notes: list[str] = []
    s = h.parse_settings(studio, dict(max_new_tokens=10**9, temperature=-1, top_k="abc", delay=3.0, template="evil"),
                         notes)
    assert s.max_new_tokens == 64 and s.temperature == 0.0 and s.top_k == 0 and s.delay == 0.5
    assert s.template == "2.2.2" and any("capped at 0.5 s" in n for n in notes) and any("Unknown template" in n for n in notes)
    assert h.clamp("seed", float("nan"), notes, int) == 0


def test_hybrid_templates_are_accepted():
    from tr_core.tree import TEMPLATE_NAMES

    studio = studio_for()
    for template in ("hybrid", "hybrid-fixed"):
        notes: list[str] = []
        assert template in TEMPLATE_NAMES  # so the page's dropdown offers it
        assert h.parse_settings(studio, dict(template=template), notes).template == template and not notes


def test_the_first_cost_sized_answer_says_it_times_the_machine_first():
    studio = studio_for()
    session = Session(engine=FakeEngine(steps=2), k=8)
    first = run(studio, session, "question 1", template="adaptive")
    assert [v["status"] for v in first].count(h.PROBING) == 1
    assert first.index({"status": h.PROBING}) < next(i for i, v in enumerate(first) if "tree" in v)  # before any step
    second = run(studio, session, "question 2", template="adaptive")
    assert all(v.get("status") != h.PROBING for v in second)


def test_sessions_of_one_model_share_the_forward_costs_it_timed_once(monkeypatch):
    from conftest import TinyTokenizer, tiny_model
    from tr_core.config import DecodeConfig
    from tr_core.cost import ForwardCost
    from tr_core.engine import Engine

    studio = studio_for()
    model = tiny_model("llama")
    first = Engine(model, TinyTokenizer(96), topk_candidates=4)
    h.share_costs(studio, "m", first)
    assert studio.costs == {}  # nothing measured yet: nothing to share
    cfg = DecodeConfig(max_new_tokens=8, template="hybrid")
    list(first.generate([3, 4, 5, 6, 7], cfg))
    first.hybrid.cost.spread = 0.0  # as timed on a quiet machine (a busy one is the next test's)
    h.share_costs(studio, "m", first)
    assert ("m", "hybrid") in studio.costs and ("m", "adaptive") not in studio.costs

    def probe_again(*args, **kwargs):
        raise AssertionError("a second session timed the forwards again")

    monkeypatch.setattr(ForwardCost, "probe", probe_again)
    later = Engine(model, TinyTokenizer(96), topk_candidates=4)
    h.share_costs(studio, "m", later)
    assert later.hybrid.cost.measured and later.hybrid.cost is not first.hybrid.cost  # a copy: sessions stay apart
    assert not later.times_forwards_first(cfg) and later.times_forwards_first(cfg.with_(template="adaptive"))
    list(later.generate([3, 4, 5, 6, 7], cfg))
    other = Engine(model, TinyTokenizer(96), topk_candidates=4)
    h.share_costs(studio, "another model", other)
    assert not other.hybrid.cost.measured  # another model's forwards are timed for it


def test_a_cost_curve_timed_on_a_busy_machine_is_never_shared_and_is_timed_again_or_flagged():
    from tr_core.cost import STEADY_SPREAD, ForwardCost

    studio = studio_for()

    def engine_with(spread: float):
        cost = ForwardCost()
        cost.measured, cost.spread = True, spread
        engine = FakeCosts()
        engine.hybrid = SimpleNamespace(cost=cost)
        return engine

    busy = engine_with(STEADY_SPREAD * 2)
    h.share_costs(studio, "m", busy)  # after an answer: kept by its engine, shared with no one
    assert studio.costs == {} and busy.hybrid.cost.measured
    session = Session(engine=busy, k=8, model="m")
    curve = costs.cost_curve(session, None)
    assert not curve.steady and "spread" in curve.note  # shown flagged, never as fact
    for _ in range(costs.MAX_RETIMES):  # before each later answer: timed again
        h.share_costs(studio, "m", busy, before_answer=True)
        assert not busy.hybrid.cost.measured
        busy.hybrid.cost.measured, busy.hybrid.cost.spread = True, STEADY_SPREAD * 2
    h.share_costs(studio, "m", busy, before_answer=True)  # busy every time: kept for this session, flagged
    assert busy.hybrid.cost.measured and studio.costs == {}
    quiet = engine_with(0.0)
    h.share_costs(studio, "m", quiet)
    assert studio.costs[("m", "hybrid")].steady
    h.share_costs(studio, "m", busy, before_answer=True)  # a steady curve replaces the busy one
    assert busy.hybrid.cost.steady and costs.cost_curve(session, None).steady


def test_every_session_engine_takes_the_studios_costs_before_answering_and_bad_trees_still_fail_cleanly(monkeypatch):
    from conftest import TinyTokenizer, tiny_model
    from tr_core.engine import Engine

    monkeypatch.setattr(costs, "steady", lambda cost: True)  # as timed on a quiet machine (a busy one: the test above)

    studio = studio_for()
    model = tiny_model("llama")
    a = Session(engine=Engine(model, TinyTokenizer(96), topk_candidates=4), k=4)
    views = run(studio, a, "hello there", template="adaptive", max_new_tokens=6, compare=False, k=4)
    assert [v.get("status") for v in views].count(h.PROBING) == 1 and (a.model, "adaptive") in studio.costs
    b = Session(engine=Engine(model, TinyTokenizer(96), topk_candidates=4), k=4)  # an engine made before a's probe
    views = run(studio, b, "hello again", template="adaptive", max_new_tokens=6, compare=False, k=4)
    assert all(v.get("status") != h.PROBING for v in views) and b.engine.adaptive.cost.measured
    views = run(studio, b, "and now?", template="2.2.2", max_new_tokens=6, compare=False, k=4)  # needs k >= 8
    final = merged(views)
    assert final["status"].startswith("✗") and "TemplateError" in final["status"]
    assert final["chat"] == b.display and b.display[-1]["content"] != "…" and not b.answering


def test_hybrid_steps_keep_their_sources_live_in_the_trace_and_in_replays(tmp_path):
    studio = studio_for()
    session = Session(engine=FakeEngine(steps=3), k=8)
    views = run(studio, session, "hello", compare=False, template="hybrid")
    live = [v["tree"] for v in views if "tree" in v]
    assert live and all(ev.sources == ["root", "both", "context"] for ev in session.trace.steps)
    assert all(ev.origins == [None, FAKE_ORIGIN, FAKE_ORIGIN] for ev in session.trace.steps)

    def shows_sources(fig) -> bool:
        names = {t.get("name") for t in fig.traces}
        hover = " ".join(h for t in fig.traces for h in t.get("hovertext", []))
        return ({"shape: copied from earlier text", "shape: from the matrix and copied"} <= names and "and the matrix (candidate #0)" in hover
                and "copied from the prompt, its 4th token, in a run from its 3rd (after a 2-token match)" in hover)

    assert all(shows_sources(fig) for fig in live)  # live steps
    assert shows_sources(traces.replay(session, 2, True)["tree"])  # replay of the answer
    saved = Trace.load(session.files() / "trace.json")  # the downloaded trace keeps them too
    assert saved.steps == session.trace.steps
    path = saved.save(tmp_path / "hybrid_trace.json")
    other = Session(engine=FakeEngine(), k=8)
    view = traces.load_trace(studio, other, str(path))
    assert view["status"].startswith("Loaded a trace") and shows_sources(view["tree"])  # replay of an uploaded trace
    assert other.trace.steps == session.trace.steps


def test_the_step_story_follows_live_steps_slow_motion_replay_and_loaded_traces(tmp_path):
    studio = studio_for()
    session = Session(engine=FakeEngine(steps=3), k=8)
    views = run(studio, session, "hello", compare=False, delay=0.01)  # slow motion: every step is shown
    live = [unglossed(v["story"]) for v in views if "tree" in v and v["chat"][-1]["content"].endswith(" ▌")]
    assert len(live) == 3 and all("story" in v for v in views if "tree" in v)  # and the final view's
    assert [s.split("</span> ")[1].split(" drafted")[0] for s in live] == ["Step 1", "Step 2", "Step 3"]
    assert "The model agreed with 1 (&#x27;w8&#x27;) and added the bonus token &#x27;w9&#x27;" in live[0]
    assert "(2 rows new)" in live[0] and "(no row new)" in live[1]  # the fake rewrites the same two rows every step
    assert 'class="tr-story"' in live[0] and "<b>" not in live[0]
    assert "Step 2 drafted" in traces.replay(session, 2, True)["story"]  # the replay slider moves the story too
    session.trace.token_texts[8] = "<img src=x onerror=alert(1)>"
    story = traces.replay(session, 1, True)["story"]
    assert "<img" not in story and "&lt;img␣src=x␣…" in story  # token text from a trace is escaped
    other = Session(engine=FakeEngine(), k=8)
    view = traces.load_trace(studio, other, str(session.trace.save(tmp_path / "t.json")))
    full, brief = view["story"].split('<div class="tr-story-brief">')  # the page's story, then the presentation's
    assert full.count("drafted") == 1 and brief.count("drafted") == 1 and "&lt;img" in full and "&lt;img" in brief
    assert "row new)" in full and "new)" not in brief  # the brief one leaves the microscope's details out


def test_export_replay_writes_one_html_file_for_the_last_answer():
    studio = studio_for()
    session = Session(engine=FakeEngine(steps=2), k=8)
    empty = traces.export_replay(session)
    assert empty["replay_html"] is None and "No answer to export yet" in empty["status"] and session._files is None
    run(studio, session, "hello <script>x</script>", compare=False)
    view = traces.export_replay(session)
    page = open(view["replay_html"], encoding="utf-8").read()
    assert view["replay_html"].endswith("replay.html") and str(session.files()) in view["replay_html"]
    assert "Replay of 2 steps" in view["status"] and "&lt;script&gt;x&lt;/script&gt;" in page
    assert '<script id="tr-plotly">' in page and "Step 2 drafted" in page


def race_data(race: str) -> dict:
    """The timeline the race panel carries for the page's animation."""
    import html as html_lib

    match = re.search(r'data-timeline="([^"]*)"', race)
    assert match, race[:300]
    return json.loads(html_lib.unescape(match.group(1)))


def test_the_race_panel_carries_the_timeline_of_a_measured_answer_only():
    from studio.views import race_html
    from present.race import race_timeline

    studio = studio_for()
    session = Session(engine=FakeEngine(steps=4), k=8)
    views = run(studio, session, "hello")
    races = [v["race"] for v in views if "race" in v]
    assert "still being written" in races[0] and "still being measured" in races[1]  # answering, then measuring
    final = merged(views)
    data = race_data(final["race"])
    speed_of_last = session.trace.speed
    assert data == race_timeline(session.trace).to_dict() and data["mode"] == "measured"
    # the fake's steps take 12 ms for 2 tokens; the meter measured 1.67x, so plain decoding finishes 1.67x later
    assert data["tr"]["times"] == [12.0, 24.0, 36.0, 48.0] and data["plain"]["times"][-1] == pytest.approx(80.0)
    assert "1.67× ± 0.00" in data["caption"] and 'id="tr-race-tr"' in final["race"]
    unmeasured = merged(run(studio, session, "again", compare=False))["race"]
    assert "data-timeline" not in unmeasured
    assert "No race for this answer: this answer was not measured against plain decoding" in unmeasured
    trace = session.trace
    assert "no answer to race yet" in h.new_chat(session)["race"] and session.trace is None
    trace.speed = speed_of_last  # text from a model or a shared trace is escaped, in the data and the caption
    trace.step_texts[0] = "<script>alert(1)</script>"
    shown = race_html(trace)
    assert "<script>" not in shown and race_data(shown)["text"].startswith("<script>alert(1)</script>")


def test_the_cost_panel_puts_the_measured_cost_beside_the_gain_or_says_it_was_not_measured(tmp_path):
    from types import SimpleNamespace

    from tr_core.cost import ForwardCost

    studio = studio_for()
    session = Session(engine=FakeEngine(steps=3), k=8)
    views = run(studio, session, "hello", compare=False)
    live = [v["cost"] for v in views if "tree" in v and "cost" in v]
    assert live and all("is not shown" in c for c in live)  # a static tree never times forwards
    assert "the static trees never do" in traces.replay(session, 1, True)["cost"]
    cost = ForwardCost()
    cost.set_measured({1: [10.0], 2: [15.0], 3: [20.0], 4: [25.0]}, max_tokens=4)
    session.engine.adaptive = SimpleNamespace(cost=cost)
    shown = unglossed(traces.replay(session, 2, True)["cost"])
    from tr_core.machine import speed_label

    assert (f"This step verified 3 tokens in one forward (the last token and 2 drafted): on {speed_label()} that costs "
            "2.00× a one-token forward. It gained 2 tokens, so this step ran at 2 ÷ 2.00 = 1.00× plain speed.") in shown
    assert "tr-cost-par" in shown and "Speedup ≈ tokens per step (accepted drafts + the bonus) ÷ t(N)/t(1)" in shown
    brief = "Cost: 2 drafted + the last token in one forward = 2.00× one token's; gained 2 → this step alone ≈ 2 ÷ 2.00 = 1.00× plain speed (estimate)"
    assert f'<div class="tr-cost-brief">{html.escape(brief)}</div>' in shown  # the presentation view's one line
    cost.set_measured({1: [10.0], 2: [11.0], 3: [12.0], 4: [13.0]}, max_tokens=4)
    assert "2 ÷ 1.20 = 1.67× plain speed" in traces.replay(session, 1, True)["cost"]
    cost.spread = 0.5  # the same curve timed on a busy machine: flagged, its figures withheld
    busy = traces.replay(session, 1, True)["cost"]
    assert "busy" in busy and "spread ±50%" in busy and "1.67×" not in busy
    cost.spread = 0.0
    other = Session(engine=FakeEngine(), k=8)  # a trace recorded with another model: this machine's curve is not its
    session.trace.model = "someone <b>else</b>"
    view = traces.load_trace(studio, other, str(session.trace.save(tmp_path / "t.json")))
    assert "recorded with another model (someone &lt;b&gt;else&lt;/b&gt;)" in view["cost"]
    assert "no model has answered in this tab yet" in traces.load_trace(studio, Session(), str(tmp_path / "t.json"))["cost"]


def test_the_shown_steps_run_is_outlined_in_the_chat():
    studio = studio_for()
    session = Session(engine=FakeEngine(steps=3), k=8)
    final = merged(run(studio, session, "hello", compare=False))
    answer = final["chat"][-1]["content"]
    assert answer.count("tr-run-current") == 1  # the best step (the latest of ties: the third) is outlined
    assert answer.rindex('class="tr-run-a tr-run-current"') > answer.rindex('class="tr-run-b"')
    assert "tr-run-current" not in session.display[-1]["content"]  # the stored conversation is left unmarked
    replayed = traces.replay(session, 2, True)["chat"][-1]["content"]
    assert replayed.count('class="tr-run-b tr-run-current"') == 1 and replayed.count("<span") == 2  # steps 1-2 only
    plain = traces.replay(session, 1, False)["chat"][-1]["content"]
    assert plain.count('<span class="tr-run-current">') == 1 and "tr-run-a" not in plain  # colours off: outline only


def test_presentation_view_is_a_class_on_the_page_root_from_the_toggle_or_the_url():
    from studio.page import CSS, PRESENT_FROM_URL_JS, PRESENT_JS, RACE_JS, build_demo

    demo = build_demo(studio_for())
    config = demo.get_config_file()
    ids = {c.get("props", {}).get("elem_id") for c in config["components"]}
    hidden = ("tr-title-col", "tr-examples", "tr-settings", "tr-model-panel", "tr-how")
    assert {"tr-present", "tr-race", "tr-race-box", "tr-cost", "tr-left", "tr-right", *hidden} <= ids
    assert all(f".tr-present #{i}" in CSS for i in hidden) and "display: none" in CSS
    scripts = {d.get("js") for d in config["dependencies"]}
    assert {PRESENT_JS, PRESENT_FROM_URL_JS, RACE_JS} <= scripts  # browser-side: no server time, no endpoint
    assert "get('view') === 'present'" in PRESENT_FROM_URL_JS and "classList.toggle('tr-present', on)" in PRESENT_JS
    assert not any(d.get("api_name") in ("race", "present") for d in config["dependencies"])
    # "$$...$$" from a visitor, a model or a trace is text, not typeset maths (colour spans ended up inside it)
    props = {c.get("props", {}).get("elem_id"): c.get("props", {}) for c in config["components"]}
    assert props["tr-chat"]["latex_delimiters"] == [] and props["tr-status"]["latex_delimiters"] == []
    # the chat's own trash button starts a new conversation, as New chat does (it would only clear the view)
    chat_id = next(c["id"] for c in config["components"] if c.get("props", {}).get("elem_id") == "tr-chat")
    assert any([chat_id, "clear"] in [list(t) for t in d["targets"]] for d in config["dependencies"])


def test_trim_to_context_drops_oldest_turns_first():
    def encode(msgs):  # 10 tokens per message
        return [0] * (10 * len(msgs))

    msgs = [{"role": "user", "content": c} for c in "abcde"]
    ids, dropped, max_new = h.trim_to_context(encode, msgs, limit=40, max_new=15)
    assert dropped == 4 and len(ids) == 10 and max_new == 15
    ids, dropped, max_new = h.trim_to_context(encode, msgs[-1:], limit=15, max_new=10)
    assert dropped == 0 and max_new == 5
    with pytest.raises(InputError):
        h.trim_to_context(encode, msgs[-1:], limit=10, max_new=10)


def test_public_mode_is_implied_and_refuses_every_unlisted_name_alike():
    assert not wants_public(False, False, "127.0.0.1") and not wants_public(False, False, "localhost")
    assert wants_public(True, False, "127.0.0.1") and wants_public(False, True, "127.0.0.1")
    assert wants_public(False, False, "0.0.0.0") and wants_public(False, False, "192.168.1.5")
    assert parse_models("a, b,,a", "embedded") == ("embedded", "a", "b")
    cfg = make_config(True, ("embedded", "org/model"), None, None)
    assert cfg.time_limit_s == 120 and cfg.max_delay_s == 0.5
    loads: list[str] = []
    studio = h.Studio(config=cfg, catalog=ModelCatalog(cfg, loader=lambda n: loads.append(n) or (None, None)))
    session = Session()
    answers = {h.load_model(studio, session, name)["status"] for name in
               ("/etc/passwd", "/etc", "no/such", "../x.gguf", "a" * 600, "bad\ud800")}
    assert answers == {f"✗ {REFUSED}"} and loads == []
    with pytest.raises(ModelRefused):
        studio.catalog.get("/etc/passwd")


def test_catalogue_loads_each_model_once_without_blocking_other_names():
    entered, gate, slow_done = threading.Event(), threading.Event(), threading.Event()
    calls: list[str] = []

    def loader(name):
        calls.append(name)
        if name == "slow":
            entered.set()
            gate.wait(30)  # released by the test once the other name has loaded (30 s: only if it never does)
            slow_done.set()
        return (name, None)

    catalog = ModelCatalog(StudioConfig(), loader=loader)
    results: list = []
    slow = [threading.Thread(target=lambda: results.append(catalog.get("slow"))) for _ in range(3)]
    for t in slow:
        t.start()
    assert entered.wait(30), "the slow load never started"
    # not held up by the slow load: it loads while the slow one is still inside its loader (one held up behind it
    # would return only after the slow load gave up waiting, by when slow_done is set)
    assert catalog.get("embedded")[0] == "embedded"
    assert not slow_done.is_set()
    gate.set()
    for t in slow:
        t.join(5)
    assert calls.count("slow") == 1 and [r[0] for r in results] == ["slow"] * 3


def test_bad_trace_leaves_the_session_exactly_as_before(tmp_path):
    studio = studio_for()
    session = Session(engine=FakeEngine(), k=8)
    run(studio, session, "hello", compare=False)
    before = (list(session.display), session.trace, list(session.history), session.conversation)
    good = session.trace.to_dict()
    bad = json.loads(json.dumps(good))
    bad["steps"][0]["parents"][1] = 5
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    view = traces.load_trace(studio, session, str(path))
    assert view["status"].startswith("✗") and "parent" in view["status"] and str(tmp_path) not in view["status"]
    assert (session.display, session.trace, session.history, session.conversation) == before
    assert traces.replay(session, 1, True)["status"].startswith("Replaying step 1")
    good["messages"][0]["content"] = "<img src=x>"
    path.write_text(json.dumps(good))
    view = traces.load_trace(studio, session, str(path))
    assert view["status"].startswith("Loaded a trace") and "<img" not in view["chat"][0]["content"]


def test_sessions_make_no_folder_until_something_is_saved_and_remove_it_when_closed():
    studio = studio_for()
    session = Session(engine=FakeEngine(), k=8)
    assert session._files is None
    traces.replay(session, 1, True)
    assert session._files is None
    run(studio, session, "hello", compare=False)
    folder = session._files
    assert folder is not None and (folder / "trace.json").is_file()
    session.close()
    assert not folder.exists()


# --------------------------------------------------------------------- the running app, gradio_client


def chat(client, message: str, **over):
    return client.submit(message=message, **dict(dict(max_new_tokens=24, template="2.2.2", compare=True), **over),
                         api_name="/chat")


def plot_json(value) -> dict:
    return json.loads(value["plot"])


def file_of(value) -> str:
    """A file output's local path (a DownloadButton update carries it in "value")."""
    return value["value"] if isinstance(value, dict) else value


def text_of(message: dict) -> str:
    content = message["content"]
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content)


@pytest.fixture(scope="module")
def client():
    with running_app() as url:
        yield gradio_client.Client(url, verbose=False)


def test_message_streams_answer_with_measured_speedup_and_marked_tree(client):
    job = chat(client, "Translate to French: I like green apples.")
    final = job.result(timeout=300)
    (chat_out, _, status, meter, tree, heat, chart, matrix_md, replay, trace_path, _, _, story, cost, race, decoding,
     microscope, warm) = final
    assert len(job.outputs()) >= 3, "expected a streamed answer"
    assert chat_out[-1]["role"] == "assistant" and len(text_of(chat_out[-1])) > 5
    assert 'class="tr-run-a"' in text_of(chat_out[-1])  # accepted runs coloured
    assert "token-identical to plain decoding" in meter
    ratio = re.search(r'id="tr-ratio">([^<]*)<', meter).group(1)
    assert re.fullmatch(r"\d+\.\d\d× ± \d+\.\d\d", ratio) or ratio == "too noisy to measure", ratio
    fig = plot_json(tree)
    nodes = {t.get("name"): t for t in fig["data"] if t.get("mode") == "markers+text"}
    shown = sum(len(t["x"]) for name, t in nodes.items() if not name.startswith("bonus"))  # root + drafts
    assert 1 < shown <= 1 + 80  # 2.2.2, less the nodes under rows never written
    assert any(t.get("mode") == "lines" and t["line"]["color"] == ACCEPTED_COLOUR for t in fig["data"])
    labels = plot_json(heat)["data"][0]["y"]
    assert len(labels) == len(set(labels)) > 0 and "rows filled" in matrix_md
    trace = Trace.load(file_of(trace_path))
    assert trace.speed is not None and trace.speed["identical"] is True
    assert replay["maximum"] == max(len(trace.steps), 2) and 0 < trace.summary.new_tokens <= 24
    assert f"drafted {shown - 1} tokens" in story and 'class="tr-story"' in story  # the step shown (13th output)
    from present.tour import matrix_kept, telling_step

    best = telling_step(trace)  # the step where the most matrix drafts were accepted, then the most tokens
    assert all(matrix_kept(e) <= matrix_kept(trace.steps[best]) for e in trace.steps)
    limit = (f" It stopped at its {trace.summary.new_tokens}-token limit (Max new tokens)."
             if trace.summary.stop_reason == "length" else "")  # why it ends mid-sentence
    if trace.summary.stop_reason == "eos" and len(trace.steps) > 1 and not trace.step_texts[-1].strip():
        limit = f" Step {len(trace.steps)} gave only the end-of-turn token, which the chat does not show."
    gained, matrix = len(trace.steps[best].emitted), matrix_kept(trace.steps[best])
    why = (f"the one with the most drafts from the matrix alone accepted ({matrix}; {gained} tokens)" if matrix else
           f"the one that gained the most tokens ({gained})")
    assert status == f"✓ Done. Showing step {best + 1} of {len(trace.steps)}, {why}.{limit}"  # why this step
    assert fig["layout"]["title"]["text"].startswith(f"Step {best + 1}:")
    assert "Cost of this step" in cost and f"verified {shown} tokens in one forward" in unglossed(cost)  # 14th: cost
    if trace.speed["trusted"]:  # 15th: the race, from the recorded measurement; or why there is none
        assert 'class="tr-race"' in race and "data-timeline=" in race
    else:
        assert "No race for this answer" in race and "could not measure" in race
    assert "Greedy" in decoding and "under the microscope" in microscope  # 16th and 17th
    assert "Learned beforehand" in warm and "arm start" not in warm  # 18th: where the session's matrix came from


def test_replay_bad_inputs_and_a_missing_model_keep_the_session_working(client):
    assert "Type a message" in chat(client, "   ").result(timeout=60)[2]
    final = chat(client, "Say hi.", top_k=10**6, compare=False).result(timeout=300)
    assert "clamped" in final[2] and "not measured" in final[3]
    out = client.predict(1, True, api_name="/replay")
    assert "Replaying step 1" in out[2] and plot_json(out[4])["data"]
    status = client.predict("no-such-org/no-such-model-xyz", api_name="/load_model")[2]
    assert "Could not load" in status and "Still using" in status
    again = chat(client, "Name a colour.", compare=False).result(timeout=300)
    assert again[0][-1]["role"] == "assistant" and text_of(again[0][-1]).strip()


def test_trace_round_trip_and_matrix_save_reset_load(client, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "nope"}')
    assert "not a Token Recycling trace" in client.predict(gradio_client.handle_file(str(bad)), api_name="/load_trace")[2]
    final = chat(client, "Count from 1 to 5.", compare=False).result(timeout=300)
    out = client.predict(gradio_client.handle_file(file_of(final[9])), api_name="/load_trace")
    assert "Loaded a trace" in out[2] and plot_json(out[4])["data"]
    saved = client.predict(api_name="/save_matrix")
    filled = int(re.search(r"([\d,]+) rows filled", saved[2]).group(1).replace(",", ""))
    assert filled > 0
    out = client.predict(api_name="/reset_matrix")  # back to the warm start: the answer's rows are forgotten
    assert "learned beforehand" in out[2] or "cleared" in out[2]
    reset = torch.load(file_of(client.predict(api_name="/save_matrix")[10]), weights_only=True)["table"]
    assert not torch.equal(reset, torch.load(file_of(saved[10]), weights_only=True)["table"])
    if "learned beforehand" in out[2]:  # the shipped warm start's rows, exactly (it fills every row: the count stays)
        shipped = safetensors.torch.load_file(str(warm.SHIPPED))
        assert torch.equal(reset[shipped["matrix.rows"]], shipped["matrix.table"].to(reset.dtype))
    out = client.predict(gradio_client.handle_file(file_of(saved[10])), 8, api_name="/load_matrix")
    assert "Matrix loaded" in out[2] and f"{filled:,} / " in out[7]
    junk = tmp_path / "bad.pt"
    junk.write_bytes(b"not a matrix")
    out = client.predict(gradio_client.handle_file(str(junk)), 8, api_name="/load_matrix")
    assert "Could not load the matrix" in out[2] and f"{filled:,} / " in out[7] and str(tmp_path) not in out[2]
    out = client.predict(gradio_client.handle_file(str(junk)), 4, api_name="/load_matrix")  # with another k too
    assert "Could not load the matrix" in out[2] and f"{filled:,} / " in out[7] and "k = 8" in out[7]
    other = gradio_client.Client(client.src, verbose=False)  # another tab: its own conversation and matrix
    assert "No matrix yet" in other.predict(api_name="/save_matrix")[2]


def test_stop_keeps_the_answer_so_far_and_adaptive_trees_draw(client):
    job = chat(client, "Write a long story about a robot who learns to paint.", max_new_tokens=400)
    deadline = time.monotonic() + 240
    while len(job.outputs()) < 4 and not job.done() and time.monotonic() < deadline:
        time.sleep(0.2)
    client.predict(api_name="/stop")
    final = job.result(timeout=120)
    assert "Stopped" in final[2]
    trace = Trace.load(file_of(final[9]))
    assert trace.summary.stop_reason == "stopped" and 0 < trace.summary.new_tokens < 400
    final = chat(client, "List three fruits.", template="adaptive", max_new_tokens=16, compare=False).result(timeout=300)
    assert any(t.get("name") == "root (last committed token)" for t in plot_json(final[4])["data"])


def test_registry_closes_idle_and_surplus_sessions_and_forgets_deleted_ones():
    from types import SimpleNamespace

    from studio.page import Registry

    registry = Registry(studio_for(), idle_s=0.2, max_sessions=2)
    a = registry.get(None, SimpleNamespace(session_hash="a"))
    folder = a.files()
    assert registry.get(None, SimpleNamespace(session_hash="a")) is a  # the same tab keeps its session
    time.sleep(0.3)
    registry.get(None, SimpleNamespace(session_hash="b"))  # a script that never came back: swept when idle
    assert "a" not in registry.sessions and not folder.exists()
    registry.get(None, SimpleNamespace(session_hash="c"))
    d = registry.get(None, SimpleNamespace(session_hash="d"))
    assert set(registry.sessions) == {"c", "d"}  # over the cap: the oldest goes
    registry.discard(d)
    assert d not in registry.sessions.values()


def test_repetition_penalty_reaches_the_decoding_settings():
    studio = studio_for()
    notes: list[str] = []
    s = h.parse_settings(studio, dict(repetition_penalty=9.0), notes)
    assert s.repetition_penalty == 2.0 and any("repetition_penalty" in n for n in notes)
    session = Session(engine=FakeEngine(), k=8)
    run(studio, session, "hello", compare=False, repetition_penalty=1.3)
    assert session.trace.settings["repetition_penalty"] == 1.3


def test_in_a_crowd_the_meter_says_why_it_did_not_measure(monkeypatch):
    """While other visitors' answers are written (the shared decode loop is busy), an answer is not measured:
    timing both methods would slow them. The meter says so; without a crowd the same answer is measured."""
    import studio.handlers as handlers
    import studio.measure as measure

    studio = studio_for()
    session = Session(engine=FakeEngine(steps=3), k=8)
    monkeypatch.setattr(handlers, "crowd", lambda: 3)
    final = merged(run(studio, session, "in a crowd", compare=True))
    assert "other visitors&#x27; answers were being written" in final["meter"]
    assert session.trace.speed is None
    monkeypatch.setattr(handlers, "crowd", lambda: 0)
    calls = iter([0, 5])  # a crowd arrives after the measurement's first round (of several: a long answer)
    monkeypatch.setattr(measure, "crowd", lambda: next(calls, 5))
    session.engine = FakeEngine(steps=200, step_s=0.002)
    merged(run(studio, session, "then alone", compare=True, max_new_tokens=400))
    assert session.trace.speed is not None and session.trace.speed["reason"] == measure.CROWD_STOP


def test_the_matrix_line_says_how_many_rows_this_conversation_wrote_when_others_came_beforehand():
    """A reader met '49,152 / 49,152 rows filled' after one short answer: rows filled beforehand (a load, the
    learned-beforehand matrix: stamp -1) are told apart from the rows this conversation's steps wrote."""
    from studio.views import matrix_info
    from tr_core.matrix import AdjacencyMatrix

    m = AdjacencyMatrix(50, k=4)
    engine = SimpleNamespace(matrix=m)
    m.filled[:40] = True  # learned beforehand
    assert "40 / 50 rows filled (all learned beforehand) ·" in matrix_info(engine, 4)  # before the first answer
    m.update(torch.tensor([3, 45]), torch.randn(2, 50), stamp=7)
    line = matrix_info(engine, 4)
    assert "41 / 50 rows filled (2 written by this conversation, the rest learned beforehand)" in line
    m.filled[:], m.stamps[:] = False, -1
    m.update(torch.tensor([1]), torch.randn(1, 50), stamp=0)
    assert "1 / 50 rows filled ·" in matrix_info(engine, 4)  # all its own: no note


def test_the_first_view_carries_what_set_up_left_to_show_and_the_return_value_passes():
    """handlers.with_first: set-up's note joins the answer's first view (no update of its own to wait on), or
    goes alone when the answer shows nothing; what the answer returns comes through."""
    def views(items, value):
        yield from items
        return value

    out = h.with_first(views([{"status": "a"}, {"status": "b"}], "done"), {"warm": "w", "status": "old"})
    assert next(out) == {"warm": "w", "status": "a"} and next(out) == {"status": "b"}
    with pytest.raises(StopIteration) as end:
        next(out)
    assert end.value.value == "done"
    assert list(h.with_first(views([], None), {"warm": "w"})) == [{"warm": "w"}]
    assert list(h.with_first(views([], None), {})) == []
