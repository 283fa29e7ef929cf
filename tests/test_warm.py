"""Issue 40: empty matrix rows are never drafted, a step that drafts nothing says why, and the warm start."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY_VOCAB, TinyTokenizer, tiny_model
from present.reasons import no_draft_reason

from tr_core import AdjacencyMatrix, DecodeConfig, Engine, StepEvent, SummaryEvent, build_tree, validate_template
from tr_core import warm, warm_build
from tr_core.adaptive import AdaptiveDrafter
from tr_core.drafters import StaticTreeDrafter, StepResult
from tr_core.growth import grow_lists, grow_on_device
from tr_core.hybrid import live_part
from tr_core.trace import TraceError, check_step
from tr_core.tree import live_nodes, resolve_template

# The hand-built tree of test_units:  0 -> 1 (rank 0), 2 (rank 1); 1 -> 3 (0), 4 (1); 3 -> 5 (0)
PATHS = [(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]


def hand_matrix(rows: dict[int, list[int]], vocab: int = 10, k: int = 2) -> AdjacencyMatrix:
    """A matrix with only `rows` written (each row's candidates, probabilities falling)."""
    m = AdjacencyMatrix(vocab, k)
    for row, cands in rows.items():
        m.table[row] = torch.tensor(cands, dtype=torch.int32)
        m.probs[row] = torch.tensor([200, 40][:k], dtype=torch.uint8)
        m.filled[row] = True
    return m


def static(paths=PATHS, k: int = 2, name: str = "t") -> StaticTreeDrafter:
    return StaticTreeDrafter(build_tree(name, validate_template(paths, k=k)))


# -- 1. empty rows are not drafted ---------------------------------------------------------------------------------
def test_static_template_leaves_out_nodes_under_empty_rows():
    drafter = static()
    # root 3 -> [4, 5]; row 4 -> [6, 7]; row 6 never written: node 5 (candidate 0 of 6) is left out
    m = hand_matrix({3: [4, 5], 4: [6, 7]})
    d = drafter.draft(torch.tensor([3]), m)
    assert d.tokens.tolist() == [3, 4, 5, 6, 7] and d.size == 5
    assert d.parents.tolist() == [0, 0, 0, 1, 1] and d.ranks.tolist() == [0, 0, 1, 0, 1]
    assert d.depths.tolist() == [0, 1, 1, 2, 2] and d.name == "t"
    assert torch.equal(d.tree_mask, drafter.tree.tree_mask[:5, :5])
    # row 4 empty too: the whole subtree under node 1 goes; node 2 ([1]) keeps its rank
    d = drafter.draft(torch.tensor([3]), hand_matrix({3: [4, 5]}))
    assert d.tokens.tolist() == [3, 4, 5] and d.ranks.tolist() == [0, 0, 1] and d.no_draft is None
    # every row written: the template as it is
    full = hand_matrix({r: [(r + 1) % 10, (r + 2) % 10] for r in range(10)})
    assert drafter.draft(torch.tensor([3]), full).size == 6


def test_static_template_on_an_empty_matrix_drafts_the_root_alone_and_says_why():
    drafter = static(resolve_template("2.2.2", 8)[1], k=8, name="2.2.2")
    d = drafter.draft(torch.tensor([7]), AdjacencyMatrix(50, 8))
    assert d.size == 1 and d.tokens.tolist() == [7] and d.name == "2.2.2"
    assert d.no_draft is not None
    assert d.no_draft.as_data() == {"why": "empty row", "drafts": 0, "gain": 0.0, "cost_ratio": 0.0, "context": False}
    assert d.no_draft.unverified() is None


def test_static_lookahead_rides_the_sync_and_matches_a_direct_draft():
    drafter, m = static(), hand_matrix({3: [4, 5], 4: [6, 7]})
    live = drafter.lookahead(torch.tensor([3]), m)["live"]
    assert live.tolist() == [True, True, True, True, True, False]
    drafter.observe(StepResult(parents=[-1], accepted=[0], emitted=[3], forward_tokens=1, forward_ms=1.0,
                               step_ms=1.0, extras={"live": [int(v) for v in live]}))
    ahead = drafter.draft(torch.tensor([3]), m)
    direct = drafter.draft(torch.tensor([3]), m)
    assert ahead.tokens.tolist() == direct.tokens.tolist() == [3, 4, 5, 6, 7]


def test_live_nodes_follows_every_ancestor():
    tree = build_tree("t", validate_template(PATHS, k=2))
    filled = torch.zeros(10, dtype=torch.bool)
    filled[[3, 6]] = True  # row 4 empty: node 5, under 6 under 4, dies with its ancestor
    assert live_nodes(filled, torch.tensor([3, 4, 5, 6, 7, 8]), tree).tolist() == [1, 1, 1, 0, 0, 0]


def test_grown_trees_never_expand_an_empty_row():
    m = hand_matrix({3: [4, 5], 4: [6, 7]})
    rates = AdaptiveDrafter(torch.device("cpu")).rate_host
    tree = grow_lists(m, 3, rates, 0, budget=20, max_depth=4)
    assert sorted(tree["tokens"]) == [3, 4, 5, 6, 7]  # rows 5, 6, 7 never written: nothing under them
    lut = torch.tensor([rates[k] for k in range(32) for _ in range(16)][:512])
    grown = grow_on_device(m, torch.tensor([3]), lut, 0, budget=20, max_depth=4)
    live = (grown.scores > 0).sum().item()
    assert live == 5  # the device grows fixed shapes: nodes under empty rows score 0, and are cut before a draft
    part = live_part({"tokens": grown.tokens.tolist(), "parents": grown.parents.tolist(),
                      "scores": grown.scores.tolist()})
    assert sorted(part["tokens"]) == [3, 4, 5, 6, 7]
    assert all(part["parents"][i] < i for i in range(1, len(part["tokens"])))


def test_a_cold_engine_never_drafts_token_zero_and_stays_lossless():
    model = tiny_model("llama")
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    prompt = [5, 9, 17, 33, 5, 9]
    plain = [e for e in engine.generate(prompt, DecodeConfig(max_new_tokens=40, plain=True))][-1].tokens
    for template in ("2.2.2", "adaptive-fixed", "hybrid-fixed"):
        engine.forget()
        # unseeded, a cold matrix has no row at all (the hybrid still copies from the prompt)
        cfg = DecodeConfig(max_new_tokens=40, template=template, prompt_seeding=False)
        events = list(engine.generate(prompt, cfg))
        steps = [e for e in events if isinstance(e, StepEvent)]
        assert events[-1].tokens == plain, template
        if template != "hybrid-fixed":
            assert steps[0].tokens == [prompt[-1]]  # nothing under the root
            assert steps[0].no_draft is not None and steps[0].no_draft["why"] == "empty row"
            assert "no candidates after 'a'" in no_draft_reason(steps[0], lambda t: "a")  # as the views say it
        written: set[int] = set()
        for ev in steps:
            for node in range(1, len(ev.tokens)):
                parent_token = ev.tokens[ev.parents[node]]
                from_matrix = ev.sources is None or ev.sources[node] != "context"
                assert not from_matrix or parent_token in written, (template, ev.step)
            written.update(ev.matrix_rows)


# -- 3. why no draft -------------------------------------------------------------------------------------------------
def _expensive(engine: Engine) -> None:
    """Make every forward of more than one token look 20x a one-token one (a machine far too busy to draft)."""
    for drafter in (engine.adaptive, engine.hybrid):
        drafter.cost.measured = True
        drafter.cost.ms = {n: 1.0 if n == 1 else 20.0 * n for n in drafter.cost.ms}
        drafter.cost.probed = dict(drafter.cost.ms)


@pytest.mark.parametrize("template", ["adaptive", "hybrid"])
def test_a_cost_sized_tree_that_drafts_nothing_says_why_with_its_numbers(template):
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB), tune_kernels=False)
    prompt = [5, 9, 17, 33, 5, 9, 17, 33]
    list(engine.generate(prompt, DecodeConfig(max_new_tokens=30, template=template)))  # the matrix learns
    _expensive(engine)
    steps = [e for e in engine.generate(prompt, DecodeConfig(max_new_tokens=30, template=template))
             if isinstance(e, StepEvent)]
    assert steps[0].no_draft["why"] == "first step" and "prompt's own forward" in no_draft_reason(steps[0])
    costly = [e for e in steps[1:] if e.unverified is not None]
    assert costly, "no step explained a tree too costly to verify"
    for ev in costly:
        assert len(ev.tokens) == 1 and ev.no_draft["why"] == "cost" and ev.no_draft["cost_ratio"] > 1
        tree = ev.unverified
        assert tree["tokens"][0] == ev.tokens[0] and tree["parents"][0] == -1
        assert len(tree["tokens"]) == len(tree["parents"]) == len(tree["expected"]) >= 2
        assert all(0 <= tree["parents"][i] < i for i in range(1, len(tree["parents"])))
        assert ev.no_draft["drafts"] == len(tree["tokens"]) - 1 and ev.no_draft["context"] == (template == "hybrid")
        text = no_draft_reason(ev)
        assert "would not pay for its forward" in text and f"({ev.no_draft['cost_ratio']:.2f}× a one-token step" in text
        check_step(json.loads(json.dumps(ev.to_dict())), ev.step)  # a trace of it loads
    assert all(e.no_draft is None and e.unverified is None for e in steps if len(e.tokens) > 1)


