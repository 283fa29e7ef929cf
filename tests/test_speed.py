"""The honest meter (studio.meter) and the decode's ownership by its consumer
(tr_core.trace.record_live)."""
from __future__ import annotations

import dataclasses
import html
import random
import threading
import time

import torch

from conftest import TinyTokenizer, tiny_model, unglossed
from tr_core.config import DecodeConfig
from tr_core.engine import Engine
from tr_core.events import StepEvent
from studio.meter import ChunkPair, estimate, interleave, measure_interleaved, plausible_limit
from studio.recording import record_live
from tr_core.trace import Trace


class Clock:
    """A simulated machine: every step costs its base time x the load at that moment (load changes over time)."""

    def __init__(self, load_at):
        self.now_ms = 0.0
        self.load_at = load_at

    def cost(self, base_ms: float) -> float:
        ms = base_ms * self.load_at(self.now_ms)
        self.now_ms += ms
        return ms


def fake_run(clock: Clock, tokens: int, per_step: int, base_ms: float, jitter: float = 0.0, seed: int = 0):
    """Step events of a run emitting `per_step` tokens per step, each step timed on the simulated clock."""
    rng = random.Random(seed)
    done = 0
    while done < tokens:
        n = min(per_step, tokens - done)
        ms = clock.cost(base_ms * (1 + rng.uniform(-jitter, jitter)))
        yield StepEvent(step=0, position=0, tokens=[1], parents=[-1], depths=[0], ranks=[-1], accepted=[0],
                        emitted=[5] * n, bonus=5, timings={"total": ms})
        done += n


def sequential_ratio(load_at) -> float:
    """What the old meter did: all of Token Recycling, then all of plain decoding."""
    clock = Clock(load_at)
    tr = sum(e.timings["total"] for e in fake_run(clock, 120, 2, 30.0))
    plain = sum(e.timings["total"] for e in fake_run(clock, 120, 1, 20.0))
    return plain / tr


def test_a_load_change_between_the_runs_cannot_fake_a_speedup():
    # true ratio: 2 tokens per 30 ms step against 1 token per 20 ms step = 1.33x; the machine gets 3x
    # busier after 1.8 s, i.e. during what the old meter timed as the plain run
    busy_later = lambda t: 1.0 if t < 1800 else 3.0  # noqa: E731
    assert sequential_ratio(busy_later) > 3.5  # the old figure: far above the 2 tokens per step allow
    clock = Clock(busy_later)
    est = measure_interleaved(fake_run(clock, 120, 2, 30.0), fake_run(clock, 120, 1, 20.0), chunk_ms=100.0)
    assert est.trusted and abs(est.ratio - 4 / 3) < 0.05 and est.error < 0.05
    assert est.ratio <= plausible_limit(est.mean_accepted) and est.mean_accepted == 2.0 and est.identical
    assert est.covered == 120 and est.left_out >= 1  # the pair the load change fell into was left out
    from studio.handlers import measure_note

    note = measure_note(est, 150)
    assert "first 120 of 150 tokens (time cap)" in note and "left out" in note
    left = est.left_out
    assert (f"{left} pairs left out: the load changed between their two turns" if left > 1 else
            "1 pair left out: the load changed between its two turns") in note
    assert "(s)" not in note
    assert "first 120 of 150 tokens (stopped)" in measure_note(est, 150, stopped=True)  # the visitor's Stop, not the cap
    assert measure_note(estimate([ChunkPair(10, 100.0, 5, 150.0)] * 4), 40) == ""


