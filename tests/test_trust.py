"""The trust factor of cost-sized trees, judged in hindsight on every step's tree (tr_core/trust.py)."""
from __future__ import annotations

import pytest
import torch

from tr_core.trust import TRUST_PRIOR, HindsightTrust, class_sizes, realised_counts, size_class

# A hand tree: root -> 10 (rank 1), 11 (rank 2); 10 -> 12 (rank 3); 12 -> 13 (rank 4)
TOKENS, PARENTS, ORDER = [0, 10, 11, 12, 13], [0, 0, 0, 1, 3], [1, 2, 3, 4]
CURVE = [0.0, 0.6, 0.9, 1.3, 1.5]


def test_size_classes_and_realised_counts():
    assert [size_class(m) for m in (1, 2, 3, 5, 6, 11, 12, 23, 24, 80)] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert list(class_sizes(0, 80)) == [1, 2] and list(class_sizes(2, 8)) == [6, 7, 8]
    assert list(class_sizes(4, 30)) == list(range(24, 31)) and not class_sizes(3, 11)
    # the path matched nodes ranked 1 and 3: one node drafts 1 accepted, two nodes still 1, three nodes 2
    assert realised_counts([1, 3], 4) == [0, 1, 1, 2, 2]
    assert realised_counts([2, 5], 4) == [0, 0, 1, 1, 1]  # rank 5 lies outside every size of this tree
    assert realised_counts([], 3) == [0, 0, 0, 0]


def test_a_tree_is_judged_once_its_path_breaks_and_folds_per_class():
    trust = HindsightTrust()
    trust.watch(TOKENS, PARENTS, ORDER, CURVE)
    trust.extend([10])  # the path goes on: 10 then maybe 12
    assert len(trust.watched) == 1 and trust.factors == [1.0] * 5
    trust.extend([12, 99])  # 12 matched, 99 matches no child of 12: settled with path ranks 1, 3
    assert not trust.watched
    # class 0 holds sizes 1-2: predicted (0.6 + 0.9) / 2, realised (1 + 1) / 2; class 1 holds sizes 3-4
    assert trust.factors[0] == pytest.approx((1.0 + TRUST_PRIOR) / (0.75 + TRUST_PRIOR))
    assert trust.factors[1] == pytest.approx((2.0 + TRUST_PRIOR) / (1.4 + TRUST_PRIOR))
    assert trust.factors[2:] == [1.0, 1.0, 1.0]  # no sizes of those classes in a 4-node tree


def test_steps_that_draft_nothing_teach_the_trust_both_ways():
    """The trust needs no failing drafts to learn that drafting fails, and no retries to learn it pays again."""
    trust = HindsightTrust()
    for _ in range(60):  # every tree would have failed: the model never emits what the tree proposes
        trust.watch(TOKENS, PARENTS, ORDER, CURVE)
        trust.extend([7])
    assert max(trust.factors[:2]) < 0.15
    for _ in range(60):  # the model now follows the tree's best path: 10 12 13, then something else
        trust.watch(TOKENS, PARENTS, ORDER, CURVE)
        trust.extend([10, 12, 13, 7])
    assert trust.factors[0] > 1.0 and trust.factors[1] > 1.2


def test_a_new_answer_settles_the_trees_still_open():
    trust = HindsightTrust()
    trust.watch(TOKENS, PARENTS, ORDER, CURVE)
    trust.extend([10, 12])  # still matching when the answer ends
    trust.start_answer()
    assert not trust.watched and not trust.stream
    assert trust.factors[1] == pytest.approx((2.0 + TRUST_PRIOR) / (1.4 + TRUST_PRIOR))


def test_the_trust_steers_the_size_choice():
    from tr_core.hybrid import HybridDrafter

    d = HybridDrafter(torch.device("cpu"))
    d.cost.ms = {n: 10.0 + n for n in d.cost.ms}  # drafting pays if expected accepted > (t(m+1) - t(1)) / t(1)
    curve = [0.0, 0.5, 0.9, 1.2, 1.4]
    assert d.choose_size(curve, budget=4) == 4
    d.trust.factors = [1.0, 0.1, 1.0, 1.0, 1.0]  # sizes 3-5 realised a tenth of their prediction
    assert d.choose_size(curve, budget=4) == 2  # the overestimated class is avoided, not every size
    d.trust.factors = [0.1] * 5
    assert d.choose_size(curve, budget=4) == 0


@pytest.mark.parametrize("template,temperature", [("hybrid-fixed", 0.0), ("hybrid", 0.0), ("adaptive-fixed", 0.0),
                                                  ("hybrid-fixed", 0.8)])
def test_hindsight_matches_what_verification_accepted(template, temperature):
    """Under greedy decoding and seeded sampling a tree's hindsight outcome at the drafted size is exactly what the
    step accepted."""
    from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

    from tr_core import DecodeConfig, Engine, StepEvent

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    drafter = engine.drafter_for(DecodeConfig(template=template))
    drafter.cost.set_measured({n: [10.0 + 0.1 * n] for n in (1, 2, 4, 8, 16, 32, 64, 81)}, max_tokens=81)
    watch, watched_steps = drafter.trust.watch, []

    def recording_watch(*args):
        before = len(drafter.trust.watched)
        watch(*args)
        watched_steps.append(drafter.trust.watched[-1] if len(drafter.trust.watched) > before else None)

    drafter.trust.watch = recording_watch
    run = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22]
    cfg = DecodeConfig(template=template, max_new_tokens=40, temperature=temperature, seed=3)
    events = list(engine.generate(run * 3, cfg))
    steps = [e for e in events if isinstance(e, StepEvent)]
    drafter.trust.start_answer()  # settles the last trees
    skipped = 0 if template.startswith("hybrid") else 1  # adaptive's first tree has no host copy: not watched
    assert len(watched_steps) == len(steps) - skipped
    # the draft tokens each step emitted (the last step's may be cut short by the token limit)
    accepted = [min(len(e.accepted) - 1, len(e.emitted) - (e.bonus is not None)) for e in steps[skipped:]]
    judged = [realised_counts(w.path, len(w.expected) - 1)[len(e.tokens) - 1] if w else 0
              for w, e in zip(watched_steps, steps[skipped:])]
    assert judged == accepted
    assert sum(accepted) > 0, "the repeated prompt must give accepted drafts, or this test checks nothing"