def test_trace_loader_refuses_a_malformed_unverified_tree():
    ev = StepEvent(step=0, position=3, tokens=[7], parents=[-1], depths=[0], ranks=[-1], accepted=[0], emitted=[8],
                   bonus=8, timings={"total": 1.0},
                   no_draft={"why": "cost", "drafts": 2, "gain": 0.3, "cost_ratio": 1.9, "context": False},
                   unverified={"tokens": [7, 8, 9], "parents": [-1, 0, 1], "expected": [1.0, 0.5, 0.2]}).to_dict()
    check_step(ev, 0)
    bad = [
        {"tokens": [7, 8], "parents": [-1, 0]},  # a key missing
        {"tokens": [7, 8], "parents": [-1, 1], "expected": [1.0, 0.5]},  # a parent after its child
        {"tokens": [7, 8], "parents": [-1, 0], "expected": [1.0, 1.5]},  # not a probability
        {"tokens": [7, -8], "parents": [-1, 0], "expected": [1.0, 0.5]},  # not a token id
        {"tokens": [6, 8], "parents": [-1, 0], "expected": [1.0, 0.5]},  # another root
        {"tokens": [7, 8], "parents": [-1, 0, 0], "expected": [1.0, 0.5]},  # lengths differ
    ]
    for tree in bad:
        with pytest.raises(TraceError):
            check_step({**ev, "unverified": tree}, 0)
    for bad_reason in (3, "no draft: why", {"why": "tired"}, {"why": "cost", "gain": -1.0}):
        with pytest.raises(TraceError):
            check_step({**ev, "no_draft": bad_reason}, 0)
    with pytest.raises(TraceError):  # version 2 wrote the reason as text; version 3 does not
        check_step({**ev, "no_draft_reason": "no draft: why"}, 0)
    check_step({**ev, "no_draft": None, "no_draft_reason": "no draft: why"}, 0, version=2)  # an older trace loads
    with pytest.raises(TraceError):  # a step that drafted cannot say it drafted nothing
        check_step({**ev, "tokens": [7, 8], "parents": [-1, 0], "depths": [0, 1], "ranks": [-1, 0]}, 0)


