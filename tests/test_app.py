"""The app end to end: launch `python app.py` and drive it with gradio_client (embedded model, few tokens).

Also unit tests of the app's pure helpers (context trimming, clamping) that need no model.
"""
from __future__ import annotations

import json
import re

import pytest

import app
from conftest_app import running_app
from tr_core.figures import ACCEPTED_COLOUR
from tr_core.trace import Trace

gradio_client = pytest.importorskip("gradio_client")
import gradio_client.exceptions  # noqa: E402

SETTINGS = dict(max_new=24, temperature=0.0, top_p=1.0, top_k=0, seed=0, template="2.2.2", k=8, compare=True,
                delay=0.0, colour=True)


def chat(client, message: str, **over):
    s = dict(SETTINGS, **over)
    return client.submit(message, s["max_new"], s["temperature"], s["top_p"], s["top_k"], s["seed"], s["template"],
                         s["k"], s["compare"], s["delay"], s["colour"], api_name="/chat")


def meter_numbers(html: str) -> dict[str, str]:
    return dict(re.findall(r'id="tr-(\w+)">([^<]*)<', html))


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


def test_message_streams_answer_with_measured_speedup_identical_flag_and_marked_tree(client):
    job = chat(client, "Translate to French: I like green apples.")
    final = job.result(timeout=300)
    updates = job.outputs()
    chat_out, _, status, meter, tree, heat, chart, matrix_md, replay, trace_path = final
    # streamed: several updates before the final one, the answer growing
    assert len(updates) >= 3, f"expected a streamed answer, got {len(updates)} updates"
    assert chat_out[-1]["role"] == "assistant" and len(text_of(chat_out[-1])) > 5
    assert 'class="tr-run-a"' in text_of(chat_out[-1])  # accepted runs coloured
    # final meter: measured plain speed, a ratio and the identical-output flag
    nums = meter_numbers(meter)
    assert "speedup (measured)" in meter and "token-identical to plain decoding" in meter, meter
    assert float(nums["tps"]) > 0 and float(nums["plain"]) > 0 and re.fullmatch(r"\d+\.\d\d×", nums["ratio"])
    # tree: the root and the 80 draft nodes of the paper's 2.2.2 template, the accepted path drawn in the accepted colour
    fig = plot_json(tree)
    nodes = {t.get("name"): t for t in fig["data"] if t.get("mode") == "markers+text"}
    n_nodes = sum(len(t["x"]) for name, t in nodes.items() if not name.startswith("bonus"))
    assert n_nodes == 1 + 80  # the root + the 80 draft tokens of 2.2.2
    assert nodes["accepted draft tokens"]["marker"]["color"] == ACCEPTED_COLOUR
    assert any(t.get("mode") == "lines" and t["line"]["color"] == ACCEPTED_COLOUR for t in fig["data"])
    heat_fig = plot_json(heat)
    labels = heat_fig["data"][0]["y"]
    assert len(labels) == len(set(labels)) > 0
    assert "rows filled" in matrix_md
    # the trace file replays without a model and agrees with the meter
    trace = Trace.load(file_of(trace_path))
    assert trace.identical is True
    assert replay["maximum"] == max(len(trace.steps), 2)
    assert trace.answer.strip() and trace.summary.new_tokens <= 24


def test_replay_empty_message_and_bad_inputs_keep_the_session_working(client):
    empty = chat(client, "   ").result(timeout=60)
    assert "Type a message" in empty[2]
    # out-of-range sliders are refused by the page itself; free-form numbers are clamped with a note
    with pytest.raises(gradio_client.exceptions.AppError, match="greater than maximum"):
        chat(client, "Say hi.", max_new=1000000).result(timeout=60)
    job = chat(client, "Say hi.", top_k=10**6, compare=False)
    final = job.result(timeout=300)
    assert "clamped" in final[2]
    assert "not compared" in final[3] or "estimate" in final[3]
    # replay an earlier step: tree, heatmap, chart and text up to that step
    tree, heat, chart, chat_out, status = client.predict(1, True, api_name="/replay")
    assert "Replaying step 1" in status and plot_json(tree)["data"]
    # a model that does not exist: clear error, previous model kept, chatting still works
    status, _chat, _md = client.predict("no-such-org/no-such-model-xyz", api_name="/load_model")
    assert "Could not load" in status and "Still using" in status
    again = chat(client, "Name a colour.", compare=False).result(timeout=300)
    assert again[0][-1]["role"] == "assistant" and text_of(again[0][-1]).strip()


