"""Provenance of drafted tokens: each node says which step's logits wrote its candidate into the matrix. It is
gathered only when asked (`DecodeConfig.provenance`, as the studio asks for its microscope)."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

from tr_core import DecodeConfig, Engine, StepEvent
from tr_core.matrix import AdjacencyMatrix


def test_matrix_stamps_rows_and_reads_origins_before_they_are_rewritten():
    m = AdjacencyMatrix(10, k=2)
    logits = torch.full((2, 10), -10.0)
    logits[0, 7], logits[0, 3], logits[1, 5], logits[1, 6] = 4.0, 3.0, 2.0, 1.0
    m.update(torch.tensor([1, 2]), logits.clone(), stamp=12)  # step 12 wrote rows 1 and 2
    m.seed_from_text([4, 9], stamp=20)  # prompt seeding at tick 20 wrote row 4
    stamps, probs = m.origins(torch.tensor([1, 7, 3, 9]), torch.tensor([0, 0, 0, 0]), torch.tensor([0, 0, 1, 0]))
    assert stamps.tolist() == [12, 12, 12, 12]  # every node's parent is node 0, token 1: written at 12
    assert probs[2] == pytest.approx(float(m.probs[1, 1]) / 255)
    assert m.origins(torch.tensor([4, 9]), torch.tensor([0, 0]), torch.tensor([0, 0]))[0].tolist() == [20, 20]
    assert m.stamps[0] == -1  # never written
    twin = m.clone()
    m.reset()
    assert twin.stamps[1] == 12 and m.stamps[1] == -1


@pytest.mark.parametrize("template", ["2.2.2", "adaptive-fixed", "hybrid-fixed"])
def test_without_the_flag_nothing_is_gathered_and_the_decode_is_the_same(template, monkeypatch):
    """Off (the default), no step reads rows or origins for the sync: the events' provenance fields stay empty, as a
    plain step's; the tokens, trees and matrix are those of a decode that gathered it."""
    from tr_core import engine as engine_module

    prompts = [[5, 9, 14, 22, 9, 14, 30, 31], [5, 9, 14, 40, 41, 9, 14]]
    runs = {}
    for flag in (True, False):
        engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
        cfg = DecodeConfig(template=template, max_new_tokens=30, provenance=flag)
        runs[flag] = [[ev for ev in engine.generate(p, cfg) if isinstance(ev, StepEvent)] for p in prompts], engine
    off, on = runs[False][0], runs[True][0]
    for a, b in zip(sum(off, []), sum(on, [])):
        assert (a.tokens, a.parents, a.emitted, a.matrix_rows, a.matrix_values) == \
            (b.tokens, b.parents, b.emitted, b.matrix_rows, b.matrix_values)
        assert a.written is None and a.candidate_probs is None and a.rows_read == [] and a.rows_before == []
    assert len(sum(off, [])) == len(sum(on, [])) and any(b.rows_read for b in sum(on, []))
    assert torch.equal(runs[False][1].matrix.table, runs[True][1].matrix.table)
    gathered = []
    monkeypatch.setattr(engine_module, "gather", lambda *args: gathered.append(args) or {})
    list(runs[False][1].generate(prompts[0], DecodeConfig(template=template, max_new_tokens=8)))
    assert not gathered  # the step loop never asked for it
    list(runs[False][1].generate(prompts[0], DecodeConfig(template=template, max_new_tokens=8, provenance=True)))
    assert gathered  # ... and the spy sees it when it does