# -- 2. the warm start -----------------------------------------------------------------------------------------------
CORPUS = ["abc", "hello there", "what is this", "more text to learn", "abcabc"]


def tiny_engine(seed: int = 0) -> Engine:
    return Engine(tiny_model("llama", seed=seed), TinyTokenizer(TINY_VOCAB), tune_kernels=False)


def test_a_warm_start_round_trips_and_leaves_a_fresh_engine_warm(tmp_path):
    engine = tiny_engine()
    progress = []
    state = warm.learn(engine, CORPUS, 24, lambda done, total: progress.append((done, total)))
    assert progress[-1] == (6, 6) and state.manifest["answers"] == 5 and state.manifest["tokens"] > 0
    assert engine.matrix.rows_filled == 0 and len(engine.hybrid.index) == 0  # learning leaves the engine cold
    assert state.rows.numel() == state.manifest["rows_filled"] > 0
    assert float(state.learned["hybrid"]["trials"].max()) <= warm.COUNT_CAP + 1e-9
    path = tmp_path / "w.safetensors"
    warm.save(state, path)
    fresh = tiny_engine()
    again = warm.read(path, fresh)
    warm.apply(fresh, again)
    assert fresh.matrix.rows_filled == state.manifest["rows_filled"]
    assert torch.equal(fresh.matrix.table[state.rows], state.table)
    assert (fresh.matrix.stamps == -1).all()  # written before any answer: rated as older rows
    assert torch.allclose(fresh.hybrid.hits, state.learned["hybrid"]["hits"])
    assert fresh.adaptive.trust.state() == state.learned["adaptive"]["trust"]
    prompt = fresh.encode_chat([{"role": "user", "content": "hello"}])  # ends as the corpus's prompts do
    cold = tiny_engine()
    plain = list(cold.generate(prompt, DecodeConfig(max_new_tokens=30, plain=True)))[-1].tokens
    steps = list(fresh.generate(prompt, DecodeConfig(max_new_tokens=30, template="2.2.2")))
    assert steps[-1].tokens == plain  # still lossless
    assert len(steps[0].tokens) > 1  # the paper's tree drafts at its first step, from the warm matrix
    fresh.forget()
    assert fresh.matrix.rows_filled == 0  # forget: back to empty, not to the warm state


