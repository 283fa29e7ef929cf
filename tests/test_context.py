"""The context index and the hybrid drafter's merge: plain data, checked against brute force."""
from __future__ import annotations

import random
import sys
import time

import pytest
import torch

from present.reasons import origin_text
from tr_core.context import ANSWER, MAX_MATCH, PROMPT, ContextIndex
from tr_core.hybrid import BOTH_KEY, CTX_KEY, EARLIER, EARLIER_ANSWER, EARLIER_WEIGHT, HybridDrafter, Plan, context_key


def brute_force(stream: list[int], max_n: int) -> dict[int, int]:
    """First token of each continuation of the stream's suffix -> longest n-gram match (n <= max_n) giving it."""
    best: dict[int, int] = {}
    size = len(stream)
    for end in range(size - 1):  # an occurrence ending at `end` with a continuation
        n = 0
        while n < max_n and end - n >= 0 and stream[end - n] == stream[size - 1 - n]:
            n += 1
        if n:
            nxt = stream[end + 1]
            best[nxt] = max(best.get(nxt, 0), n)
    return best


def test_lookup_finds_the_longest_match_first_and_names_its_segment():
    ix = ContextIndex()
    ix.start_segment(PROMPT)
    ix.extend([5, 1, 2, 3, 4, 9, 9, 2, 3, 7])
    ix.start_segment(ANSWER)
    ix.extend([8, 1, 2, 3])
    found = ix.lookup(max_matches=3, max_len=4)
    assert found[0].tokens == (4, 9, 9, 2) and found[0].match_len == 3  # "1 2 3" matched, then 4 followed
    assert found[0].where == "prompt" and found[0].offset == 4
    assert found[0].origin(2) == {"where": "prompt", "first": 4, "last": 5, "match": 3}  # data; the views word it
    assert origin_text(found[0].origin(2)) == \
        "copied from the prompt, its 6th token, in a run from its 5th (after a 3-token match)"
    assert origin_text(found[0].origin(1)) == "copied from the prompt, its 5th token (after a 3-token match)"
    assert found[1].tokens[0] == 7 and found[1].match_len == 2  # "2 3" matched, then 7 followed
    assert not found[0].contested and found[1].contested  # "2 3" was followed by 4 and by 7
    assert len({m.tokens[0] for m in found}) == len(found)  # one match per first token


@pytest.mark.parametrize("seed", range(20))
def test_lookup_agrees_with_brute_force(seed):
    rng = random.Random(seed)
    ix = ContextIndex(max_n=3, chain=10_000)
    stream: list[int] = []
    for _ in range(30):
        chunk = [rng.randrange(6) for _ in range(rng.randrange(1, 5))]
        ix.extend(chunk)
        stream += chunk
        truth = brute_force(stream, 3)
        found = ix.lookup(max_matches=100, max_len=3)
        assert {m.tokens[0] for m in found} == set(truth)
        for m in found:
            n = truth[m.tokens[0]]
            assert min(m.match_len, 3) == n
            assert list(m.tokens) == stream[m.position : m.position + 3]
            followers = {stream[e + 1] for e in range(n - 1, len(stream) - 1) if stream[e - n + 1 : e + 1] == stream[-n:]}
            assert m.contested == (len(followers) > 1)  # the matched n-gram had other continuations
        lengths = [min(m.match_len, 3) for m in found]
        assert lengths == sorted(lengths, reverse=True)  # longest n-gram first


def test_memory_is_bounded_and_eviction_keeps_positions_and_offsets():
    ix = ContextIndex(max_tokens=64)
    ix.start_segment(PROMPT)
    ix.extend(list(range(100, 140)))
    ix.start_segment(ANSWER)
    for t in range(60):
        ix.extend([t % 7])
        assert len(ix) <= 64
    snap = ix.snapshot()
    assert snap["base"] + len(snap["stream"]) == 100  # every token ever added is counted
    label, start, length, skipped = snap["segments"][0]
    assert start == snap["base"] and start + length <= 100
    ix.extend([3, 4])  # 3 4 followed by 5 before: the answer repeats 0..6
    m = ix.lookup()[0]
    assert m.tokens[0] == 5 and m.where == ANSWER
    assert m.offset == m.position - 40  # offsets count from the segment's first token, evicted ones included