def bursty(period_ms: float, seed: int = 0):
    """A load that flips at random between 1x and 4x every `period_ms` (another program starting and stopping)."""
    rng, loads = random.Random(seed), {}
    return lambda t: loads.setdefault(int(t // period_ms), rng.choice([1.0, 4.0]))


def test_a_bursty_machine_is_called_too_noisy_and_an_impossible_ratio_too():
    clock = Clock(bursty(130.0))
    est = measure_interleaved(fake_run(clock, 120, 2, 30.0), fake_run(clock, 120, 1, 20.0), chunk_ms=100.0)
    assert not est.trusted and "busy" in est.reason and est.ratio is not None
    shown = []
    for period in (40.0, 70.0, 300.0, 1000.0):  # a trusted figure from a bursty machine lies near the truth (1.33x)
        for seed in range(10):
            clock = Clock(bursty(period, seed))
            est = measure_interleaved(fake_run(clock, 120, 2, 30.0, jitter=0.1, seed=seed),
                                      fake_run(clock, 120, 1, 20.0, jitter=0.1, seed=seed + 99), chunk_ms=100.0)
            if est.trusted:
                shown.append(est)
                assert abs(est.ratio - 4 / 3) <= 3 * est.error, est
    assert len(shown) >= 5  # long bursts leave enough steady pairs to measure
    # a ratio above what 1.05 accepted tokens per step allow is refused whatever its spread
    pairs = [ChunkPair(tokens=21, tr_ms=100.0, tr_steps=20, plain_ms=250.0) for _ in range(6)]
    est = estimate(pairs)
    assert not est.trusted and "faster than its accepted tokens per step allow" in est.reason and "2.5" not in est.reason and est.error == 0.0
    assert estimate(pairs[:2]).reason.startswith("the answer was too short")
    assert not estimate([]).trusted


def test_what_the_consumer_does_after_each_estimate_slows_both_methods_alike():
    # the page redraws the meter after each estimate, on the same CPU: for a moment the machine runs slower. If
    # Token Recycling always decoded first after an estimate, every one of its chunks would pay for the redraw
    # and a steady, confident figure would be wrong (0.67x against the true 1.33x here).
    for load, redraw_ms in ((3.0, 60.0), (2.0, 30.0), (1.5, 100.0)):
        busy_until = [0.0]
        clock = Clock(lambda t: load if t < busy_until[0] else 1.0)  # noqa: B023
        shown = None
        for shown in interleave(fake_run(clock, 240, 2, 30.0), fake_run(clock, 240, 1, 20.0), chunk_ms=100.0):
            busy_until[0] = clock.now_ms + redraw_ms
        assert shown is not None and shown.pairs >= 6
        assert not shown.trusted or abs(shown.ratio - 4 / 3) <= 3 * shown.error, (load, redraw_ms, shown)


def test_interleave_yields_progress_and_closes_both_runs_when_closed():
    clock = Clock(lambda t: 1.0)
    closed: list[str] = []

    def tracked(gen, name):
        try:
            yield from gen
        finally:
            closed.append(name)

    rounds = interleave(tracked(fake_run(clock, 400, 2, 30.0), "tr"), tracked(fake_run(clock, 400, 1, 20.0), "plain"),
                        chunk_ms=90.0)
    first, second = next(rounds), next(rounds)
    assert first.pairs == 1 and second.pairs == 2 and second.tokens > first.tokens
    rounds.close()
    assert sorted(closed) == ["plain", "tr"]


def test_a_noisy_short_answer_is_decoded_again_and_the_passes_pooled():
    """30-token answers on a machine whose every step varies by up to 30%: one pass often gives too few steady
    pairs to show a figure. With `again` the answer is decoded once more from the same start (up to 3 passes) and
    the pairs pooled: a figure is shown for nearly every answer, near the truth (1.33x), over the answer's 30
    tokens, and every pass's runs are closed."""
    opened: list[str] = []
    closed: list[str] = []

    def tracked(gen, name):
        opened.append(name)
        try:
            yield from gen
        finally:
            closed.append(name)

    single, pooled, shown_again = 0, 0, None
    for seed in range(20):
        clock, n = Clock(lambda t: 1.0), [0]

        def runs():
            n[0] += 1
            return (tracked(fake_run(clock, 30, 2, 30.0, jitter=0.3, seed=seed * 10 + n[0]), "tr"),  # noqa: B023
                    tracked(fake_run(clock, 30, 1, 20.0, jitter=0.3, seed=seed * 10 + n[0] + 500), "plain"))  # noqa: B023

        single += measure_interleaved(*runs(), chunk_ms=60.0).trusted
        n[0], opened[:], closed[:] = 0, [], []
        est = measure_interleaved(*runs(), chunk_ms=60.0, again=runs)
        assert sorted(opened) == sorted(closed) and len(opened) == 2 * est.passes == 2 * n[0]
        assert est.covered == 30 and est.identical
        if est.trusted:
            pooled += 1
            assert abs(est.ratio - 4 / 3) < 0.25, est
            if est.passes > 1:
                shown_again = est
                assert est.tokens > 30 and est.pairs > 4
    assert single <= 16 and pooled >= 19, (single, pooled)
    assert shown_again is not None
    from studio.handlers import measuring_status
    from studio.views import measured_meter
    assert f"(30 tokens), decoded {shown_again.passes} times" in measured_meter(shown_again, answer_tokens=30)
    assert measuring_status(shown_again, 30).startswith(f"Measuring the speedup again (pass {shown_again.passes}")


def test_passes_stop_at_the_limit_at_a_trusted_figure_and_when_stopped():
    clock = Clock(bursty(25.0, seed=3))
    count = [0]

    def runs():
        count[0] += 1
        return fake_run(clock, 30, 2, 30.0), fake_run(clock, 30, 1, 20.0)

    est = measure_interleaved(*runs(), chunk_ms=60.0, again=runs, max_passes=3)  # bursty throughout
    assert est.passes == 3 and count[0] == 3 and not est.trusted
    steady = Clock(lambda t: 1.0)
    calls = []
    est = measure_interleaved(fake_run(steady, 60, 2, 30.0), fake_run(steady, 60, 1, 20.0), chunk_ms=60.0,
                              again=lambda: calls.append(1) or (iter(()), iter(())))
    assert est.trusted and est.passes == 1 and not calls  # shown after one pass: never decoded again
    count[0] = 0
    est = measure_interleaved(*runs(), chunk_ms=60.0, again=runs, should_stop=lambda: True)
    assert est.passes == 1 and count[0] == 1  # the visitor's Stop: no further pass


def tiny_engine(arch: str = "llama") -> Engine:
    return Engine(tiny_model(arch), TinyTokenizer(96), topk_candidates=4)


def test_a_forked_engine_measures_from_the_answers_starting_state_without_touching_it():
    engine = tiny_engine()
    prompt = [3, 4, 5, 6, 7, 8, 9, 10]
    cfg = DecodeConfig(max_new_tokens=24, template="small-16")
    list(engine.generate(prompt, cfg))
    table, probs = engine.matrix.table.clone(), engine.matrix.probs.clone()
    twin = engine.fork()
    est = measure_interleaved(twin.generate(prompt, cfg), twin.generate(prompt, cfg.with_(plain=True)), chunk_ms=5.0)
    assert est.identical is True and est.tokens > 0
    assert torch.equal(engine.matrix.table, table) and torch.equal(engine.matrix.probs, probs)  # untouched
    assert twin.model is engine.model and twin.matrix is not engine.matrix


def test_a_twin_taken_before_the_first_answer_reads_its_probe_instead_of_timing_forwards_again(monkeypatch):
    from tr_core.tuning import ensure_tuned

    engine = tiny_engine()
    prompt = [3, 4, 5, 6, 7, 8, 9, 10]
    cfg = DecodeConfig(max_new_tokens=16, template="adaptive")
    assert engine.times_forwards_first(cfg.with_(template="small-16")), "an untuned model: its products are timed"
    ensure_tuned(engine.runner, prompt)  # the model's matrix products, once per model (tuning.py)
    twin = engine.fork()  # before the answer: no forward cost measured yet
    assert not engine.adaptive.cost.measured
    assert engine.times_forwards_first(cfg) and not engine.times_forwards_first(cfg.with_(template="small-16"))
    list(engine.generate(prompt, cfg))  # the answer probes the machine once
    assert engine.adaptive.cost.measured and twin.adaptive.cost.measured
    assert not engine.times_forwards_first(cfg) and not twin.times_forwards_first(cfg)

    def probe_again(*args, **kwargs):
        raise AssertionError("the twin timed the forwards again")

    monkeypatch.setattr(type(engine.adaptive.cost), "probe", probe_again)
    est = measure_interleaved(twin.generate(prompt, cfg), twin.generate(prompt, cfg.with_(plain=True)), chunk_ms=5.0)
    assert est.identical is True
    assert twin.adaptive is not engine.adaptive and twin.adaptive.trust is not engine.adaptive.trust
    # a twin taken once the curve is measured re-decodes with the curve the answer started from, its own copy: the
    # answer's steps (which refine the live curve) do not change the sizes the re-decode chooses
    later = engine.fork()
    assert later.adaptive.cost is not engine.adaptive.cost and later.adaptive.cost.ms == engine.adaptive.cost.ms
    list(engine.generate(prompt, cfg))
    assert later.adaptive.cost.ms != engine.adaptive.cost.ms


class SlowEngine:
    """A fake engine whose steps take `step_s`; counts live decodes and the steps it made."""

    def __init__(self, step_s: float = 0.02, steps: int = 10_000):
        self.step_s, self.steps, self.running, self.made = step_s, steps, 0, 0

    def decode(self, ids):
        return " ".join(map(str, ids))

    def generate(self, ids, cfg, stop=None):
        self.running += 1
        try:
            for i in range(self.steps):
                time.sleep(self.step_s)
                self.made += 1
                yield StepEvent(step=i, position=i, tokens=[1], parents=[-1], depths=[0], ranks=[-1], accepted=[0],
                                emitted=[5], bonus=5, timings={"total": self.step_s * 1e3})
                if stop is not None and stop():
                    return
        finally:
            self.running -= 1


def test_closing_record_live_stops_and_joins_the_engine_thread_and_frees_the_slot():
    engine, slot = SlowEngine(), threading.Lock()
    live = record_live(engine, [1], DecodeConfig(), Trace(), every_s=0.05, slot=slot)
    next(live)
    assert engine.running == 1 and slot.locked()
    made = engine.made
    live.close()
    # close() joined the engine thread, stopped after the step it was in: one left running would have gone on
    # through its 10,000 steps; counted in steps, not seconds, so a slow runner cannot fail it
    assert engine.running == 0 and not slot.locked() and engine.made - made <= 2
    assert not any(t.name == "tr-engine" and t.is_alive() for t in threading.enumerate())


def test_an_abandoned_consumer_stops_the_decode_and_a_time_limit_ends_the_answer():
    engine = SlowEngine()
    live = record_live(engine, [1], DecodeConfig(), Trace(), every_s=0.05, abandon_s=0.3)
    next(live)  # the consumer takes one batch, then never asks again (a request dropped without closing)
    deadline = time.monotonic() + 5
    while engine.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.running == 0
    trace = Trace()
    batches = list(record_live(SlowEngine(steps=10_000), [1], DecodeConfig(), trace, every_s=0.05, time_limit_s=0.3))
    # every step sleeps 20 ms, so at most 0.3 / 0.02 = 15 steps end before the limit, and one more after it
    assert batches and 0 < len(trace.steps) <= round(0.3 / 0.02) + 1


def test_a_decode_waits_for_the_slot_and_gives_up_when_stopped():
    slot = threading.Lock()
    slot.acquire()
    stop = threading.Event()
    engine = SlowEngine(steps=3)
    live = record_live(engine, [1], DecodeConfig(), Trace(), stop=stop, every_s=0.05, slot=slot)
    threading.Timer(0.3, stop.set).start()
    assert list(live) == [] and engine.running == 0  # never started: the slot was busy until it was stopped
    slot.release()


def test_a_single_pair_has_no_error_and_its_trace_still_loads(tmp_path):
    """One chunk pair has no spread: the error is unknown (None, not inf, which JSON cannot hold)."""
    import dataclasses

    from tr_core.trace import Trace

    est = estimate([ChunkPair(tokens=12, tr_ms=100.0, tr_steps=6, plain_ms=150.0)])
    assert est.error is None and not est.trusted and "too short" in est.reason
    trace = Trace(model="tiny", speed=dataclasses.asdict(est))
    back = Trace.load(trace.save(tmp_path / "t.json"))
    assert back.speed["error"] is None and back.speed["reason"] == est.reason


def test_a_pooled_measurement_is_saved_in_the_trace_and_a_bad_pass_count_refused(tmp_path):
    import dataclasses
    import json

    import pytest

    from tr_core.trace import Trace, TraceError

    pairs = [ChunkPair(tokens=6, tr_ms=60.0, tr_steps=3, plain_ms=80.0 + i) for i in range(8)]
    est = dataclasses.replace(estimate(pairs, identical=True), covered=24, passes=2)
    path = Trace(model="tiny", speed=dataclasses.asdict(est)).save(tmp_path / "t.json")
    assert Trace.load(path).speed["passes"] == 2
    data = json.loads(path.read_text())
    del data["speed"]["passes"]  # a trace saved before passes existed
    assert Trace.from_dict(data).speed.get("passes") is None
    for bad in (-1, "2", 2.5):
        data["speed"]["passes"] = bad
        with pytest.raises(TraceError, match="passes"):
            Trace.from_dict(data)


# ------------------------------------------------------------------ one speed story (studio.views, hand-built traces)
# The meter's interleaved measurement is the page's only measured speedup: the cost panel and the race derive from it
# or say why they cannot; an unsteady cost curve is not shown; "too noisy" leaves nothing else implying a speedup.

def story_step(step: int, n: int, gained: int, ms: float = 20.0) -> StepEvent:
    """A chain of n tokens (the root and n - 1 drafts), of which gained - 1 were accepted, then the bonus."""
    acc = list(range(gained))
    return StepEvent(step=step, position=step, tokens=list(range(n)), parents=list(range(-1, n - 1)),
                     depths=list(range(n)), ranks=[-1] + [0] * (n - 1), accepted=acc[: max(gained - 1, 1)],
                     emitted=list(range(1, gained + 1)), bonus=gained, timings={"total": ms})


def story_trace(speed: dict | None) -> Trace:
    """Two steps: 4 tokens verified gaining 3, then 8 verified gaining 2; `speed`: the recorded meter figure."""
    trace = Trace(model="tiny", settings={"template": "adaptive", "temperature": 0.0},
                  messages=[{"role": "user", "content": "hi"}], steps=[story_step(0, 4, 3), story_step(1, 8, 2)],
                  token_texts={t: f" w{t}" for t in range(10)}, step_texts=[" a b c", " d e"], speed=speed)
    return trace


def trusted(ratio: float = 1.5, error: float = 0.05) -> dict:
    from dataclasses import asdict

    from studio.meter import SpeedEstimate

    return asdict(SpeedEstimate(ratio=ratio, error=error, tr_tps=30.0, plain_tps=20.0, mean_accepted=2.5, tokens=5,
                                pairs=4, trusted=True, identical=True, covered=5))


def noisy() -> dict:
    return dict(trusted(), trusted=False, reason="the timings varied by ±30% between chunks: the machine was busy")




def linear_curve(**over):
    from studio.views import CostCurve

    return CostCurve(lambda n: 1 + (n - 1) / 4, source="the adaptive tree on this machine", **over)


def speed_claims(text: str) -> list[str]:
    """Every 'N.NN×' figure in a text (what a reader would take as a speedup or a cost)."""
    import re

    return re.findall(r"\d+\.\d\d×", text)


def test_a_steady_curve_gives_labelled_estimates_and_the_formula_with_this_answers_numbers():
    from studio.views import cost_html, step_views

    trace = story_trace(trusted())
    shown = cost_html(trace.steps[0], linear_curve(), trace)
    # step 1: 4 tokens cost 1.75x a one-token forward; it gained 3 -> 1.71x, labelled an estimate for this step alone
    assert "costs 1.75× a one-token forward" in shown and "3 ÷ 1.75 = 1.71× plain speed" in shown
    assert "An estimate for this step alone" in shown and "this step alone ≈ 3 ÷ 1.75 = 1.71× plain speed (estimate)" in shown
    # the formula over the whole answer: 2.50 tokens per step ÷ mean cost (1.75 + 2.75) / 2 = 2.25 -> 1.11x
    assert "2.50 ÷ 2.25 ≈ 1.11× expected (estimate" in shown and "Measured by the meter: 1.50× ± 0.05" in shown
    # 1.11x against 1.50x +- 0.05: more than the meter's error apart, and the page says which to trust
    assert "The two disagree" in shown and "the meter&#x27;s 1.50× is the figure to trust" in shown
    from studio.views import _disagreement
    assert _disagreement(1.45, {"ratio": 1.50, "error": 0.05}) == ""  # within 3 standard errors and 10%
    assert step_views(trace, 0, linear_curve())["cost"] == shown


def test_too_noisy_leaves_no_figure_on_the_page_implying_a_speedup():
    from studio.views import cost_html, measured_meter, race_html
    from studio.meter import SpeedEstimate

    trace = story_trace(noisy())
    meter = measured_meter(SpeedEstimate(**trace.speed))
    assert "too noisy to measure" in meter and 'data-state="noisy"' in meter
    assert speed_claims(meter) == [] and 'id="tr-plain">—<' in meter  # no plain tok/s beside TR's: no implied ratio
    for ev in trace.steps:
        cost = cost_html(ev, linear_curve(), trace)
        assert speed_claims(cost) == [] and "plain speed" not in cost, cost
        assert "too noisy" in cost
    race = race_html(trace)
    assert "data-timeline" not in race and "could not measure the speedup" in race
    # the same trace measured trustworthily does show them (the rules above are not vacuous)
    trace.speed = trusted()
    assert speed_claims(cost_html(trace.steps[0], linear_curve(), trace)) and "data-timeline" in race_html(trace)


def test_a_curve_timed_on_a_busy_machine_is_flagged_not_shown():
    from studio.views import cost_html

    trace = story_trace(trusted())
    shown = cost_html(trace.steps[1], linear_curve(steady=False, note="repeats spread ±40%"), trace)
    assert "measured while the machine was busy (repeats spread ±40%): not shown" in shown
    assert "timed on a busy machine: not shown" in shown  # the presentation view's brief
    assert "plain speed" not in shown and "expected" not in shown
    assert speed_claims(shown) == ["1.50×"] or speed_claims(shown) == []  # at most the meter's own figure


def test_a_step_never_reads_faster_than_the_tokens_it_gained():
    from studio.views import CostCurve, cost_text

    cheap = CostCurve(lambda n: 0.6, source="a noisy probe")  # a forward cheaper than a one-token forward: noise
    text, _ = cost_text(story_step(0, 16, 3), cheap, trusted())
    assert "costs 1.00× a one-token forward" in text and "3 ÷ 1.00 = 3.00× plain speed" in text


def test_a_step_without_a_draft_says_why_in_plain_words():
    from studio.views import cost_text

    ev = story_step(0, 1, 1)
    ev.no_draft = {"why": "cost", "drafts": 2, "gain": 0.31, "cost_ratio": 1.62, "context": False}
    text, cls = cost_text(ev, linear_curve(), trusted())
    assert text.startswith("This step drafted nothing: no draft: the best tree (2 tokens) would add 0.31") and cls == "par"


def test_the_decoding_mode_is_said_greedy_or_sampling_with_its_settings():
    from studio.views import decoding_html, decoding_text

    assert decoding_text({"temperature": 0.0}).startswith("Greedy decoding")
    text = decoding_text({"temperature": 0.7, "top_p": 0.9, "seed": 3})
    assert text == "Sampling: temperature 0.7, top-p 0.9, seed 3"
    assert "&lt;b&gt;" in decoding_html({"temperature": 1.0, "seed": "<b>"})  # from a file: escaped


def test_the_meter_says_the_whole_answer_only_when_both_methods_decoded_all_of_it():
    """A figure over kept chunk pairs names its tokens; one cut by the time cap says "this answer", not "the whole
    answer" (a cold reader read "the whole answer, over 28 tokens" beside a step that alone gained 13 of 42)."""
    import dataclasses

    from studio.views import measured_meter, measured_span

    pairs = [ChunkPair(tokens=7, tr_ms=50.0 + i, tr_steps=4, plain_ms=70.0 + i) for i in range(5)]
    est = dataclasses.replace(estimate(pairs, identical=True), covered=42, tokens=28, pairs=4, left_out=1)
    assert measured_span(est, 42) == "the whole answer (42 tokens), the figure over the 28 kept"
    assert measured_span(est, 96) == "this answer"  # the time cap cut it: the measure note gives the numbers
    assert measured_span(dataclasses.replace(est, tokens=42, pairs=5, left_out=0), 42) == "the whole answer (42 tokens)"
    assert measured_span(est, None) == "this answer"
    meter = measured_meter(est, answer_tokens=42)
    # 5 pairs timed, 1 left out (a cold reader asked whether "timed in 4 pairs" counted the one "left out")
    assert "the figure over the 28 kept, both methods timed in 5 short turns each, 4 of them kept" in meter


def test_a_replayed_trace_measured_over_part_of_its_answer_says_so():
    from tr_core.events import SummaryEvent
    from studio.views import trace_meter

    trace = story_trace(trusted())  # the measurement covered 5 tokens
    trace.summary = SummaryEvent(tokens=list(range(12)), prompt_tokens=3, new_tokens=12, steps=2, mean_accepted=2.5,
                                 tokens_per_s=30.0, prefill_s=0.1, decode_s=0.4, wall_s=0.5, stop_reason="length",
                                 method="recycling", template="adaptive", matrix_rows_filled=5, matrix_mb=0.1)
    meter = trace_meter(trace, loaded=True)
    assert "this answer, both methods timed in 4 short turns each" in meter and "whole answer" not in meter
    assert "recorded with the trace; measured over the first 5 of 12 tokens" in meter
    trace.summary = dataclasses.replace(trace.summary, new_tokens=5, tokens=list(range(5)))
    assert "the whole answer (5 tokens)" in trace_meter(trace) and "left out" not in trace_meter(trace)
    trace.speed = dict(trace.speed, left_out=1)  # the live note's pairs left out, said again on replay
    assert "1 pair left out: the load changed between its two turns" in trace_meter(trace)


def sized_run(clock: Clock, tokens: int, sizes=(1, 4, 8), gains=(1, 2, 3)):
    """Token Recycling steps of cycling sizes (tokens in the forward) and gains, each costing 20 + 5 x size ms."""
    done, i = 0, 0
    while done < tokens:
        n, gained = sizes[i % len(sizes)], min(gains[i % len(gains)], tokens - done)
        ms = clock.cost(20.0 + 5.0 * n)
        yield StepEvent(step=i, position=done, tokens=list(range(n)), parents=list(range(-1, n - 1)),
                        depths=list(range(n)), ranks=[-1] + [0] * (n - 1), accepted=[0], emitted=[5] * gained,
                        bonus=5, timings={"total": ms})
        done, i = done + gained, i + 1


def test_the_meter_records_what_each_size_of_step_cost_and_the_formula_with_it_gives_its_figure():
    """One speed story: the cost panel's step costs are the meter's own timings (Token Recycling's steps of each size
    against plain decoding's steps, the same chunk pairs), so the formula over the meter's steps gives exactly the
    meter's ratio, with or without this machine's cost curve to shape the sizes between."""
    from studio.views import expected_speedup, meter_curve

    clock = Clock(lambda t: 1.0)
    est = measure_interleaved(sized_run(clock, 120), fake_run(clock, 120, 1, 20.0), chunk_ms=100.0)
    assert est.trusted
    sizes = {n: (ms, k) for n, ms, k in est.step_ms}
    assert set(sizes) == {1, 4, 8} and all(abs(ms - (20 + 5 * n)) < 1e-9 for n, (ms, _) in sizes.items())
    assert sum(k for _, k in sizes.values()) == sum(1 for _ in sized_run(Clock(lambda t: 1.0), 120))
    speed = dataclasses.asdict(est)
    steps = list(sized_run(Clock(lambda t: 1.0), 120))  # the answer: the same steps the meter re-decoded
    for shape in (None, lambda n: 30.0 + 3.0 * n):  # the meter's sizes alone, or spread by a (differently shaped) curve
        curve = meter_curve(speed, shape)
        assert curve.metered and "plain decoding step" in curve.unit and "the meter" in curve.source
        a, c, e = expected_speedup(steps, curve)
        assert abs(e - est.ratio) < 1e-9, (shape, e, est.ratio)
    assert abs(meter_curve(speed).cost(4) - 40.0 / 20.0) < 1e-9  # a 4-token step: 40 ms against a 20 ms plain step
    # no figure from a measurement that cannot be shown, or from an older record without the sizes
    assert meter_curve(dict(speed, trusted=False)) is None and meter_curve(dict(speed, step_ms=())) is None
    assert meter_curve(None) is None


def test_the_cost_panel_uses_the_meters_timings_once_it_measured_even_for_a_loaded_trace():
    import json

    from studio.handlers import cost_curve
    from studio.session import Session
    from studio.views import cost_html

    # the meter's re-decode: steps of 4 and 8 tokens, 36 and 64 ms, 5 tokens; plain decoding 20 ms a token -> 1.00x
    trace = story_trace(dict(trusted(ratio=1.0, error=0.02), mean_accepted=2.5, plain_tps=50.0,
                             step_ms=((4, 36.0, 1), (8, 64.0, 1))))
    loaded = story_trace(json.loads(json.dumps(trace.speed)))  # as read from a file: the triples come back as lists
    for t in (trace, loaded):
        curve = cost_curve(Session(), t)  # no engine in this tab: the trace's own measurement
        assert curve.metered and abs(curve.cost(4) - 36.0 / 20.0) < 1e-9 and abs(curve.cost(8) - 64.0 / 20.0) < 1e-9
        shown = unglossed(cost_html(t.steps[0], curve, t))
        assert "a step of that size cost 1.80× a plain decoding step, as the meter timed this answer" in shown
        assert "3 ÷ 1.80 = 1.67× plain speed" in shown and "(timed by the meter)" in shown
        # the answer's steps: 2.50 tokens per step ÷ (1.80 + 3.20) / 2 = 2.50 -> 1.00x, the meter's figure
        assert "This answer: 2.50 ÷ 2.50 = 1.00× ± 0.02, the meter&#x27;s figure (t timed by the meter" in shown
        # the steps' sizes, so that one large step's cost beside the mean cost is no puzzle
        assert ("Its 2 steps verified 6.0 tokens each on average, from 4 to 8: the divisor in the formula is their mean "
                "t(N)/t(1), so one step&#x27;s own cost can be far from it.") \
            in shown
        assert "re-decod" not in shown and "drafted nothing" not in shown  # no step of 1 token here
    # had the meter's re-decode taken other steps (3 tokens each at 1.5 plain steps: 2.00x), the page shows both
    other = story_trace(dict(trace.speed, ratio=2.0, mean_accepted=3.0, step_ms=((4, 30.0, 1), (8, 30.0, 1))))
    shown = cost_html(other.steps[0], cost_curve(Session(), other), other)
    assert "Measured by the meter, re-decoding this answer: 3.00 ÷ 1.50 = 2.00× ± 0.02" in shown
    assert "The answer&#x27;s own steps with the same timings: 2.50 ÷ 1.50 ≈ 1.67×" in shown
    assert "trees were not all the answer&#x27;s" in shown
    cut = story_trace(dict(other.speed, covered=3))  # the time cap ended the re-decode after 3 of 5 tokens
    assert "time cap ended its re-decode after 3 of 5 tokens" in cost_html(cut.steps[0], cost_curve(Session(), cut), cut)
    assert cost_curve(Session(), story_trace(trusted())).relative is None  # an older record: no sizes, no engine


def test_a_speed_record_with_bad_step_sizes_is_refused(tmp_path):
    import json

    import pytest

    from tr_core.trace import TraceError

    path = Trace(model="tiny", speed=dict(trusted(), step_ms=((4, 36.0, 1),))).save(tmp_path / "t.json")
    assert Trace.load(path).speed["step_ms"] == [[4, 36.0, 1]]
    data = json.loads(path.read_text())
    for bad in ([[0, 36.0, 1]], [[4, -1.0, 1]], [[4, 36.0, 0]], [[4, 36.0]], "x", [[4, True, 1]], [[4.5, 1.0, 1]]):
        data["speed"]["step_ms"] = bad
        with pytest.raises(TraceError, match="step_ms"):
            Trace.from_dict(data)


def test_a_chunk_of_large_trees_is_not_taken_for_a_disturbed_one():
    """On a steady machine every chunk pair is kept and the figure is plain time over Token Recycling time, also when
    some chunks hold large trees that gained many tokens (their steps cost more, and that is not a load change: the
    old per-step cost ratio left out exactly the best chunk of an answer, and the meter read 20% low)."""
    def answer(clock: Clock):
        yield from sized_run(clock, 60, sizes=(3, 2, 3, 3, 2, 3, 2, 3), gains=(2, 1, 1, 2, 1, 2, 1, 1))
        yield from sized_run(clock, 24, sizes=(17,), gains=(12,))  # a run copied from the prompt: 2 steps of 17
        yield from sized_run(clock, 60, sizes=(3, 2, 3, 3, 2, 3, 2, 3), gains=(2, 1, 1, 2, 1, 2, 1, 1))

    steady = Clock(lambda t: 1.0)
    truth_tr = sum(e.timings["total"] for e in answer(Clock(lambda t: 1.0)))
    est = measure_interleaved(answer(steady), fake_run(steady, 144, 1, 20.0), chunk_ms=100.0)
    assert est.left_out == 0 and est.tokens == 144
    assert est.trusted and abs(est.ratio - 144 * 20.0 / truth_tr) < 1e-9 and est.error < 1e-9
    # a real load change between a pair's halves is still caught: 3x busier during one plain chunk
    flips = {"at": None}

    def load(t: float) -> float:
        return 3.0 if flips["at"] is not None and flips["at"] <= t < flips["at"] + 60 else 1.0

    busy = Clock(load)
    flips["at"] = 900.0
    est = measure_interleaved(answer(busy), fake_run(busy, 144, 1, 20.0), chunk_ms=100.0)
    assert est.left_out >= 1


def test_the_meters_step_costs_are_shown_as_measured_even_below_one_plain_step():
    """Where the meter timed Token Recycling's small steps faster than its plain steps (a busy moment, per-token
    overheads), the cost panel shows that, unfloored: a floor at 1 raised this answer's mean cost from 1.31 to 1.52
    plain steps on a screenshot, and the formula then disagreed with the meter it is computed from."""
    from studio.views import expected_speedup, meter_curve

    # the meter's steps: 3 steps of 3 tokens at 18 ms and one of 9 tokens at 60 ms; plain decoding 20 ms a token;
    # 8 tokens in 4 steps -> plain 160 ms against 114 ms
    speed = dict(trusted(ratio=160 / 114, error=0.01), mean_accepted=2.0, plain_tps=50.0,
                 step_ms=((3, 18.0, 3), (9, 60.0, 1)))
    curve = meter_curve(speed)
    assert abs(curve.cost(3) - 0.9) < 1e-9
    steps = [story_step(i, 3, 2) for i in range(3)] + [story_step(3, 9, 2)]
    assert abs(expected_speedup(steps, curve)[2] - speed["ratio"]) < 1e-9


def test_a_pair_left_out_lends_no_timing_but_its_text_still_counts():
    """Leaving out a disturbed pair must not change what was decoded: the figure is the text of every pair costed at
    the undisturbed pairs' rates, so its tokens per step are the whole measured text's, and the formula with the
    meter's timings over that text gives its ratio (a screenshot showed 1.62 tokens per step beside a figure
    computed from the 1.42 of the pairs kept)."""
    from studio.views import meter_curve

    def answer(clock: Clock):
        yield from sized_run(clock, 60, sizes=(3, 2, 3, 3, 2, 3, 2, 3), gains=(2, 1, 1, 2, 1, 2, 1, 1))
        yield from sized_run(clock, 24, sizes=(17,), gains=(12,))
        yield from sized_run(clock, 60, sizes=(3, 2, 3, 3, 2, 3, 2, 3), gains=(2, 1, 1, 2, 1, 2, 1, 1))

    steps = list(answer(Clock(lambda t: 1.0)))
    truth = 144 * 20.0 / sum(e.timings["total"] for e in steps)
    window = {"at": 900.0}
    busy = Clock(lambda t: 3.0 if window["at"] <= t < window["at"] + 60 else 1.0)
    est = measure_interleaved(answer(busy), fake_run(busy, 144, 1, 20.0), chunk_ms=100.0)
    assert est.left_out >= 1 and est.tokens == est.covered == 144
    assert abs(est.mean_accepted - 144 / len(steps)) < 1e-9  # the whole text's tokens per step
    assert abs(est.ratio - truth) < 1e-9  # the disturbed pair's timing is gone, its text is not
    curve = meter_curve(dataclasses.asdict(est))
    a = est.mean_accepted
    c = sum(curve.cost(len(e.tokens)) for e in steps) / len(steps)
    assert abs(a / c - est.ratio) < 1e-9


def test_the_meters_re_decode_drafts_the_answers_very_trees():
    """A cost-sized tree sizes each step from timings that differ run to run, so re-decoding an answer from its
    starting state drafted other trees and the meter timed another answer's steps (81 steps at 1.58 tokens beside
    the answer's 79 at 1.62 on a screenshot). Told the answer's sizes, the twin drafts its very trees."""
    from studio.meter import answer_sizes

    engine = tiny_engine()
    prompt = [3, 4, 5, 6, 7, 8, 9, 10, 3, 4, 5, 6]
    for template in ("adaptive", "hybrid"):
        cfg = DecodeConfig(max_new_tokens=30, template=template)
        list(engine.generate(prompt, cfg))  # the curve measured, the matrix and calibration warm
        twin = engine.fork()
        answer = [e for e in engine.generate(prompt, cfg) if isinstance(e, StepEvent)]
        for drafter in (twin.adaptive, twin.hybrid):  # the re-decode's timings say drafting is free: chosen anew,
            drafter.cost.ms = {n: 1.0 for n in drafter.cost.ms}  # its sizes differ from the answer's
        chosen = [e for e in twin.fork().generate(prompt, cfg) if isinstance(e, StepEvent)]
        assert [e.tokens for e in chosen] != [e.tokens for e in answer], template  # (the check below can fail)
        redone = [e for e in twin.fork(answer_sizes(answer)).generate(prompt, cfg) if isinstance(e, StepEvent)]
        assert [e.tokens for e in redone] == [e.tokens for e in answer], template
        assert [e.emitted for e in redone] == [e.emitted for e in answer]


def test_the_meters_formula_divides_to_the_ratio_it_shows():
    """A reader divides the two figures of "2.06 ÷ 1.205 = 1.71×" and gets the figure shown (a cold reader found
    "2.06 ÷ 1.21 = 1.71×", which divides to 1.70)."""
    import random

    from studio.views import divisor_text

    assert divisor_text(2.0645, 1.71) == "1.205"
    assert divisor_text(2.5, 1.0) == "2.50"
    rng = random.Random(0)
    for _ in range(2000):
        a, ratio = rng.uniform(1.0, 4.0), rng.uniform(0.5, 3.0)
        shown = divisor_text(a, ratio)
        assert round(round(a, 2) / float(shown), 2) == round(ratio, 2), (a, ratio, shown)


def test_the_status_says_when_the_token_limit_ended_the_answer():
    """An answer cut by Max new tokens ends mid-sentence: the status says why (a cold reader saw no reason)."""
    from tr_core.events import SummaryEvent
    from studio.views import done_status

    trace = story_trace(None)

    def summary(reason: str) -> SummaryEvent:
        return SummaryEvent(tokens=[1, 2, 3, 4, 5], prompt_tokens=3, new_tokens=5, steps=2, mean_accepted=2.5,
                            tokens_per_s=10.0, prefill_s=0.1, decode_s=0.5, wall_s=0.6, stop_reason=reason,
                            method="recycling", template="adaptive", matrix_rows_filled=5, matrix_mb=0.1)

    trace.summary = summary("length")
    assert done_status([], trace) == ("✓ Done. Showing step 1 of 2, the one with the most drafts from the matrix alone accepted (1; 3 tokens). "
                                      "It stopped at its 5-token limit (Max new tokens).")
    trace.summary = summary("eos")
    assert done_status([], trace) == ("✓ Done. Showing step 1 of 2, the one with the most drafts from the matrix alone accepted "
                                      "(1; 3 tokens).")
    trace.step_texts = [" a b c", ""]  # the last step gave only the end-of-turn token: no run of its own in the chat
    assert done_status([], trace).endswith("tokens). Step 2 gave only the end-of-turn token, which the chat does not show.")
    trace.step_texts = [" a b c", " d e"]
    assert done_status(["■ Stopped."], trace) == "■ Stopped."
    # the last step's path cut by the limit: its story names the limit too, an earlier step's has no such clause
    from studio.views import step_views

    last = trace.steps[-1]
    last.accepted, last.emitted, last.bonus = [0, 1, 2, 3], [1, 2], None
    trace.summary = summary("length")
    assert "the answer ended after 2 of them, at &#x27;␣w2&#x27; (the length limit)" in step_views(trace, 1)["story"]
    trace.summary = summary("eos")
    assert "(an end-of-turn token)" in step_views(trace, 1)["story"]
    assert "ended" not in step_views(trace, 0)["story"]


def test_the_formula_counts_the_steps_that_drafted_nothing():
    """A cold reader saw "from 1 to 25" beside a full matrix and asked why a step drafted nothing."""
    from studio.views import step_sizes

    steps = [story_step(0, 1, 1), story_step(1, 4, 3), story_step(2, 1, 1)]
    assert step_sizes(steps).endswith(" 2 of them drafted nothing and verified the last token alone (each such "
                                      "step's story says why).")
    assert "drafted nothing" not in step_sizes(steps[1:2]) and "drafted nothing" not in step_sizes([steps[0]])


def test_the_trace_schema_knows_every_field_of_a_speed_record():
    from dataclasses import fields

    from studio.meter import SpeedEstimate
    from tr_core.trace import SPEED_KEYS

    assert SPEED_KEYS == {f.name for f in fields(SpeedEstimate)}


def test_every_speed_figure_names_the_machine_it_was_timed_on(monkeypatch):
    """The meter (live, measured, recorded), the race's caption, the replay's summary and the cost panel's estimate
    name the machine the answer's speeds were timed on, from the trace; an older trace says it was not recorded."""
    from present.meter import MeterView, meter_html
    from present.race import plain_pace
    from present.replay import summary_line
    from studio import zerogpu
    from studio.cost_panel import cost_html
    from studio.handlers import precision
    from studio.views import live_meter, trace_meter
    from tr_core.machine import speed_label

    engine = Engine(tiny_model("llama"), TinyTokenizer(64), tune_kernels=False)
    where = precision(engine)["machine"]
    assert where == speed_label("cpu") and f"{torch.get_num_threads()} thread" in where
    from tr_core import machine

    monkeypatch.setattr(machine, "cpu_name", lambda: "Intel(R) Xeon(R)  Platinum(TM) CPU")
    assert speed_label() == f"Intel Xeon Platinum CPU, {torch.get_num_threads()} thread" + (
        "s" if torch.get_num_threads() != 1 else "")
    monkeypatch.setattr(zerogpu, "installed", lambda: True)
    assert precision(engine)["machine"] == zerogpu.LABEL
    trace = story_trace(trusted())
    trace.settings["machine"] = "Test CPU 9000, 2 threads"
    for shown in (live_meter(trace), trace_meter(trace), trace_meter(trace, loaded=True),
                  cost_html(trace.steps[-1], linear_curve(), trace), plain_pace(trace, 100.0, 5)[1],
                  summary_line(trace)):
        assert "Test CPU 9000, 2 threads" in html.unescape(shown), shown
    del trace.settings["machine"]
    assert "was not recorded" in trace_meter(trace) and "machine not recorded" in summary_line(trace)
    assert "timed on" not in meter_html(MeterView())  # no figures yet: no machine either


def test_a_cost_the_meter_timed_under_one_says_why():
    """A step the meter timed at under one plain step (0.97x) says why, in the panel and its brief: a reader
    expects more tokens to cost more."""
    from studio.cost_panel import CostCurve, PLAIN_STEP, brief_note, cost_html, cost_text

    metered = CostCurve(lambda n: 0.97, source="the meter", unit=PLAIN_STEP)
    ev = story_step(0, 6, 3)
    assert "0.97× a plain decoding step, as the meter timed this answer (under 1: a step of a few tokens took less" \
        in cost_text(ev, metered, trusted())[0]
    assert brief_note(ev, metered, trusted()) == "Under 1: this step ran faster than a plain step here."
    assert unglossed(cost_html(ev, metered)).count('<span class="tr-cost-note">Under 1: this step ran faster') == 1
    above = CostCurve(lambda n: 1.2, source="the meter", unit=PLAIN_STEP)
    assert "nder 1" not in cost_text(ev, above, trusted())[0] + brief_note(ev, above, trusted()) + cost_html(ev, above)
