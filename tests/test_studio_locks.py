"""The studio's locks and its one decode slot (issue 41 item 6), and the warm start of a session's matrix.

Matrix reset, load and save hold the session lock (save writes a copy taken under it); slow motion's pauses
and a measurement its visitor stopped pulling leave the decode slot to other tabs; preload and engine set-up
take the slot. Threads are synchronised with events; a wait with a timeout only bounds a test that would hang.
"""
from __future__ import annotations

import threading

import pytest

from studio import handlers as h
from studio.session import DECODE_SLOT, PausingEngine, Session
from test_app import FakeEngine, merged, studio_for


def in_thread(fn, *args):
    """Run fn(*args) in a thread; return (thread, an event set when it returned, its result holder)."""
    done, out = threading.Event(), {}

    def body():
        out["value"] = fn(*args)
        done.set()

    worker = threading.Thread(target=body, daemon=True)
    worker.start()
    return worker, done, out


def tiny_session(k: int = 8):
    """A session with a real engine on a tiny random llama (a real AdjacencyMatrix to save, load and reset)."""
    from conftest import TinyTokenizer, tiny_model
    from tr_core.engine import Engine

    return Session(engine=Engine(tiny_model("llama"), TinyTokenizer(96), topk_candidates=k), k=k, model="m")


@pytest.mark.parametrize("handler", ["reset", "empty", "save", "load"])
def test_matrix_reset_empty_save_and_load_wait_for_the_session_lock(handler, tmp_path):
    session = tiny_session()
    studio = studio_for()
    path = tmp_path / "m.pt"
    session.engine.matrix.save(path)
    call = {"reset": lambda: h.reset_matrix(session), "empty": lambda: h.empty_matrix(session),
            "save": lambda: h.save_matrix(session),
            "load": lambda: h.load_matrix(studio, session, str(path), 8)}[handler]
    with session.lock:  # as an answer starting (or a New chat) holds it
        worker, done, out = in_thread(call)
        assert not done.wait(0.3), f"{handler} changed or read the matrix without the session lock"
    assert done.wait(30) and not out["value"]["status"].startswith("✗")
    session.close()


def test_save_writes_a_copy_taken_under_the_lock_and_is_refused_while_an_answer_runs(monkeypatch):
    from tr_core.matrix import AdjacencyMatrix

    session = tiny_session()
    live = session.engine.matrix
    written = []
    real_save = AdjacencyMatrix.save

    def save(self, path):
        written.append((self is not live, session.lock.locked()))
        real_save(self, path)

    monkeypatch.setattr(AdjacencyMatrix, "save", save)
    view = h.save_matrix(session)
    assert written == [(True, False)]  # a copy, written with the lock released
    assert view["status"].startswith("Matrix saved")
    session.answer_stop = threading.Event()  # an answer runs: its engine thread writes rows without the lock
    assert h.save_matrix(session)["status"] == f"✗ {h.BUSY}" and len(written) == 1
    session.answer_stop = None
    session.close()


def test_slow_motion_pauses_leave_the_decode_slot_to_other_tabs_and_take_it_back():
    studio = studio_for()
    engine = FakeEngine(steps=3)
    session = Session(engine=engine, k=8)
    shown = threading.Event()
    views: list[dict] = []

    def answer():
        for view in h.respond(studio, session, "slowly", h.parse_settings(
                studio, dict(max_new_tokens=10, template="2.2.2", compare=False, delay=0.5), []), []):
            views.append(view)
            if "tree" in view:
                shown.set()

    def steps_shown() -> int:  # live step views (the final view draws a tree too)
        return sum(v.get("status", "").startswith("Step ") for v in list(views))

    worker = threading.Thread(target=answer, daemon=True)
    worker.start()
    assert shown.wait(30)  # the first step is on the page: its pause (0.5 s) has begun
    assert DECODE_SLOT.acquire(timeout=0.4), "slow motion held the decode slot through its pause"
    try:  # while another tab decodes, the slowed answer waits for the slot before its next step
        before = steps_shown()
        worker.join(1.0)  # two pauses' time: a step decoded without the slot would show by now
        assert steps_shown() == before and worker.is_alive()
    finally:
        DECODE_SLOT.release()
    worker.join(30)
    assert not worker.is_alive() and steps_shown() == 3 and not DECODE_SLOT.locked()


def test_pausing_engine_releases_the_slot_only_at_steps_and_stops_while_waiting_for_it():
    from tr_core.events import StepEvent

    engine = FakeEngine(steps=3)
    cfg = h.DecodeConfig(max_new_tokens=10, template="2.2.2")
    run_ = PausingEngine(engine, pause=True).generate([1, 2], cfg, stop=lambda: False)
    first = next(run_)
    assert isinstance(first, StepEvent) and not DECODE_SLOT.locked()  # handed on without the slot
    stop = threading.Event()
    run_ = PausingEngine(engine, pause=True).generate([1, 2], cfg, stop=stop.is_set)
    next(run_)
    with DECODE_SLOT:  # another tab decodes; this one is stopped while it waits for the slot
        stop.set()
        rest = list(run_)
    assert [type(e).__name__ for e in rest] == ["SummaryEvent"] and rest[0].stop_reason == "stopped"
    plain = PausingEngine(engine, pause=False).generate([1, 2], cfg, stop=lambda: False)
    next(plain)
    assert DECODE_SLOT.locked()  # without slow motion the slot is held from the first forward to the summary
    plain.close()
    assert not DECODE_SLOT.locked()


