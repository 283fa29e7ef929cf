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
    trace = Trace.load(trace_path)
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
    path = final[-1]
    out = client.predict(gradio_client.handle_file(path), api_name="/load_trace")
    assert "Loaded a trace" in out[1]
    assert plot_json(out[3])["data"]


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