def test_learning_averages_the_rows_and_calibrates_from_a_warm_matrix(monkeypatch):
    """Pass 2: every row that precedes an answer token is the average over the answers; pass 3: one prompt in
    CALIBRATE_EVERY is answered again from rows averaged over the other prompts' answers, after the older-row
    calibration of pass 1 is dropped, so the shipped older-row counts are those of warm first answers."""
    from tr_core.calibration import MATRIX_KEYS, N_BINS

    prompts = CORPUS + ["one more prompt", "and another", "the eighth prompt"]  # 8: two calibration answers
    engine = tiny_engine()
    answers: dict = {}
    decode = warm_build._decode

    def spy(engine, prompt, max_new_tokens, template, **kw):
        out = decode(engine, prompt, max_new_tokens, template, **kw)
        answers.setdefault(prompt, []).append((out[0], engine.matrix.rows_filled))
        return out

    monkeypatch.setattr(warm_build, "_decode", spy)
    calibrating: list[float] = []
    real_calibrate = warm_build.calibrate

    def watch(engine, held, max_new_tokens, tick, **kw):
        calibrating.append(float(engine.hybrid.trials[N_BINS:MATRIX_KEYS].sum()))
        done = real_calibrate(engine, held, max_new_tokens, tick, **kw)
        calibrating.append(float(engine.hybrid.trials[N_BINS:MATRIX_KEYS].sum()))
        return done

    monkeypatch.setattr(warm_build, "calibrate", watch)
    progress = []
    state = warm.learn(engine, prompts, 16, lambda done, total: progress.append((done, total)))
    held = prompts[::warm.CALIBRATE_EVERY]
    assert progress[-1] == (11, 11) and state.manifest["calibration_answers"] == 2
    assert [len(answers[p]) for p in prompts] == [2 if p in held else 1 for p in prompts]
    for p in held:  # greedy: the same answer again, and started from a matrix that was not empty
        (first, _), (again, filled) = answers[p]
        assert again == first and filled > 0
    assert calibrating[1] > 0  # the dropped older-row counts were learned again from warm answers
    rows, table, probs = warm.average_rows(engine.model, [answers[p][0][0] for p in prompts], TINY_VOCAB, 8)
    at = {r: i for i, r in enumerate(state.rows.tolist())}
    assert set(rows.tolist()) <= set(at)
    picked = torch.tensor([at[r] for r in rows.tolist()])
    assert torch.equal(state.table[picked], table) and torch.equal(state.probs[picked], probs)


def test_a_warm_start_of_another_model_or_a_tampered_file_is_refused(tmp_path):
    engine = tiny_engine()
    state = warm.learn(engine, CORPUS[:2], 12)
    path = tmp_path / "w.safetensors"
    warm.save(state, path)
    other = Engine(tiny_model("qwen2"), TinyTokenizer(TINY_VOCAB), tune_kernels=False)  # another network
    with pytest.raises(warm.WarmStartError, match="another model"):
        warm.read(path, other)
    with pytest.raises(warm.WarmStartError, match="not found"):
        warm.read(tmp_path / "missing.safetensors", engine)
    (tmp_path / "junk.safetensors").write_bytes(b"not a file at all")
    with pytest.raises(warm.WarmStartError, match="not a warm-start file"):
        warm.read(tmp_path / "junk.safetensors", engine)
    bad = warm.WarmState(rows=state.rows, table=state.table.clone(), probs=state.probs, learned=state.learned,
                         manifest=state.manifest)
    bad.table[0, 0] = TINY_VOCAB + 5
    warm.save(bad, tmp_path / "bad.safetensors")
    with pytest.raises(warm.WarmStartError, match="outside the vocabulary"):
        warm.read(tmp_path / "bad.safetensors", engine)
    before = engine.matrix.rows_filled
    hacked = dict(state.manifest, trust={"adaptive": {"factors": [9.0] * 5, "predicted": [0.0] * 5,
                                                      "realised": [0.0] * 5}, "hybrid": state.manifest["trust"]["hybrid"]})
    warm.save(warm.WarmState(state.rows, state.table, state.probs, state.learned, hacked), tmp_path / "t.safetensors")
    with pytest.raises(warm.WarmStartError, match="does not fit"):
        warm.apply(engine, warm.read(tmp_path / "t.safetensors", engine))
    assert engine.matrix.rows_filled == before  # refused before anything changed
    too_many = dict(state.manifest, rows_context_free=state.manifest["rows_filled"] + 1)
    warm.save(warm.WarmState(state.rows, state.table, state.probs, state.learned, too_many), tmp_path / "c.safetensors")
    with pytest.raises(warm.WarmStartError, match="more context-free rows than rows"):
        warm.read(tmp_path / "c.safetensors", engine)


def test_warm_start_learns_once_for_another_model_then_reuses_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TR_CACHE", str(tmp_path))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"category": "t", "prompt": p}) + "\n" for p in CORPUS))
    monkeypatch.setattr(warm, "CORPUS", corpus)
    monkeypatch.setattr(warm, "LEARN_PROMPTS", 3)
    monkeypatch.setattr(warm, "LEARN_TOKENS", 12)
    engine = tiny_engine()
    none = warm.warm_start(engine, "tiny-llama", learn=False)
    assert none.source == "none" and engine.matrix.rows_filled == 0 and none.describe().startswith("Cold start")
    calls = []
    info = warm.warm_start(engine, "tiny-llama", progress=lambda d, t: calls.append(d))
    assert info.source == "learned" and info.answers == 3 and calls == [1, 2, 3, 4]  # + 1 context-free forward
    assert info.path.startswith(str(tmp_path / "warm-start")) and engine.warm == info
    assert engine.matrix.rows_filled == info.rows_filled > 0
    again = warm.warm_start(tiny_engine(), "tiny-llama")
    assert again.source == "cached" and again.rows_filled == info.rows_filled
    assert "learned once for this model on 3 generated answers" in again.describe()


