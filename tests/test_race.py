"""The race (present.race) on a hand-built trace: timestamps from the recorded step timings, exact frames, same
race every time, plain decoding paced by the meter's trusted ratio, and no race where the meter measured no ratio (too
noisy, or an older trace timed one method after the other): the race never shows a gap the meter did not measure."""
from __future__ import annotations

import dataclasses

import pytest

from tr_core.events import StepEvent, SummaryEvent
from present.race import NoRace, no_race_reason, race_frame, race_timeline, token_ends
from studio.meter import SpeedEstimate
from tr_core.trace import Trace

VOCAB = {0: "<root>", 1: " the", 2: " cat", 3: " sat", 7: " on", 8: " mat", 9: "!"}
TEXT = " the cat sat on mat!"  # 20 characters: steps " the cat" | " sat" | " on mat!"


def make_step(step: int, emitted: list[int], total_ms: float) -> StepEvent:
    """A chain tree whose drafts were all accepted, then the bonus; only `emitted` and the timings matter here."""
    n = len(emitted)  # the root, then the n - 1 accepted drafts
    return StepEvent(step=step, position=10 + step, tokens=[0, *emitted[:-1]], parents=list(range(-1, n - 1)),
                     depths=list(range(n)), ranks=[-1] + [0] * (n - 1), accepted=list(range(n)), emitted=emitted,
                     bonus=emitted[-1], timings={"forward": total_ms * 0.9, "total": total_ms})


def speed(**over) -> dict:
    """A recorded speed measurement (a trusted 1.5x over all 6 tokens unless overridden)."""
    est = SpeedEstimate(ratio=1.5, error=0.05, tr_tps=100.0, plain_tps=66.7, mean_accepted=2.0, tokens=6, pairs=4,
                        trusted=True, identical=True, covered=6)
    return dataclasses.asdict(dataclasses.replace(est, **over))


def make_trace(**over) -> Trace:
    """3 steps, recorded at 10, 20 and 30 ms: ' the cat' (2 tokens), ' sat' (1), ' on mat!' (3)."""
    trace = Trace(model="tiny", settings={"template": "tiny"}, messages=[{"role": "user", "content": "hi"}],
                  steps=[make_step(0, [1, 2], 10.0), make_step(1, [3], 20.0), make_step(2, [7, 8, 9], 30.0)],
                  token_texts=dict(VOCAB), step_texts=[" the cat", " sat", " on mat!"], speed=speed())
    for name, value in over.items():
        setattr(trace, name, value)
    return trace


def test_timestamps_are_the_cumulative_recorded_step_times():
    tl = race_timeline(make_trace())
    assert tl.text == TEXT and tl.mode == "measured"
    assert tl.tr.times == (10.0, 30.0, 60.0) and tl.tr.chars == (8, 12, 20)
    assert token_ends(make_trace(), [" the cat", " sat", " on mat!"]) == [4, 8, 12, 15, 19, 20]
    # plain decoding: 6 tokens paced evenly so that plain time / Token Recycling time = the measured 1.5
    assert tl.plain.times == (15.0, 30.0, 45.0, 60.0, 75.0, 90.0) and tl.plain.chars == (4, 8, 12, 15, 19, 20)
    assert tl.plain.total_ms / tl.tr.total_ms == pytest.approx(1.5)
    slower = make_trace()
    slower.steps[1].timings["total"] = 50.0  # a slower second step moves every later timestamp
    assert race_timeline(slower).tr.times == (10.0, 60.0, 90.0)


def test_frames_show_exactly_the_text_of_the_units_ended_by_then():
    tl = race_timeline(make_trace())
    assert race_frame(tl, 0.0) == ("", "", "step 0 of 3 · 0 tokens", "token 0 of 6")
    assert race_frame(tl, 9.99) == ("", "", "step 0 of 3 · 0 tokens", "token 0 of 6")
    assert race_frame(tl, 10.0) == (" the cat", "", "step 1 of 3 · 2 tokens", "token 0 of 6")
    assert race_frame(tl, 30.0) == (" the cat sat", " the cat", "step 2 of 3 · 3 tokens", "token 2 of 6")
    assert race_frame(tl, 59.9) == (" the cat sat", " the cat sat", "step 2 of 3 · 3 tokens", "token 3 of 6")
    assert race_frame(tl, 60.0) == (TEXT, " the cat sat on", "step 3 of 3 · 6 tokens · done in 0.06 s", "token 4 of 6")
    assert race_frame(tl, 90.0) == (TEXT, TEXT, "step 3 of 3 · 6 tokens · done in 0.06 s",
                                    "token 6 of 6 · done in 0.09 s")
    assert race_frame(tl, 1e9) == race_frame(tl, 90.0)
    assert "1.50× ± 0.05" in tl.caption and "paced evenly" in tl.caption