def test_lookup_and_append_cost_is_small():
    rng = random.Random(0)
    ix = ContextIndex()
    tokens = [rng.randrange(3000) for _ in range(20_000)]
    t0 = time.perf_counter()
    ix.extend(tokens)
    append_us = (time.perf_counter() - t0) / len(tokens) * 1e6
    t0 = time.perf_counter()
    for _ in range(200):
        ix.lookup(3, 16)
    lookup_us = (time.perf_counter() - t0) / 200 * 1e6
    print(f"context index: append {append_us:.1f} us/token, lookup {lookup_us:.1f} us", file=sys.stderr)
    assert ix.snapshot()["grams"][0] <= 3000


def _grown(tokens, parents, bins):
    n = len(tokens)
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    return {"tokens": tokens, "parents": parents, "depths": depths, "ranks": [0] + [i % 8 for i in range(1, n)],
            "bins": bins}


def test_merge_shares_nodes_where_sources_agree_and_scores_follow_the_path():
    d = HybridDrafter(torch.device("cpu"))
    ix = ContextIndex()
    ix.extend([1, 2, 3, 4, 5, 6, 1, 2])  # suffix "1 2" was followed by 3 4 5 6
    grown = _grown([2, 3, 7, 9], [0, 0, 0, 1], [0, 15, 3, 8])  # root 2 -> 3 (-> 9), 7
    plan = d.merge(grown, ix.lookup(3, 4))
    assert plan.sources[:4] == ["root", "both", "matrix", "matrix"]
    assert plan.tokens[4:] == [4, 5, 6] and plan.sources[4:] == ["context"] * 3
    assert plan.parents[4:] == [1, 4, 5]  # the copied run continues under the shared node
    assert plan.keys[1] == context_key(2, shared=True) == BOTH_KEY + 1
    assert plan.keys[4] == CTX_KEY + 2  # its match is one token longer once "3" was accepted
    assert plan.origins[5] == {"where": "context", "first": 2, "last": 4, "match": 2}
    assert origin_text(plan.origins[5]) == \
        "copied from the context, its 5th token, in a run from its 3rd (after a 2-token match)"
    assert plan.origins[:4] == [None, plan.origins[1], None, None] and plan.origins[1]["where"] == "context"
    rate = d.rate_host
    assert plan.scores[5] == pytest.approx(rate[plan.keys[1]] * rate[plan.keys[4]] * rate[plan.keys[5]])
    keep = plan.best(3)
    assert all(plan.parents[i] in keep for i in keep[1:])  # any prefix by score is a tree
    draft = d.take_plan(plan, keep)
    assert draft.size == 4 and draft.sources[0] == "root"
    tokens = draft.tokens.tolist()
    assert len(set(zip(draft.parents.tolist()[1:], tokens[1:]))) == 3  # siblings distinct


def test_runs_found_in_an_earlier_conversation_are_calibrated_apart():
    d = HybridDrafter(torch.device("cpu"))
    ix = ContextIndex()
    ix.start_segment(EARLIER_ANSWER)
    ix.extend([1, 2, 3, 4])
    ix.start_segment(PROMPT)
    ix.extend([7, 1, 2])  # the suffix "1 2" was followed by 3 4 in an earlier answer
    plan = d.merge(_grown([2, 9], [0, 0], [0, 3]), ix.lookup(3, 4))
    node = plan.tokens.index(3)
    assert plan.sources[node] == "context" and plan.origins[node]["where"] == EARLIER_ANSWER
    assert plan.keys[node] == context_key(2, shared=False, earlier=True) == CTX_KEY + EARLIER + 1
    assert d.rate_host[plan.keys[node]] == pytest.approx(EARLIER_WEIGHT * d.rate_host[CTX_KEY + 1])