def test_the_shipped_warm_start_has_a_manifest_and_stays_small():
    if not warm.SHIPPED.is_file():
        pytest.skip("the warm start is not built in this checkout")
    assert warm.SHIPPED.stat().st_size < 3_000_000
    manifest = json.loads(warm.SHIPPED.with_suffix(".json").read_text())
    assert manifest["format"] == warm.FORMAT and manifest["corpus_sha256"] == warm.file_sha256(warm.CORPUS)
    assert manifest["answers"] == manifest["corpus_prompts"] >= 24  # every prompt it was given was answered
    assert manifest["rows_filled"] > 1000


def test_the_corpus_is_the_projects_own_not_the_benchmarks():
    prompts = warm.read_corpus()
    assert 200 <= len(prompts) <= 300
    from pathlib import Path

    data = Path(__file__).resolve().parents[1] / "bench" / "data"
    bench = " ".join(t.lower() for f in data.glob("*.jsonl") for line in f.read_text().splitlines() if line.strip()
                     for t in json.loads(line)["turns"])
    for prompt in prompts:
        words = prompt.lower().split()
        assert not any(" ".join(words[i:i + 8]) in bench for i in range(len(words) - 7)), prompt


def test_a_fresh_session_has_the_drafters_priors_and_keeps_the_machines_cost():
    engine = tiny_engine()
    list(engine.generate([5, 9, 17, 33, 5, 9], DecodeConfig(max_new_tokens=20, template="hybrid")))
    engine.hybrid.cost.ms[4] = 123.0  # stands for this machine's measured curve
    learned = engine.hybrid.trials.clone()
    warm.fresh_session(engine)
    assert engine.matrix.rows_filled == 0 and len(engine.hybrid.index) == 0 and engine.warm is None
    assert not torch.equal(engine.hybrid.trials, learned)  # back to the priors
    assert torch.equal(engine.hybrid.trials, type(engine.hybrid)(engine.device).trials)
    assert engine.hybrid.cost.ms[4] == 123.0


def test_the_command_line_starts_warm_by_default():
    from tr_core.cli import build_parser

    parser = build_parser()
    assert parser.parse_args(["generate", "--prompt", "x"]).warm_start == "auto"
    assert parser.parse_args(["generate", "--prompt", "x", "--warm-start", "off"]).warm_start == "off"
    bench = parser.parse_args(["bench", "--questions", "q.jsonl", "--fresh-sessions"])
    assert bench.warm_start == "auto" and bench.fresh_sessions


def test_average_rows_keeps_what_most_often_follows_each_token():
    """Each row: the candidates of highest summed probability over every place the token precedes an answer token,
    stored with their mean probability; checked against a direct count on a tiny model."""
    model = tiny_model("llama")
    k = 3
    answers = [([1, 5, 7], [9, 5, 2, 5]), ([3, 9], [5, 11, 9, 5]), ([4], [2])]
    rows, table, probs = warm.average_rows(model, answers, TINY_VOCAB, k)
    summed: dict[int, dict[int, float]] = {}
    seen: dict[int, int] = {}
    with torch.no_grad():
        for prompt, answer in answers:
            ids = prompt + answer
            p = torch.softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
            for pos in range(len(prompt) - 1, len(ids)):
                top, cand = p[pos, :TINY_VOCAB].topk(k)
                seen[ids[pos]] = seen.get(ids[pos], 0) + 1
                for c, v in zip(cand.tolist(), top.tolist()):
                    summed.setdefault(ids[pos], {})[c] = summed.setdefault(ids[pos], {}).get(c, 0.0) + v
    assert rows.tolist() == sorted(summed)  # 7, 9, 5, 2, 11, 4 ... each token that precedes an answer token
    for row, cands, stored in zip(rows.tolist(), table.tolist(), probs.tolist()):
        best = sorted(summed[row].items(), key=lambda item: -item[1])[:k]
        assert [c for c, _ in best] == cands
        assert stored == [round(v / seen[row] * 255) for _, v in best]
    assert seen[5] == 4 and len(set(table[rows.tolist().index(5)].tolist())) == k  # row 5: four places, averaged


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_context_free_rows_are_the_models_top_k_after_the_request_then_the_token(arch, monkeypatch):
    """Each row: the model's top-k after CONTEXT_FREE_REQUEST's prompt and the token, as one plain forward gives it,
    though many tokens go through one forward (siblings over one cache); gemma3's sliding layers see a prompt
    longer than their window."""
    from conftest import tiny_model

    monkeypatch.setattr(warm_build, "CONTEXT_FREE_REQUEST", " ".join(str(i) for i in range(2, 40)))
    monkeypatch.setattr(warm_build, "context_free_batch", lambda vocab: 7)  # several forwards, the last one short
    engine = Engine(tiny_model(arch), TinyTokenizer(TINY_VOCAB), tune_kernels=False)
    tokens = [5, 9, 2, 40, 77, 3, 11, 60, 8, 31]
    ticks = []
    rows, table, probs = warm.context_free_rows(engine, tokens, ticks.append)
    assert rows.tolist() == tokens and ticks == [1, 2] and table.dtype == torch.int32
    prompt = engine.encode_chat([{"role": "user", "content": warm_build.CONTEXT_FREE_REQUEST}])
    assert len(prompt) > 24  # past the sliding window
    with torch.no_grad():
        for i, t in enumerate(tokens):
            logits = engine.model(input_ids=torch.tensor([prompt + [t]])).logits[0, -1, :TINY_VOCAB].float()
            p, c = torch.softmax(logits, -1).topk(engine.matrix.k)
            assert table[i].tolist() == c.tolist()
            assert (probs[i].int() - (p * 255).round().int()).abs().max() <= 1


