"""ZeroGPU (issue 40 item 6): on a Space with SPACES_ZERO_GPU set, decoding and the speed measurement run inside
functions decorated with `spaces.GPU`, with durations that fit the time limits; elsewhere nothing changes.

A stand-in `spaces` module records what it decorates, the durations asked for and every call, and makes each
call cross a process boundary as ZeroGPU does: arguments and results are pickled, and nothing else comes back.
"""
from __future__ import annotations

import pickle
import sys
import types

import pytest

from studio import handlers as h
from studio import zerogpu
from studio.session import Session
from test_app import merged, studio_for


class StandInSpaces(types.ModuleType):
    """`spaces` as ZeroGPU's decorator behaves for a generator function: calls recorded, values pickled across."""

    def __init__(self) -> None:
        super().__init__("spaces")
        self.decorated: list[str] = []
        self.calls: list[dict] = []

    def GPU(self, duration=None):  # noqa: N802 - the real name
        def decorate(fn):
            self.decorated.append(fn.__name__)

            def call(*args, **kwargs):
                asked = duration(*args, **kwargs) if callable(duration) else duration
                record = dict(name=fn.__name__, duration=asked, kwargs=kwargs, sent=[])
                self.calls.append(record)
                args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))  # the worker gets copies
                for item in fn(*args, **kwargs):
                    record["sent"].append(type(item).__name__)
                    yield pickle.loads(pickle.dumps(item))  # and sends copies back

            return call
        return decorate


@pytest.fixture
def spaces(monkeypatch):
    """The stand-in, installed as `spaces` on a ZeroGPU Space; the studio's GPU functions are cleared after."""
    fake = StandInSpaces()
    monkeypatch.setitem(sys.modules, "spaces", fake)
    monkeypatch.setenv(zerogpu.ZEROGPU_ENV, "true")
    yield fake
    zerogpu._CALLS.clear()
    zerogpu._ENGINES.clear()
    zerogpu._INSTALLED.clear()


def tiny_studio(**config):
    from conftest import TinyTokenizer, tiny_model

    model = tiny_model("llama")
    studio = studio_for(**config)
    studio.catalog._loader = lambda name: (model, TinyTokenizer(96))
    return studio, model


def test_elsewhere_nothing_is_decorated_and_spaces_need_not_exist(monkeypatch):
    monkeypatch.setattr(h, "warm_up", lambda engine, name, learn, progress=None: h.WarmStart(None, "cold"))
    monkeypatch.delenv(zerogpu.ZEROGPU_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "spaces", None)  # `import spaces` would raise
    zerogpu.import_spaces()
    assert zerogpu.install(object()) is False and not zerogpu.installed()
    studio, _ = tiny_studio()
    session = Session(model="m", k=8)
    views = list(h.respond(studio, session, "hello", h.parse_settings(
        studio, dict(max_new_tokens=6, template="2.2.2", compare=False), []), []))
    assert merged(views)["chat"][-1]["role"] == "assistant" and session.engine.matrix.rows_filled > 0


def test_answers_and_measurements_run_in_gpu_calls_that_fit_the_time_limits(spaces, monkeypatch):
    from conftest import TinyTokenizer
    from tr_core.config import DecodeConfig
    from tr_core.engine import Engine

    monkeypatch.setattr(h, "warm_up", lambda engine, name, learn, progress=None: h.WarmStart(None, f"cold (learn={learn})"))
    studio, model = tiny_studio(time_limit_s=60.0, measure_max_s=20.0)
    assert zerogpu.install(studio.catalog)
    assert spaces.decorated == ["gpu_decode", "gpu_measure"]
    session = Session(model="m", k=8)
    views = list(h.respond(studio, session, "hello", h.parse_settings(
        studio, dict(max_new_tokens=12, template="2.2.2", compare=True), []), []))
    final = merged(views)
    assert [c["name"] for c in spaces.calls] == ["gpu_decode", "gpu_measure"]
    decode, measure = spaces.calls
    # 12 tokens ask for the shortest call (MIN_DECODE_S of decoding), well inside the 60 s time limit
    assert decode["duration"] == zerogpu.MIN_DECODE_S + zerogpu.SETUP_S
    assert decode["kwargs"]["decode_s"] == zerogpu.MIN_DECODE_S
    assert measure["duration"] == 20 + zerogpu.SETUP_S
    assert session.warm_note == "cold (learn=False)"  # the app's CPU copy never learns a warm start on ZeroGPU
    # the answer is plain decoding's, token for token, and the matrix it taught came back to the session
    plain = Engine(model, TinyTokenizer(96), topk_candidates=8)
    ids = session.trace.messages and plain.encode_chat(session.trace.messages)
    expected = [t for e in plain.generate(ids, DecodeConfig(max_new_tokens=12, plain=True)) for t in
                getattr(e, "emitted", [])]
    assert session.trace.summary.tokens == expected
    assert session.engine.matrix.rows_filled > 0 and session.trace.speed["identical"] is True
    assert "token-identical" in final["meter"]