def test_a_measurement_whose_visitor_stopped_pulling_holds_no_slot_and_a_closed_session_ends_it():
    studio = studio_for(measure_max_s=30.0)
    session = Session(engine=FakeEngine(steps=40, step_s=0.005), k=8)
    settings = h.parse_settings(studio, dict(max_new_tokens=80, template="2.2.2", compare=True), [])
    views = h.respond(studio, session, "measure me", settings, [])
    for view in views:
        if "Measuring the speedup" in view.get("status", "") and "meter" in view and "chat" not in view:
            break  # a live measurement view: the visitor's page stops asking for more here
    else:
        pytest.fail("the measurement never showed")
    assert DECODE_SLOT.acquire(timeout=1.0), "the measurement held the slot while its visitor was away"
    try:
        session.close()  # the tab is gone while another decode holds the slot
        rest = list(views)  # the measurement gives up waiting for the slot instead of hanging
    finally:
        DECODE_SLOT.release()
    assert "stopped" in merged(rest)["meter"] and not session.answering


def test_engine_set_up_and_preload_hold_the_decode_slot(monkeypatch):
    import app
    from conftest import TinyTokenizer, tiny_model
    from tr_core.engine import Engine

    seen: list[tuple[str, bool]] = []
    real_init, real_generate = Engine.__init__, Engine.generate

    def init(self, *args, **kwargs):
        seen.append(("build", DECODE_SLOT.locked()))
        real_init(self, *args, **kwargs)

    def generate(self, *args, **kwargs):
        seen.append(("decode", DECODE_SLOT.locked()))
        yield from real_generate(self, *args, **kwargs)

    def warm_up(engine, name, learn, progress=None):
        seen.append(("warm", DECODE_SLOT.locked()))
        return h.WarmStart(None, "Cold start: test")

    monkeypatch.setattr(Engine, "__init__", init)
    monkeypatch.setattr(Engine, "generate", generate)
    monkeypatch.setattr(h, "warm_up", warm_up)
    model = tiny_model("llama")
    studio = studio_for()
    studio.catalog._loader = lambda name: (model, TinyTokenizer(96))
    studio.default_template = "hybrid"
    app.preload(studio)
    assert seen and all(held for _, held in seen), seen
    assert [what for what, _ in seen] == ["build", "warm", "decode", "decode"]
    seen.clear()
    assert "Loaded" in h.load_model(studio, Session(model="embedded"), "embedded")["status"]
    assert seen == [("build", True), ("warm", True)]


def test_a_new_engine_starts_warm_reset_returns_there_and_empty_empties(monkeypatch):
    from conftest import TinyTokenizer, tiny_model

    model = tiny_model("llama")
    go = threading.Event()

    def warm_up(engine, name, learn, progress=None):
        tell = progress or (lambda done, total: None)  # paper mode's engine is made with no page to tell
        tell(1, 2)
        assert go.wait(10), "the page never showed the warm start's progress"
        tell(2, 2)
        engine.matrix.table[5, 0], engine.matrix.filled[5] = 6, True  # a learned row, as tr_core.warm writes
        return h.WarmStart(engine.snapshot(), "Warm start: test rows")

    monkeypatch.setattr(h, "warm_up", warm_up)
    studio = studio_for()
    studio.catalog._loader = lambda name: (model, TinyTokenizer(96))
    session = Session(model="m", k=8)
    views = []
    settings = h.parse_settings(studio, dict(max_new_tokens=6, template="2.2.2", compare=False, k=8), [])
    for view in h.respond(studio, session, "hello", settings, []):
        views.append(view)
        if view.get("status", "").startswith("Learning from answers"):
            go.set()
    assert any(v.get("status") == h.WARMING.format(1, 2) for v in views)
    assert merged(views)["warm"] == "Warm start: test rows" == session.warm_note
    learned = session.engine.matrix.rows_filled
    assert learned > 1  # the answer taught it more rows
    view = h.reset_matrix(session)
    assert "learned beforehand" in view["status"] and session.engine.matrix.rows_filled == 1
    assert int(session.engine.matrix.table[5, 0]) == 6
    view = h.empty_matrix(session)
    assert "emptied" in view["status"] and session.engine.matrix.rows_filled == 0
    session.close()
    fresh = Session(model="m", k=8)  # paper mode in a tab that has not asked yet: its warm-started matrix, emptied
    view = h.paper_mode(studio, fresh, 8)
    assert view["drafting"] == view["template"] == "2.2.2" and view["status"].startswith("✓ Paper mode")
    assert fresh.engine is not None and fresh.engine.matrix.rows_filled == 0
    assert "0 / 96 rows filled" in view["matrix"]
    with fresh.lock:  # refused while an answer runs, the matrix kept
        fresh.answer_stop = threading.Event()
    refused = h.paper_mode(studio, fresh, 8)
    assert refused["status"].startswith("✗") and "drafting" not in refused
    fresh.close()
    broken = Session(model="gone", k=8)  # a model that cannot load: said, the tab goes on
    studio.catalog._loader = lambda name: (_ for _ in ()).throw(OSError("no such model"))
    assert h.paper_mode(studio, broken, 8)["status"].startswith("✗") and broken.engine is None