def test_the_race_is_the_same_every_time_and_after_a_save(tmp_path):
    trace = make_trace()
    first = race_timeline(trace)
    assert race_timeline(trace) == first and race_timeline(trace).to_dict() == first.to_dict()
    loaded = Trace.load(trace.save(tmp_path / "t.json"))
    assert race_timeline(loaded) == first
    frames = [race_frame(first, t) for t in range(0, 100, 5)]
    assert frames == [race_frame(race_timeline(loaded), t) for t in range(0, 100, 5)]
    assert all(len(a[0]) <= len(b[0]) and len(a[1]) <= len(b[1]) for a, b in zip(frames, frames[1:]))  # text only grows


def test_too_noisy_gives_no_race_since_its_gap_would_be_unmeasured():
    trace = make_trace(speed=speed(trusted=False, reason="the timings varied by ±20% between turns",
                                   plain_tps=50.0))
    reason = no_race_reason(trace)
    assert "could not measure the speedup (the timings varied by ±20% between turns)" in reason
    assert "a gap nobody measured" in reason
    with pytest.raises(NoRace, match="could not measure"):
        race_timeline(trace)
    # a ratio recorded but not trusted is not raced either (the meter shows none)
    assert "could not measure" in no_race_reason(make_trace(speed=speed(trusted=False, reason="busy")))


def test_an_older_trace_timed_one_method_after_the_other_gives_no_race_and_says_why():
    plain = SummaryEvent(tokens=[1, 2, 3, 7, 8, 9], prompt_tokens=5, new_tokens=6, steps=6, mean_accepted=1.0,
                         tokens_per_s=50.0, prefill_s=0.01, decode_s=0.12, wall_s=0.13, stop_reason="eos",
                         method="plain", template="", matrix_rows_filled=0, matrix_mb=0.0)
    reason = no_race_reason(make_trace(speed=None, plain=plain))
    assert "timed one method after the other" in reason and "not a measurement" in reason


def test_the_meter_over_part_of_the_answer_is_said_and_differing_tokens_are_flagged():
    tl = race_timeline(make_trace(speed=speed(tokens=4, identical=False)))
    assert "over the first 4 of 6 tokens" in tl.caption and "tokens differed" in tl.caption


def test_no_race_without_a_measurement_steps_or_timings():
    assert "not measured against plain decoding" in no_race_reason(make_trace(speed=None))
    assert no_race_reason(make_trace(steps=[], step_texts=[])) == "there is no answer to race yet"
    assert no_race_reason(None) == "there is no answer to race yet"
    untimed = make_trace()
    for ev in untimed.steps:
        ev.timings["total"] = 0.0
    assert "timings were not recorded" in no_race_reason(untimed)
    nothing = make_trace(speed=speed(ratio=None, plain_tps=None, trusted=False, reason="nothing was measured"))
    assert "could not measure the speedup (nothing was measured)" in no_race_reason(nothing)
    with pytest.raises(NoRace, match="not measured"):
        race_timeline(make_trace(speed=None))
    assert no_race_reason(make_trace()) == ""


def test_texts_outside_the_basic_plane_are_counted_in_code_points():
    trace = make_trace(step_texts=[" the 🐈", " sat", " on mat!"])  # one code point, as the page's Array.from counts
    tl = race_timeline(trace)
    assert tl.tr.chars == (6, 10, 18) and race_frame(tl, 10.0)[0] == " the 🐈"
    assert tl.plain.chars[:2] == (4, 6)  # ' the' then the rest of the step's run
