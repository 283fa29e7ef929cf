"""The context index and the hybrid drafter's merge: plain data, checked against brute force."""
from __future__ import annotations

import random
import sys
import time

import pytest
import torch

from tr_core.context import MAX_MATCH, ContextIndex
from tr_core.hybrid import BOTH_KEY, CTX_KEY, HybridDrafter, context_key


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
    ix.start_segment("the prompt")
    ix.extend([5, 1, 2, 3, 4, 9, 9, 2, 3, 7])
    ix.start_segment("this answer")
    ix.extend([8, 1, 2, 3])
    found = ix.lookup(max_matches=3, max_len=4)
    assert found[0].tokens == (4, 9, 9, 2) and found[0].match_len == 3  # "1 2 3" matched, then 4 followed
    assert found[0].where == "the prompt" and found[0].offset == 4
    assert found[0].describe(2) == "copied from the prompt, tokens 5-6 (after a 3-token match)"
    assert found[1].tokens[0] == 7 and found[1].match_len == 2  # "2 3" matched, then 7 followed
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
            assert min(m.match_len, 3) == truth[m.tokens[0]]
            assert list(m.tokens) == stream[m.position : m.position + 3]
        lengths = [min(m.match_len, 3) for m in found]
        assert lengths == sorted(lengths, reverse=True)  # longest n-gram first


def test_memory_is_bounded_and_eviction_keeps_positions_and_offsets():
    ix = ContextIndex(max_tokens=64)
    ix.start_segment("the prompt")
    ix.extend(list(range(100, 140)))
    ix.start_segment("this answer")
    for t in range(60):
        ix.extend([t % 7])
        assert len(ix) <= 64
    snap = ix.snapshot()
    assert snap["base"] + len(snap["stream"]) == 100  # every token ever added is counted
    label, start, length, skipped = snap["segments"][0]
    assert start == snap["base"] and start + length <= 100
    ix.extend([3, 4])  # 3 4 followed by 5 before: the answer repeats 0..6
    m = ix.lookup()[0]
    assert m.tokens[0] == 5 and m.where == "this answer"
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
    assert plan.origins[5] == "copied from the context, tokens 3-5 (after a 2-token match)"
    rate = d.rate_host
    assert plan.scores[5] == pytest.approx(rate[plan.keys[1]] * rate[plan.keys[4]] * rate[plan.keys[5]])
    keep = plan.best(3)
    assert all(plan.parents[i] in keep for i in keep[1:])  # any prefix by score is a tree
    draft = d.take_plan(plan, 3)
    assert draft.size == 4 and draft.sources[0] == "root"
    tokens = draft.tokens.tolist()
    assert len(set(zip(draft.parents.tolist()[1:], tokens[1:]))) == 3  # siblings distinct


def test_calibration_learns_per_source():
    d = HybridDrafter(torch.device("cpu"))
    before = d.rate_host[CTX_KEY + MAX_MATCH - 1]
    key = CTX_KEY + MAX_MATCH - 1
    for _ in range(50):  # a long-match context node under an accepted root, never accepted
        d.learn([-1, 0], [0, key], [0])
    assert d.rate_host[key] < before / 3
    assert d.rate_host[BOTH_KEY] == pytest.approx(_prior(d, BOTH_KEY))


def _prior(d, key):
    return float(d.hits[key] / d.trials[key])