def test_learning_fills_the_rows_no_answer_wrote_with_context_free_guesses():
    """Rows that precede an answer token hold the averaged rows; the other rows of the 40 lowest ids, the model's
    context-free guess; the manifest counts those; context_free=0 leaves them out."""
    engine = tiny_engine()
    state = warm.learn(engine, CORPUS[:2], 12, context_free=40)
    answers = [warm_build._decode(tiny_engine(), p, 12, "hybrid")[0] for p in CORPUS[:2]]  # greedy: the same answers
    averaged = warm.average_rows(engine.model, answers, TINY_VOCAB, 8)
    at = {r: i for i, r in enumerate(state.rows.tolist())}
    guessed = sorted(set(range(40)) - set(averaged[0].tolist()))
    assert guessed and state.manifest["rows_context_free"] == len(guessed)
    free = warm.context_free_rows(engine, guessed)
    assert torch.equal(state.table[[at[r] for r in guessed]], free[1])
    assert torch.equal(state.table[[at[r] for r in averaged[0].tolist()]], averaged[1])
    none = warm.learn(tiny_engine(), CORPUS[:2], 12, context_free=0)
    assert none.manifest["rows_context_free"] == 0 and not set(guessed) <= set(none.rows.tolist())
    info = warm.WarmStartInfo("shipped", 2, 24, len(at), "", context_free=len(guessed))
    assert f"{len(guessed)} more rows hold the model's guess after the token alone" in info.describe()


def test_the_warm_starts_answers_are_a_library_the_hybrid_copies_from_losslessly(tmp_path):
    from tr_core.context import LIBRARY

    engine = tiny_engine()
    state = warm.learn(engine, CORPUS, 24)
    assert state.manifest["library_answers"] == len(state.library) == state.manifest["answers"]
    assert state.manifest["library_tokens"] == sum(map(len, state.library)) == state.manifest["tokens"]
    answer = list(range(50, 74))  # a run no tiny answer holds (they loop over a few ids): its copies stand out
    warm.with_library(state, state.library + [answer])
    path = tmp_path / "w.safetensors"
    warm.save(state, path)
    fresh = tiny_engine()
    info = warm.warm_from_file(fresh, path)
    assert fresh.hybrid.library is not None and fresh.hybrid.library.answers == len(state.library) == info.library
    assert "copies runs from those answers" in info.describe()
    # the conversation ends with the start of a library answer: the hybrid finds its continuation there
    prompt = fresh.encode_chat([{"role": "user", "content": "hello"}]) + answer[:6]
    fresh.hybrid.index.extend(prompt)
    found = [m for m in fresh.hybrid.lookup() if m.where == LIBRARY]
    assert found and found[0].tokens == tuple(answer[6:6 + len(found[0].tokens)])
    fresh.hybrid.index.clear()
    from tr_core.hybrid import CTX_KEY, EARLIER, N_KEYS  # rate runs from outside the conversation as sure: drafted
    learned = fresh.hybrid.learned()
    learned["hits"][CTX_KEY + EARLIER:N_KEYS] = learned["trials"][CTX_KEY + EARLIER:N_KEYS]
    fresh.hybrid.take_learned(learned)
    plain = list(tiny_engine().generate(prompt, DecodeConfig(max_new_tokens=24, plain=True)))[-1].tokens
    events = list(fresh.generate(prompt, DecodeConfig(max_new_tokens=24, template="hybrid-fixed")))
    assert events[-1].tokens == plain  # lossless
    origins = [o for ev in events[:-1] for o in (ev.origins or [])]
    assert any(o is not None and o["where"] == LIBRARY for o in origins), "no draft was copied from the library"
    snap = fresh.snapshot()
    assert snap["drafters"][1].library is fresh.hybrid.library  # shared, not copied
    fresh.forget()
    assert fresh.hybrid.library is None  # forget: no warm knowledge left


@pytest.mark.parametrize("change", ["id outside the vocabulary", "lengths not adding up", "zero length",
                                    "tokens without lengths", "float tokens"])
def test_a_tampered_library_is_refused(tmp_path, change):
    from safetensors.torch import load_file, save_file

    engine = tiny_engine()
    state = warm.learn(engine, CORPUS[:2], 12)
    warm.save(state, tmp_path / "w.safetensors")
    tensors = load_file(str(tmp_path / "w.safetensors"))
    tokens, lengths = tensors["library.tokens"], tensors["library.lengths"]
    if change == "id outside the vocabulary":
        tokens[0] = TINY_VOCAB
    elif change == "lengths not adding up":
        lengths[0] += 1
    elif change == "zero length":
        tensors["library.lengths"] = torch.cat([lengths, torch.zeros(1, dtype=torch.int32)])
    elif change == "tokens without lengths":
        del tensors["library.lengths"]
    else:
        tensors["library.tokens"] = tokens.float()
    from safetensors import safe_open

    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        meta = f.metadata()
    save_file(tensors, str(tmp_path / "t.safetensors"), metadata=meta)
    with pytest.raises(warm.WarmStartError, match="library"):
        warm.read(tmp_path / "t.safetensors", engine)