def test_calibration_learns_per_source():
    d = HybridDrafter(torch.device("cpu"))
    before = d.rate_host[CTX_KEY + MAX_MATCH - 1]
    key = CTX_KEY + MAX_MATCH - 1
    for _ in range(50):  # a long-match context node under an accepted root, never accepted
        d.learn([-1, 0], [0, key], [0])
    assert d.rate_host[key] < before / 3
    assert d.rate_host[BOTH_KEY] == pytest.approx(_prior(d, BOTH_KEY))


def test_calibration_learns_from_candidates_left_out_of_the_draft():
    """A zero-draft step still tests the plan's first level against the emitted token (greedy's verdict)."""
    from tr_core.drafters import StepResult

    d = HybridDrafter(torch.device("cpu"))
    ix = ContextIndex()
    ix.extend([1, 2, 3, 1])  # suffix "1" was followed by 2 3
    grown = _grown([1, 9, 8], [0, 0, 0], [0, 15, 3])  # the matrix proposes 9 and 8 after the root
    d.plan = d.merge(grown, ix.lookup(3, 4))
    d.kept = [0]  # a plain step: only the root was verified
    ctx = d.plan.keys[d.plan.tokens.index(2)]
    trials, hits = d.trials.clone(), d.hits.clone()
    d.learn_verified(StepResult(parents=[-1], accepted=[0], emitted=[2], forward_tokens=1, forward_ms=1.0,
                                step_ms=1.0, extras={"bins": [0]}))
    assert d.trials[ctx] == trials[ctx] + 1 and d.hits[ctx] == hits[ctx] + 1  # the copy was right
    assert d.trials[15] == trials[15] + 1 and d.hits[15] == hits[15]  # the matrix's 9 was not
    assert d.trials[3] == trials[3] + 1 and d.hits[3] == hits[3]
    depth2 = d.plan.tokens.index(3)  # under the copied 2: untested, its parent was never verified as accepted
    assert d.trials[d.plan.keys[depth2]] == trials[d.plan.keys[depth2]]


def _prior(d, key):
    return float(d.hits[key] / d.trials[key])


# -- the hybrid drafter in the engine ---------------------------------------------------------------------------

def _engine():
    from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

    from tr_core import Engine

    return Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))


def test_hybrid_drafts_from_the_context_and_indexes_prompts_and_answers():
    from tr_core import DecodeConfig, StepEvent

    engine = _engine()
    assert engine.drafter_for(DecodeConfig(template="hybrid")) is engine.hybrid
    assert engine.drafter_for(DecodeConfig(template="hybrid-fixed")) is engine.hybrid
    run = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    prompt = run * 3
    events = list(engine.generate(prompt, DecodeConfig(template="hybrid-fixed", max_new_tokens=30)))
    steps = [e for e in events if isinstance(e, StepEvent)]
    assert all(e.sources[0] == "root" and len(e.sources) == len(e.tokens) == len(e.origins) for e in steps)
    retrieved = [(e, i) for e in steps for i, s in enumerate(e.sources) if s in ("context", "both")]
    assert retrieved, "a prompt that repeats itself must give retrieved drafts"
    e, i = retrieved[0]
    assert e.origins[i]["where"] == "prompt" and e.origins[i]["first"] <= e.origins[i]["last"] < len(prompt)
    assert all((o is None) == (s in ("root", "matrix")) for e in steps for o, s in zip(e.origins, e.sources))
    assert all(e.ranks[i] >= engine.matrix.k for e in steps for i, s in enumerate(e.sources) if s == "context")
    segments = engine.hybrid.index.snapshot()["segments"]
    assert [s[0] for s in segments] == ["prompt", "answer"]
    assert segments[0][2] == len(prompt) and segments[1][2] == len(events[-1].tokens)
    list(engine.generate([5, 6, 7], DecodeConfig(template="hybrid", max_new_tokens=4)))
    labels = [s[0] for s in engine.hybrid.index.snapshot()["segments"]]
    assert labels == ["earlier_prompt", "earlier_answer", "prompt", "answer"]
    engine.forget()  # the matrix and the index; calibration and costs stay
    assert len(engine.hybrid.index) == 0 and engine.matrix.rows_filled == 0