def test_an_answer_waiting_for_the_preload_shows_what_it_does():
    studio = studio_for()
    studio.warm.clear()  # the preload is learning the default model's warm start
    studio.preparing = h.WARMING.format(3, 48)
    session = Session(engine=FakeEngine(), k=8)
    views = h.respond(studio, session, "hello", h.parse_settings(studio, dict(template="2.2.2", compare=False), []),
                      [])
    next(views)  # the pending chat
    assert next(views) == {"status": h.WARMING.format(3, 48)}
    studio.warm.set()
    assert merged(list(views))["chat"][-1]["role"] == "assistant"


def test_an_answer_stopped_while_the_model_is_busy_says_so_without_blaming_another_tab():
    from conftest import TinyTokenizer, tiny_model

    studio = studio_for()
    studio.catalog._loader = lambda name: (tiny_model("llama"), TinyTokenizer(96))
    session = Session(model="embedded")  # no engine yet: building one needs the decode slot
    settings = h.parse_settings(studio, dict(template="2.2.2", compare=False), [])
    assert DECODE_SLOT.acquire(timeout=5)  # held (the app's start-up, or any answer or measurement)
    try:
        views = h.respond(studio, session, "hello", settings, [])
        next(views)  # the pending chat
        worker, done, out = in_thread(lambda: merged(list(views)))
        session.answer_stop.set()  # what New chat and Stop do
        assert done.wait(30)
    finally:
        DECODE_SLOT.release()
    assert out["value"]["status"] == h.SLOT_ABANDONED
    assert "another tab" not in h.SLOT_ABANDONED and "nothing was changed" in h.SLOT_ABANDONED
    assert session.engine is None and session.history == []


def test_later_sessions_fork_the_models_warm_engine_without_the_slot(monkeypatch):
    from conftest import TinyTokenizer, tiny_model

    calls = []

    def warm_up(engine, name, learn, progress=None):
        calls.append((engine.matrix.k, DECODE_SLOT.locked()))
        engine.matrix.table[5, 0], engine.matrix.filled[5] = 6, True  # a learned row, as tr_core.warm writes
        return h.WarmStart(engine.snapshot(), "Warm start: test rows", reusable=True)

    monkeypatch.setattr(h, "warm_up", warm_up)
    monkeypatch.setattr(h, "_TEMPLATES", {})
    models = [tiny_model("llama")]
    studio = studio_for()
    studio.catalog._loader = lambda name: (models[-1], TinyTokenizer(96))
    first = h.new_engine(studio, "m", 8)
    with DECODE_SLOT:  # another visitor's batch step: a fork does not wait for it (nor give up: should_stop)
        second = h.new_engine(studio, "m", 8, should_stop=lambda: True)
    assert calls == [(8, True)]
    assert second is not first and second.model is first.model and int(second.matrix.table[5, 0]) == 6
    second.matrix.table[5, 0] = 7  # each session learns on its own matrix
    assert int(first.matrix.table[5, 0]) == 6 and int(h.new_engine(studio, "m", 8).matrix.table[5, 0]) == 6
    session = Session(model="m", k=8)
    h.adopt_engine(session, second, [], "")
    assert session.warm_note == "Warm start: test rows" and session.warm_state is not None
    h.new_engine(studio, "m", 4)  # another k: a matrix of another width, warm-started anew
    assert calls == [(8, True), (4, True)]
    models.append(tiny_model("llama"))  # the model was loaded again (evicted meanwhile): its old copy is not used
    studio.catalog._loaded.clear()
    third = h.new_engine(studio, "m", 8)
    assert third.model is models[-1] and calls[-1] == (8, True) and len(calls) == 3


def test_a_partial_warm_start_is_not_forked_for_later_sessions(monkeypatch):
    from conftest import TinyTokenizer, tiny_model

    calls = []
    monkeypatch.setattr(h, "warm_up", lambda engine, name, learn, progress=None: calls.append(name) or h.WarmStart(
        engine.snapshot(), "Warm start: partial", reusable=False))
    monkeypatch.setattr(h, "_TEMPLATES", {})
    model = tiny_model("llama")
    studio = studio_for()
    studio.catalog._loader = lambda name: (model, TinyTokenizer(96))
    h.new_engine(studio, "m", 8)
    h.new_engine(studio, "m", 8)
    assert len(calls) == 2  # each later session loads the warm start again (the full one, once it is cached)