def test_engines_started_from_one_warm_state_share_its_library():
    state = warm.with_library(warm.learn(tiny_engine(), CORPUS[:2], 12), [[50, 51, 52], [53, 54]])
    a, b = tiny_engine(), tiny_engine()
    warm.apply(a, state)
    warm.apply(b, state)
    assert a.hybrid.library is b.hybrid.library and a.hybrid.library.answers == 2


# -- issue 53: a time budget for learning, and the studio lending its decode slot meanwhile -------------------------
def _small_corpus(tmp_path, monkeypatch, prompts: int = 5) -> None:
    monkeypatch.setenv("TR_CACHE", str(tmp_path))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"category": "t", "prompt": p}) + "\n" for p in CORPUS))
    monkeypatch.setattr(warm, "CORPUS", corpus)
    monkeypatch.setattr(warm, "LEARN_PROMPTS", prompts)
    monkeypatch.setattr(warm, "LEARN_TOKENS", 12)


def _answers_take(monkeypatch, seconds: float) -> tuple[list[float], list[str]]:
    """A fake monotonic clock that moves `seconds` per corpus answer decoded; and the prompts decoded."""
    now, decoded = [0.0], []
    decode = warm_build._decode

    def timed(engine, prompt, max_new_tokens, template, **kw):
        out = decode(engine, prompt, max_new_tokens, template, **kw)
        now[0] += seconds
        decoded.append(prompt)
        return out

    monkeypatch.setattr(warm_build, "_decode", timed)
    return now, decoded


def test_a_budget_stops_learning_early_the_partial_start_is_applied_and_a_full_learn_replaces_it(
        tmp_path, monkeypatch):
    _small_corpus(tmp_path, monkeypatch)
    now, decoded = _answers_take(monkeypatch, 10.0)
    clock = lambda: now[0]  # noqa: E731
    engine = tiny_engine()
    # answers stop at ANSWERS_SHARE (0.75) of 40 s, none started when the last one's time would pass it: 3 of 5
    info = warm.warm_start(engine, "tiny-llama", budget_s=40.0, clock=clock)
    assert info.source == "learned" and info.partial and (info.answers, info.of, info.seconds) == (3, 5, 30.0)
    assert len(decoded) == 3 and engine.warm == info and engine.matrix.rows_filled == info.rows_filled > 0
    assert info.context_free > 0  # the context-free rows came first, within their share
    assert "from 3 of 5 generated answers in 30 s, learned in part" in info.describe()
    manifest = warm.read(info.path, engine).manifest
    assert manifest["partial"] is True and manifest["corpus_answers"] == 5 and manifest["budget_s"] == 40.0
    # with a budget, the cached partial one is taken at once
    cached = warm.warm_start(tiny_engine(), "tiny-llama", budget_s=40.0, clock=clock)
    assert cached.source == "cached" and cached.partial and len(decoded) == 3
    assert "learned once for this model from 3 of 5 generated answers" in cached.describe()
    assert warm.warm_start(tiny_engine(), "tiny-llama", learn=False).partial  # nothing learned without leave
    # without one, the full warm start is learned in its place, and then taken by everyone
    full = warm.warm_start(tiny_engine(), "tiny-llama", clock=clock)
    assert full.source == "learned" and not full.partial and full.answers == 5 and len(decoded) == 8
    again = warm.warm_start(tiny_engine(), "tiny-llama", budget_s=40.0, clock=clock)
    assert again.source == "cached" and not again.partial and again.answers == 5 and len(decoded) == 8


def test_the_budget_also_cuts_the_context_free_rows_and_the_calibration(monkeypatch):
    monkeypatch.setattr(warm_build, "context_free_batch", lambda vocab: 7)
    now = [0.0]
    pace = warm.Pace(40.0, lambda: now[0], between=lambda: now.__setitem__(0, now[0] + 10.0))  # 10 s a forward
    rows, table, _ = warm.context_free_rows(tiny_engine(), list(range(20)), pace=pace)
    assert rows.tolist() == list(range(7)) and table.shape[0] == 7 and pace.cut  # 0.3 x 40 s: one forward
    prompts = CORPUS + ["one more prompt", "and another", "the eighth prompt"]  # 8: two calibration answers
    now, decoded = _answers_take(monkeypatch, 10.0)
    state = warm.learn(tiny_engine(), prompts, 12, context_free=0, pace=warm.Pace(1000.0, lambda: now[0]))
    assert state.manifest["calibration_answers"] == 2 and not state.manifest["partial"]
    calibrate = warm_build.calibrate

    def late(*args, **kw):  # the eight answers took 95 s: room for one calibration answer of 10 s in 110
        now[0] = 95.0
        return calibrate(*args, **kw)

    monkeypatch.setattr(warm_build, "calibrate", late)
    now[0] = 0.0
    state = warm.learn(tiny_engine(), prompts, 12, context_free=0, pace=warm.Pace(110.0, lambda: now[0]))
    assert state.manifest["answers"] == 8 and state.manifest["calibration_answers"] == 1
    assert state.manifest["partial"] and state.manifest["learn_s"] == 105.0