def test_a_time_limit_longer_than_a_gpu_call_is_cut_to_fit_it(monkeypatch):
    monkeypatch.setenv(zerogpu.MAX_DURATION_ENV, "90")
    assert zerogpu.answer_budget(None) == (90.0 - zerogpu.SETUP_S, 90)
    assert zerogpu.answer_budget(300.0) == (90.0 - zerogpu.SETUP_S, 90)
    assert zerogpu.answer_budget(30.0) == (30.0, 30 + zerogpu.SETUP_S)
    # the call follows the requested tokens (TOKEN_S each), within the time limit and the longest call
    assert zerogpu.answer_budget(None, 400) == (400 * zerogpu.TOKEN_S, int(400 * zerogpu.TOKEN_S) + zerogpu.SETUP_S)
    assert zerogpu.answer_budget(30.0, 400) == (30.0, 30 + zerogpu.SETUP_S)
    assert zerogpu.answer_budget(None, 4000) == (90.0 - zerogpu.SETUP_S, 90)
    assert zerogpu.measure_duration(200.0) == 90
    monkeypatch.setenv(zerogpu.MAX_DURATION_ENV, "a lot")
    assert zerogpu.max_duration() == zerogpu.DEFAULT_MAX_S


def test_stop_reaches_the_gpu_worker_which_still_sends_back_what_it_learned(spaces):
    from conftest import TinyTokenizer
    from tr_core.config import DecodeConfig
    from tr_core.engine import Engine
    from tr_core.events import StepEvent

    studio, model = tiny_studio()
    zerogpu.install(studio.catalog)
    local = Engine(model, TinyTokenizer(96), topk_candidates=8)
    remote = zerogpu.RemoteEngine(local, "m", time_limit_s=None)
    events = list(remote.generate([3, 4, 5, 6, 7], DecodeConfig(max_new_tokens=40, template="2.2.2"),
                                  stop=lambda: True))
    assert len(events) == 1 and isinstance(events[0], StepEvent)  # nothing decoded after the stop is shown
    assert spaces.calls[0]["sent"] == ["StepEvent", "SummaryEvent", "bytes"]  # the worker stopped after its step
    flag = spaces.calls[0]["kwargs"]["stop_file"]
    assert not __import__("os").path.exists(flag)  # the flag file is cleaned up
    assert local.matrix.rows_filled > 0  # the worker summed up and its matrix came back
    worker = zerogpu._ENGINES[("m", 8)]
    assert worker is not local and worker.clock == local.clock


def test_the_gpu_worker_forgets_one_sessions_matrix_before_the_next(spaces):
    from conftest import TinyTokenizer
    from tr_core.config import DecodeConfig
    from tr_core.engine import Engine

    studio, model = tiny_studio()
    zerogpu.install(studio.catalog)
    a, b = (Engine(model, TinyTokenizer(96), topk_candidates=8) for _ in range(2))
    cfg = DecodeConfig(max_new_tokens=12, template="hybrid")
    list(zerogpu.RemoteEngine(a, "m", None).generate([3, 4, 5, 6, 7, 3, 4, 5], cfg))
    worker = zerogpu._ENGINES[("m", 8)]
    seen_a = len(worker.hybrid.index)
    assert a.matrix.rows_filled > 0 and seen_a >= 8  # the worker's context index holds a's conversation
    list(zerogpu.RemoteEngine(b, "m", None).generate([9], cfg.with_(max_new_tokens=1)))
    assert len(worker.hybrid.index) < seen_a  # b's call starts from b's own prompt: nothing of a's text
    assert b.matrix.rows_filled < a.matrix.rows_filled


def test_what_an_engine_learned_crosses_the_boundary_whole_as_bytes():
    import torch
    from conftest import TinyTokenizer, tiny_model
    from tr_core.config import DecodeConfig
    from tr_core.engine import Engine

    model = tiny_model("llama")
    taught, fresh = (Engine(model, TinyTokenizer(96), topk_candidates=8) for _ in range(2))
    list(taught.generate([3, 4, 5, 6, 7, 3, 4, 5], DecodeConfig(max_new_tokens=16, template="adaptive")))
    data = zerogpu.pack_state(taught)
    assert isinstance(data, bytes)
    zerogpu.unpack_state(fresh, data, costs=True)
    for name in taught.matrix.TENSORS:
        assert torch.equal(getattr(fresh.matrix, name), getattr(taught.matrix, name)), name
    assert fresh.clock == taught.clock and fresh.clock.answer_starts
    for a, b in zip(taught.learned().values(), fresh.learned().values()):  # calibration and trust, every drafter
        assert torch.equal(a["hits"], b["hits"]) and torch.equal(a["trials"], b["trials"]) and a["trust"] == b["trust"]
    assert fresh.adaptive.cost.measured and fresh.adaptive.cost(4) == taught.adaptive.cost(4)
    assert len(fresh.hybrid.index) == 0  # the context index (a conversation) never crosses


def test_on_zerogpu_answers_take_no_process_wide_slot(spaces, monkeypatch):
    """Each visitor's answer and measurement is a GPU call of its own: they run side by side, so an answer goes on
    while something else holds the CPU's decode slot."""
    import threading

    from studio.session import DECODE_SLOT

    monkeypatch.setattr(h, "warm_up", lambda engine, name, learn, progress=None: h.WarmStart(None, "cold"))
    studio, _ = tiny_studio()
    assert zerogpu.install(studio.catalog)
    session = Session(model="m", k=8)
    settings = h.parse_settings(studio, dict(max_new_tokens=8, template="2.2.2", compare=False), [])
    list(h.respond(studio, session, "set up", settings, []))  # the engine is made (that takes the slot once)
    done = threading.Event()
    with DECODE_SLOT:
        worker = threading.Thread(target=lambda: (list(h.respond(studio, session, "hello", settings, [])),
                                                  done.set()))
        worker.start()
        assert done.wait(timeout=60)
    worker.join()
    assert [c["name"] for c in spaces.calls] == ["gpu_decode", "gpu_decode"]