def test_trace_round_trip_through_the_page(client, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "nope"}')
    out = client.predict(gradio_client.handle_file(str(bad)), api_name="/load_trace")
    assert "not a Token Recycling trace" in out[1]
    final = chat(client, "Count from 1 to 5.", compare=False).result(timeout=300)
    path = file_of(final[-1])
    out = client.predict(gradio_client.handle_file(path), api_name="/load_trace")
    assert "Loaded a trace" in out[1]
    assert plot_json(out[3])["data"]


def test_stop_keeps_the_answer_so_far_and_adaptive_trees_draw(client):
    import time

    job = chat(client, "Write a long story about a robot who learns to paint.", max_new=400, compare=True)
    deadline = time.monotonic() + 240
    while len(job.outputs()) < 3 and not job.done() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert client.predict(api_name="/stop").startswith("■ Stopping")
    final = job.result(timeout=120)
    assert "Stopped" in final[2]
    trace = Trace.load(file_of(final[-1]))
    assert trace.summary.stop_reason == "stopped" and 0 < trace.summary.new_tokens < 400
    assert text_of(final[0][-1]).strip()
    # the adaptive tree changes shape per step; every step still draws with its accepted path
    final = chat(client, "List three fruits.", template="adaptive", max_new=16, compare=False).result(timeout=300)
    fig = plot_json(final[4])
    assert any(t.get("name") == "root (last committed token)" for t in fig["data"])


def test_matrix_save_reset_load_and_model_reload(client, tmp_path):
    chat(client, "Hello!", compare=False).result(timeout=300)
    saved, status = client.predict(api_name="/save_matrix")
    assert "Matrix saved" in status
    filled = int(re.search(r"([\d,]+) rows filled", status).group(1).replace(",", ""))
    assert filled > 0
    status, md = client.predict(api_name="/reset_matrix")
    assert "cleared" in status and " 0 / " in md
    status, md = client.predict(gradio_client.handle_file(file_of(saved)), 8, api_name="/load_matrix")
    assert "Matrix loaded" in status and f"{filled:,} / " in md
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a matrix")
    status, md = client.predict(gradio_client.handle_file(str(bad)), 8, api_name="/load_matrix")
    assert "Could not load the matrix" in status and f"{filled:,} / " in md  # left untouched
    status, _chat, md = client.predict("embedded", api_name="/load_model")
    assert status.startswith("✓ Loaded") and " 0 / " in md
    # another browser session has its own conversation and matrix
    other = gradio_client.Client(client.src, verbose=False)
    assert "No matrix yet" in other.predict(api_name="/save_matrix")[1]


# ----------------------------------------------------------------------------------- pure helpers


def test_trim_to_context_drops_oldest_turns_first():
    def encode(msgs):  # 10 tokens per message
        return [0] * (10 * len(msgs))

    msgs = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}, {"role": "user", "content": "e"}]
    ids, dropped, max_new = app.trim_to_context(encode, msgs, limit=40, max_new=15)
    assert dropped == 4 and len(ids) == 10 and max_new == 15
    ids, dropped, max_new = app.trim_to_context(encode, msgs[-1:], limit=15, max_new=10)
    assert dropped == 0 and max_new == 5
    with pytest.raises(ValueError):
        app.trim_to_context(encode, msgs[-1:], limit=10, max_new=10)