def test_the_command_line_learns_a_partial_warm_start_by_default_and_the_full_one_on_request(monkeypatch, capsys):
    from tr_core.cli import build_parser
    from tr_core.cli.options import apply_warm_start

    parser = build_parser()
    assert parser.parse_args(["generate", "--prompt", "x", "--warm-start", "learn"]).warm_start == "learn"
    asked = []

    def fake(engine, name, budget_s=None, progress=None, **kw):
        asked.append(budget_s)
        progress(1, 10)
        return warm.WarmStartInfo("learned", 3, 30, 100, "/c/w.safetensors", partial=budget_s is not None, of=48,
                                  seconds=44.0)

    monkeypatch.setattr(warm, "warm_start", fake)
    info = apply_warm_start("auto", object(), "some/model")
    err = capsys.readouterr().err
    assert asked == [warm.FIRST_ANSWER_BUDGET_S] and info.partial
    assert "learning a partial one for at most 45 s" in err and "from 3 of 48 generated answers in 44 s" in err
    assert "`--warm-start learn` learns the full one" in err
    info = apply_warm_start("learn", object(), "some/model")
    err = capsys.readouterr().err
    assert asked[-1] is None and not info.partial and "partial" not in err


def test_the_studio_lends_the_decode_slot_while_it_learns_then_learns_the_full_one_in_the_background(
        tmp_path, monkeypatch):
    import threading

    from test_app import studio_for

    from studio import handlers as h
    from studio.session import DECODE_SLOT

    _small_corpus(tmp_path, monkeypatch, prompts=3)
    now, decoded = _answers_take(monkeypatch, 10.0)
    monkeypatch.setattr(warm, "FIRST_ANSWER_BUDGET_S", 30.0)  # 0.75 x 30 s: two answers of three
    monkeypatch.setattr(warm, "Pace", lambda budget_s, clock, between: warm_build.Pace(budget_s, lambda: now[0],
                                                                                       between))
    model = tiny_model("llama")
    studio = studio_for()
    studio.catalog._loader = lambda name: (model, TinyTokenizer(TINY_VOCAB))
    monkeypatch.setattr("studio.decode_loop.HANDOFF_S", 0.02)  # a slow machine's visitor still gets its turn
    returned, learned, got = threading.Event(), threading.Event(), []
    learn_and_cache = warm._learn_and_cache

    def learning(*args):
        try:
            return learn_and_cache(*args)
        finally:
            learned.set()

    monkeypatch.setattr(warm, "_learn_and_cache", learning)

    def other_visitor() -> None:  # wants the slot while the warm start is learned
        while not returned.is_set():
            if DECODE_SLOT.acquire(timeout=0.01):
                got.append(learned.is_set())
                DECODE_SLOT.release()
                return

    visitor = threading.Thread(target=other_visitor, daemon=True)
    timed = warm_build._decode

    def first(*args, **kw):  # the learner holds the slot here: the visitor waits for it to be lent
        if not visitor.is_alive() and not got:
            visitor.start()
        return timed(*args, **kw)

    monkeypatch.setattr(warm_build, "_decode", first)
    engine = h.new_engine(studio, "tiny-m", 8)
    returned.set()
    visitor.join(10)
    assert got == [False], "no other visitor got the decode slot while the warm start was learned"
    assert engine.warm.partial and engine.warm.answers == 2 and engine.warm.of == 3
    assert "from 2 of 3 generated answers" in h._WARM_STARTS[engine][1]
    background = warm._BACKGROUND["tiny-m"]  # after the partial one: the full one, cached for the next sessions
    background.join(120)
    assert not background.is_alive() and len(decoded) == 2 + 3
    info = warm.warm_start(tiny_engine(), "tiny-m", budget_s=30.0)
    assert info.source == "cached" and not info.partial and info.answers == 3


def test_an_answer_running_when_the_budget_runs_out_ends_early_and_still_counts():
    now = [0.0]
    pace = warm.Pace(10.0, lambda: now[0], between=lambda: now.__setitem__(0, now[0] + 1.0))  # 1 s a step
    engine = tiny_engine()
    answers, steps = warm.decode_answers(engine, CORPUS[:2], 40, lambda i: None, pace)
    assert list(answers) == [0] and steps == 7 and pace.cut  # stopped once 7.5 s of 10 were spent
    full = warm_build._decode(tiny_engine(), CORPUS[0], 40, "hybrid")[0][1]
    assert len(answers[0][1]) < len(full) and full[:len(answers[0][1])] == answers[0][1]  # greedy: a prefix