@pytest.mark.parametrize("template", ["2.2.2", "adaptive-fixed", "hybrid-fixed"])
def test_every_drafted_node_names_the_step_that_wrote_it(template):
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    steps: dict[tuple[int, int], StepEvent] = {}
    prompts = [[5, 9, 14, 22, 9, 14, 30, 31], [5, 9, 14, 40, 41, 9, 14]]
    checked = 0
    for a, prompt in enumerate(prompts):
        for ev in engine.generate(prompt, DecodeConfig(template=template, max_new_tokens=30, provenance=True)):
            if not isinstance(ev, StepEvent):
                continue
            assert ev.answer == a and len(ev.written) == len(ev.tokens) == len(ev.candidate_probs)
            for i in range(1, len(ev.tokens)):
                wa, ws = ev.written[i]
                row = ev.tokens[ev.parents[i]]
                if ev.sources is not None and ev.sources[i] == "context":
                    assert [wa, ws] == [-1, -1]
                    continue
                assert [wa, ws] != [-1, -1], "a row never written is not drafted from"
                if ws == -1:  # the row came from prompt seeding of answer wa
                    assert wa >= 0 and template != "2.2.2"  # static templates run without seeding
                    continue
                writer = steps[(wa, ws)]
                r = writer.matrix_rows.index(row)
                assert writer.matrix_values[r][ev.ranks[i]] == ev.tokens[i]
                assert abs(writer.matrix_probs[r][ev.ranks[i]] - ev.candidate_probs[i]) <= 0.5 / 255 + 1e-4
                # and no step between the writer and this one rewrote that row
                later = [k for k in steps if k > (wa, ws) and row in steps[k].matrix_rows]
                assert not later, f"row {row} was rewritten at {later[0]} after {(wa, ws)}"
                checked += 1
            steps[(a, ev.step)] = ev
    assert checked > 20, "the check must cover many recycled nodes"
    assert any(steps[k].written and any(w[0] == 0 for w in steps[k].written[1:]) for k in steps if k[0] == 1), \
        "the second answer drafts candidates written during the first"


def test_a_step_that_drafts_nothing_shows_the_root_alone_and_plain_steps_show_no_provenance():
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    engine.adaptive.choose_size = lambda expected, budget: 0  # every step a zero-draft one
    prompt = [5, 9, 14, 22, 9, 14, 30, 31]
    events = [ev for ev in engine.generate(prompt, DecodeConfig(template="adaptive", max_new_tokens=8, provenance=True))
              if isinstance(ev, StepEvent)]
    assert events and all(len(ev.tokens) == 1 for ev in events)
    assert all(ev.written == [[-1, -1]] and ev.candidate_probs == [0.0] and ev.matrix_rows for ev in events)
    plain = [ev for ev in engine.generate(prompt, DecodeConfig(plain=True, max_new_tokens=4, provenance=True))
             if isinstance(ev, StepEvent)]
    assert all(ev.written is None and ev.candidate_probs is None for ev in plain)


def test_provenance_survives_a_trace_round_trip_and_bad_values_are_refused(tmp_path):
    import json

    from tr_core.trace import Trace, TraceError

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    events = list(engine.generate([5, 9, 14, 22, 9, 14], DecodeConfig(template="2.2.2", max_new_tokens=12,
                                                                      provenance=True)))
    trace = Trace(model="tiny")
    for ev in events[:-1]:
        trace.add_step(ev, token_text=str)
    trace.summary = events[-1]
    path = tmp_path / "t.json"
    trace.save(path)
    back = Trace.load(path)
    assert [s.written for s in back.steps] == [e.written for e in events[:-1]]
    data = json.loads(path.read_text())
    s = next(i for i, step in enumerate(data["steps"]) if len(step["tokens"]) > 1)  # a cold first step drafts nothing
    data["steps"][s]["written"][1] = [0, "x"]
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match="written"):
        Trace.load(path)
    data["steps"][s]["written"][1] = [0, 0]
    data["steps"][s]["candidate_probs"][1] = 1.5
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match="candidate_probs"):
        Trace.load(path)
    data["steps"][s]["candidate_probs"][1] = 0.5
    data["version"] = 1
    data["steps"][0].pop("sources", None), data["steps"][0].pop("origins", None)
    path.write_text(json.dumps(data))
    with pytest.raises(TraceError, match="new in trace version 2"):
        Trace.load(path)