def test_costs_never_observed_follow_the_observed_scale():
    from tr_core.cost import ForwardCost

    cost = ForwardCost()
    cost.set_measured({n: [10.0 * n] for n in (1, 2, 4, 8, 16)}, max_tokens=16)
    for _ in range(100):
        cost.observe(2, 30.0)  # whole steps cost 1.5x the probed forwards
    assert cost(2) == pytest.approx(30.0, rel=0.01)
    assert cost(16) == pytest.approx(240.0, rel=0.02)  # never observed: probe x the observed scale
    assert cost.ms[1] == pytest.approx(15.0, rel=0.02)


def test_zero_draft_steps_skip_the_tree_and_grow_a_small_one():
    d = HybridDrafter(torch.device("cpu"))
    d.sized_by_cost, d.next_size = True, 0
    assert d.growth() == (8, 3)
    d.next_size = 30
    assert d.growth() == (68, 8)


def test_a_zero_draft_plan_drafts_the_root_alone_as_the_general_path_would():
    """take_plan's shortcut for the root alone gives the Draft the general path builds, field for field."""
    d = HybridDrafter(torch.device("cpu"))
    plan = Plan(tokens=[5, 6, 7], parents=[0, 0, 1], depths=[0, 1, 2], ranks=[0, 0, 0], keys=[0, 3, 4],
                sources=["root", "matrix", "matrix"], origins=[None] * 3, scores=[1.0, 0.5, 0.2])
    fast, general = d.take_plan(plan, [0], torch.tensor([5])), d.take_plan(plan, [0])
    for name in ("tokens", "parents", "depths", "ranks", "tree_mask", "node_probs"):
        a, b = getattr(fast, name), getattr(general, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert fast.extras.keys() == general.extras.keys() and torch.equal(fast.extras["bins"], general.extras["bins"])
    assert (fast.size, fast.levels, fast.sources, fast.origins) == (general.size, general.levels, general.sources,
                                                                  general.origins)


def test_a_library_continues_the_conversations_suffix_within_one_answer():
    import copy

    from tr_core.context import LIBRARY, Library

    lib = Library([[1, 2, 3, 4, 5], [9, 2, 3, 7], [2, 3]])
    assert lib.answers == 3 and len(lib) == 11
    found = lib.continuations([8, 9, 2, 3], 3, 16, set())
    # the longest match first (9 2 3 -> 7, uncontested), then the 2-gram's other continuation; the third answer
    # ends at "2 3": no continuation there, and none runs into the next answer
    assert [(m.tokens, m.match_len, m.contested) for m in found] == [((7,), 3, False), ((4, 5), 2, True)]
    assert found[0].where == LIBRARY == "warm_start" and found[0].origin(1) == \
        {"where": LIBRARY, "first": 3, "last": 3, "match": 3}
    assert origin_text(found[0].origin(1)) == "copied from a sample answer learned beforehand, its 4th token (after a 3-token match)"
    assert [m.tokens for m in lib.continuations([8, 2, 3], 3, 16, {7})] == [(4, 5)]  # a first token found already
    assert lib.continuations([8, 3], 3, 16, set()) == []  # 1-token matches are not used (min_n = 2)
    assert [m.tokens for m in lib.continuations([8, 3], 3, 16, set(), min_n=1)] == [(7,), (4, 5)]
    assert copy.deepcopy({"lib": lib})["lib"] is lib  # shared by engine snapshots, never copied