def test_clamp_settings():
    notes: list[str] = []
    assert app.clamp("temperature", -1, notes) == 0.0
    assert app.clamp("max_new_tokens", 10**9, notes, int) == app.LIMITS["max_new_tokens"][1]
    assert app.clamp("top_k", "abc", notes, int) == 0
    assert len(notes) == 3


# ------------------------------------------------------------- respond() in process, on a fake engine


class FakeMatrix:
    rows_filled, size_mb = 3, 0.1

    class table:
        shape = (100, 2)


class FakeEngine:
    """Stands in for tr_core.Engine: 10 prompt tokens per message, two steps of fixed events."""

    context_limit = 50

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.matrix = FakeMatrix()
        self.prompts: list[list[int]] = []

    def encode_chat(self, messages):
        return [7] * (10 * len(messages))

    def decode(self, ids):
        return "".join(f"w{i} " for i in ids)

    def token_text(self, t):
        return f"w{t}"

    def generate(self, ids, cfg, stop=None):
        from tr_core.events import StepEvent, SummaryEvent

        self.prompts.append(list(ids))
        if self.fail:
            raise RuntimeError("boom")
        out = []
        for step in range(2):
            ev = StepEvent(step=step, position=len(ids) + step, tokens=[7, 8, 9], parents=[-1, 0, 1], depths=[0, 1, 2],
                           ranks=[-1, 0, 0], accepted=[0, 1], emitted=[8, 9], bonus=9,
                           timings={"total": 10.0, "forward": 8.0}, matrix_rows=[7, 8], matrix_values=[[8, 1], [9, 2]],
                           matrix_probs=[[0.9, 0.1], [0.8, 0.2]], template=cfg.template)
            out += ev.emitted
            yield ev
        yield SummaryEvent(tokens=out, prompt_tokens=len(ids), new_tokens=len(out), steps=2, mean_accepted=2.0,
                           tokens_per_s=100.0 if not cfg.plain else 50.0, prefill_s=0.0, decode_s=0.04, wall_s=0.04,
                           stop_reason="length", method="plain" if cfg.plain else "recycling", template=cfg.template,
                           matrix_rows_filled=3, matrix_mb=0.1)


@pytest.fixture(scope="module")
def demo():
    return app.build_demo()


def run_respond(session, message, **over):
    s = dict(SETTINGS, **over)
    return list(app.respond(message, session, s["max_new"], s["temperature"], s["top_p"], s["top_k"], s["seed"],
                            s["template"], s["k"], s["compare"], s["delay"], s["colour"]))


def test_long_conversation_is_trimmed_with_a_warning_and_errors_keep_the_session(demo):
    session = app.Session(engine=FakeEngine(), k=8)
    for i in range(3):
        outs = run_respond(session, f"question {i}", max_new=10)
    final = outs[-1]
    # 3 user turns + 2 answers = 50 prompt tokens > 50 - 10: the oldest question/answer pair is dropped
    assert "oldest 2 message(s) were left out" in final[app.status]
    assert session.engine.prompts[-2] == [7] * 30
    assert len(session.history) == 6 and session.history[-1]["content"] == "w8 w9 w8 w9 "
    assert "speedup (measured)" in final[app.meter] and "2.00×" in final[app.meter]
    session.engine.fail = True
    outs = run_respond(session, "this one fails")
    assert "Generation failed: RuntimeError: boom" in outs[-1][app.status]
    assert len(session.history) == 6  # the failed turn left the conversation as it was
    session.engine.fail = False
    outs = run_respond(session, "and this works again")
    assert outs[-1][app.status].startswith("⚠") or "Done" in outs[-1][app.status]
    assert session.history[-1]["role"] == "assistant"


def test_empty_message_is_ignored_with_a_hint(demo):
    session = app.Session(engine=FakeEngine(), k=8)
    outs = run_respond(session, "  \n ")
    assert len(outs) == 1 and "Type a message" in outs[0][app.status] and session.engine.prompts == []
