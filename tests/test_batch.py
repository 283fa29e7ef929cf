"""Batched Token Recycling (tr_core/batch.py): every answer of a ragged batch gets the tokens it gets alone."""
from __future__ import annotations

import pytest
import torch
from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

from tr_core import DecodeConfig, Engine, StepEvent, SummaryEvent
from tr_core.batch import Batch, Joining, generate_batch, prefill_group, tree_width


def ragged_prompts(n: int, seed: int = 3) -> list[list[int]]:
    """Prompts of lengths 3, 8, 13, ...: every row of a batch has its own length."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, TINY_VOCAB, (3 + 5 * i,), generator=g).tolist() for i in range(n)]


def alone(model, prompts: list[list[int]], cfg: DecodeConfig) -> list[list[int]]:
    """Each prompt's tokens decoded alone, by a fresh engine."""
    return [list(Engine(model, TinyTokenizer(TINY_VOCAB)).generate(p, cfg))[-1].tokens for p in prompts]


def batched(model, prompts: list[list[int]], cfg: DecodeConfig, max_rows: int) -> tuple[list, list]:
    """Each prompt's tokens decoded in one batch, and every (prompt, event) pair in order."""
    pairs = list(generate_batch(Engine(model, TinyTokenizer(TINY_VOCAB)), prompts, cfg, max_rows=max_rows))
    tokens = {i: ev.tokens for i, ev in pairs if isinstance(ev, SummaryEvent)}
    return [tokens[i] for i in range(len(prompts))], pairs


@pytest.mark.parametrize("arch", ["llama", "mistral", "gemma3", "gpt2"])
@pytest.mark.parametrize("template", ["2.2.2", "adaptive", "hybrid"])
def test_ragged_batch_gives_each_answer_its_tokens_alone(arch, template):
    """Greedy: rows of different lengths, more prompts than rows (later ones join as rows free up), sliding and
    mixed-window models among them; and drafts really are accepted in the batch."""
    model = tiny_model(arch)
    prompts, cfg = ragged_prompts(6), DecodeConfig(max_new_tokens=40, template=template)
    tokens, pairs = batched(model, prompts, cfg, max_rows=4)
    assert tokens == alone(model, prompts, cfg)
    steps = [ev for _, ev in pairs if isinstance(ev, StepEvent)]
    assert max(len(ev.accepted) for ev in steps) > 2


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_seeded_sampling_in_a_batch_equals_alone(arch):
    model = tiny_model(arch)
    prompts = ragged_prompts(5, seed=7)
    for seed in (1, 2):
        cfg = DecodeConfig(max_new_tokens=30, template="2.2.2", temperature=0.9, top_p=0.95, seed=seed)
        assert batched(model, prompts, cfg, max_rows=3)[0] == alone(model, prompts, cfg)


def test_rows_join_and_leave_mid_answer():
    """An answer added while others are halfway, one stopped by its `stop`, one cancelled (a visitor who left):
    the others' tokens are untouched, and the stopped ones are a prefix of their full answers."""
    model = tiny_model("llama")
    prompts = ragged_prompts(4, seed=11)
    cfg = DecodeConfig(max_new_tokens=36, template="adaptive")
    full = alone(model, prompts, cfg)
    base = Engine(model, TinyTokenizer(TINY_VOCAB))
    batch = Batch(max_rows=4)
    steps_of_1, polls = [], []  # `stop` is polled after each of the row's steps: it ends the answer after 3
    keys = [batch.add(base.fork(), prompts[0], cfg), batch.add(base.fork(), prompts[1], cfg,
                                                               stop=lambda: polls.append(1) or len(polls) >= 3)]
    done: dict[int, list[int]] = {}
    for step in range(200):
        if step == 4:
            keys.append(batch.add(base.fork(), prompts[2], cfg))  # joins mid-answer
            keys.append(batch.add(base.fork(), prompts[3], cfg))
        if step == 6:
            summary = batch.cancel(keys[3])
            assert summary is not None and summary.stop_reason == "stopped"
            done[keys[3]] = summary.tokens
        for key, ev in batch.step():
            if key == keys[1] and isinstance(ev, StepEvent):
                steps_of_1.append(ev)
            if isinstance(ev, SummaryEvent):
                done[key] = ev.tokens
        if not batch:
            break
    assert not batch and batch.cache.rows == []
    assert done[keys[0]] == full[0] and done[keys[2]] == full[2]
    assert len(steps_of_1) == 3 and full[1][: len(done[keys[1]])] == done[keys[1]] != full[1]
    assert full[3][: len(done[keys[3]])] == done[keys[3]] != full[3]
    assert batch.cancel(keys[0]) is None  # already gone


def test_rows_of_one_batch_need_engines_of_their_own_and_one_model():
    model = tiny_model("llama")
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    batch = Batch(max_rows=2)
    batch.add(engine, [5, 6, 7], DecodeConfig(max_new_tokens=4))
    with pytest.raises(ValueError, match="engine.fork"):
        batch.add(engine, [8, 9], DecodeConfig(max_new_tokens=4))
    other = Engine(tiny_model("llama", seed=1), TinyTokenizer(TINY_VOCAB))
    with pytest.raises(ValueError, match="same model"):
        batch.add(other, [8, 9], DecodeConfig(max_new_tokens=4))
    batch.add(engine.fork(), [8, 9], DecodeConfig(max_new_tokens=4))
    with pytest.raises(RuntimeError, match="full"):
        batch.add(engine.fork(), [1, 2], DecodeConfig(max_new_tokens=4))
    with pytest.raises(ValueError):
        Batch(max_rows=0)


def test_a_bad_prompt_is_refused_and_leaves_the_batch_as_it_was():
    model = tiny_model("llama")
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    batch = Batch(max_rows=2)
    with pytest.raises(ValueError):
        batch.add(engine, [], DecodeConfig())
    with pytest.raises(ValueError):
        batch.add(engine, [TINY_VOCAB + 5], DecodeConfig())
    assert not batch and batch.step() == []
    key = batch.add(engine, [5, 6, 7], DecodeConfig(max_new_tokens=5))
    events = [ev for _ in range(10) for k, ev in batch.step() if k == key]
    assert isinstance(events[-1], SummaryEvent) and len(events[-1].tokens) == 5


def test_trees_shrink_as_the_batch_grows():
    """tree_width: the nodes per row that maximise the batch's expected tokens per ms. With a forward that costs
    10 ms plus 1 ms a token, one row drafts 3 nodes, 8 rows 2 each, and 32 rows decode plainly."""
    curve = [0.0, 0.8, 1.4, 1.8, 1.9]
    cost = lambda rows, width: 10.0 + rows * width  # noqa: E731
    assert [tree_width([curve] * rows, rows, cost) for rows in (1, 8, 32)] == [3, 2, 0]
    assert tree_width([[0.0], [0.0, 0.9]], 2, cost) == 1  # a row with no tree still pays its place in the forward
    assert tree_width([curve], 1, lambda rows, width: 10.0 * width) == 0  # every token a full forward: plain


def test_a_batch_caps_its_rows_trees_and_frees_them_after():
    model = tiny_model("llama")
    base = Engine(model, TinyTokenizer(TINY_VOCAB))
    cfg = DecodeConfig(max_new_tokens=30, template="adaptive")
    list(base.generate(ragged_prompts(1)[0], cfg))  # times the forwards once: the forks share the curve
    batch, engines = Batch(max_rows=3), [base.fork() for _ in range(3)]
    for engine, prompt in zip(engines, ragged_prompts(3, seed=5)):
        batch.add(engine, prompt, cfg)
    caps = []
    while batch:
        batch.step()
        caps.append(batch.cap)
    assert any(cap is not None for cap in caps)  # sized from the second step on
    assert [engine.drafter_for(cfg).cap for engine in engines] == [None] * 3


def test_a_long_prompt_joining_after_short_ones_keeps_their_caches():
    """A row whose prompt is longer than the batch's buffer grows it: the rows already there keep every entry
    (found by the benchmark on real prompts; short prompts alone never grow the buffer)."""
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(9)
    prompts = [torch.randint(2, TINY_VOCAB, (n,), generator=g).tolist() for n in (5, 300, 12)]
    for cfg in (DecodeConfig(max_new_tokens=12, plain=True), DecodeConfig(max_new_tokens=12, template="hybrid")):
        assert batched(model, prompts, cfg, max_rows=3)[0] == alone(model, prompts, cfg)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_joining_answers_take_their_first_step_without_a_forward_and_keep_their_tokens(arch):
    """first_steps steps only the rows that just joined (the prompt's forward verified their first step): no
    forward, the rows already decoding wait; every answer still gets its tokens alone."""
    model = tiny_model(arch)
    prompts, cfg = ragged_prompts(4, seed=5), DecodeConfig(max_new_tokens=24, template="hybrid")
    base, batch, done = Engine(model, TinyTokenizer(TINY_VOCAB)), Batch(max_rows=4), {}
    forwards = []
    batch._forward = lambda *a, real=batch._forward: forwards.append(1) or real(*a)
    keys = [batch.add(base.fork(), prompts[0], cfg)]
    assert [k for k, ev in batch.first_steps()] == keys and not forwards
    batch.step()
    for prompt in prompts[1:]:
        keys.append(batch.add(base.fork(), prompt, cfg))
        out = batch.first_steps()
        assert [k for k, ev in out] == keys[-1:] and isinstance(out[0][1], StepEvent) and len(forwards) == 1
    assert batch.first_steps() == []
    while batch:
        done.update((k, ev.tokens) for k, ev in batch.step() if isinstance(ev, SummaryEvent))
    assert [done[k] for k in keys] == alone(model, prompts, cfg)


def test_answers_joining_one_by_one_fill_spare_rows_without_copying_the_batch():
    """The batch's cache grows by ROW_GROWTH rows at once: answers joining one by one use spare rows in place
    (each join used to copy every row's cache); the last row leaving is not copied either, and its row is reused
    by the next answer (its old entries masked). Every answer keeps its tokens alone."""
    from tr_core.kv_cache import ROW_GROWTH

    model = tiny_model("llama")
    prompts, cfg = ragged_prompts(5, seed=11), DecodeConfig(max_new_tokens=16, template="hybrid")
    base, batch, done = Engine(model, TinyTokenizer(TINY_VOCAB)), Batch(max_rows=8), {}
    keys = [batch.add(base.fork(), prompts[0], cfg)]
    buffer = batch.cache.layers[0]._k
    keys += [batch.add(base.fork(), p, cfg) for p in prompts[1:3]]
    assert batch.cache.layers[0]._k is buffer and buffer.shape[0] == ROW_GROWTH
    assert batch.cache.layers[0].keys.shape[0] == 3
    for step in range(200):
        if step == 3:
            done[keys[2]] = batch.cancel(keys[2]).tokens  # the last row leaves: kept in place, not copied
            assert batch.cache.layers[0]._k is buffer and batch.cache.layers[0].keys.shape[0] == 2
            keys += [batch.add(base.fork(), p, cfg) for p in prompts[3:]]  # the first reuses the row left
        done.update((k, ev.tokens) for k, ev in batch.step() if isinstance(ev, SummaryEvent))
        if not batch:
            break
    full = alone(model, prompts, cfg)
    assert [done[k] for k in keys[:2] + keys[3:]] == full[:2] + full[3:]
    assert full[2][: len(done[keys[2]])] == done[keys[2]]


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_answers_joining_together_prefill_in_one_forward_and_keep_their_tokens(arch):
    """add_together: several prompts of different lengths prefill in ONE right-padded forward (a bad prompt among
    them is handed its error, the others join); every answer still gets its tokens alone."""
    model = tiny_model(arch)
    prompts, cfg = ragged_prompts(4, seed=9), DecodeConfig(max_new_tokens=24, template="hybrid")
    base, batch, done = Engine(model, TinyTokenizer(TINY_VOCAB)), Batch(max_rows=8), {}
    calls = []
    real = base.runner.prefill_rows
    base.runner.prefill_rows = lambda rows, *past: calls.append([len(r) for r in rows]) or real(rows, *past)
    joining = [Joining(base.fork(), p, cfg) for p in prompts[:2]] + [Joining(base.fork(), [TINY_VOCAB + 5], cfg)]
    keys = batch.add_together(joining + [Joining(base.fork(), p, cfg) for p in prompts[2:]])
    assert isinstance(keys[2], ValueError) and len(batch) == 4
    assert len(calls) == 1 and sorted(calls[0]) == sorted(len(p) for p in prompts)  # the last token too: verified
    keys = keys[:2] + keys[3:]
    done.update((k, ev.tokens) for k, ev in batch.first_steps() if isinstance(ev, SummaryEvent))
    while batch:
        done.update((k, ev.tokens) for k, ev in batch.step() if isinstance(ev, SummaryEvent))
    assert [done[k] for k in keys] == alone(model, prompts, cfg)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gpt2"])
def test_prompts_that_start_alike_prefill_their_shared_tokens_once_and_keep_their_tokens(arch):
    """prefix.SharedPrefix: prompts joining together that start with the same tokens (a chat template's system
    turn) prefill those once; one joining later starts from them too; every answer gets its tokens alone."""
    model = tiny_model(arch)
    head = torch.randint(2, TINY_VOCAB, (12,), generator=torch.Generator().manual_seed(4)).tolist()
    prompts = [head + [7 + i] + p for i, p in enumerate(ragged_prompts(4, seed=9))]  # they part at token 12
    cfg = DecodeConfig(max_new_tokens=24, template="hybrid")
    base, batch, done, calls = Engine(model, TinyTokenizer(TINY_VOCAB)), Batch(max_rows=8), {}, []
    real_rows, real_prefill = base.runner.prefill_rows, base.runner.prefill
    base.runner.prefill_rows = lambda rows, past=None, start=0: (calls.append((start, [len(r) for r in rows]))
                                                                 or real_rows(rows, past, start))
    base.runner.prefill = lambda ids, cache: calls.append(("alone", len(ids))) or real_prefill(ids, cache)  # (the
    # engine times its forwards on the first prompt too)
    keys = batch.add_together([Joining(base.fork(), p, cfg) for p in prompts[:3]])
    keys += batch.add_together([Joining(base.fork(), prompts[3], cfg)])
    assert calls[-3:] == [("alone", 12), (12, [4, 9, 14]), (12, [19])] and batch.prefix.tokens == head
    done.update((k, ev.tokens) for k, ev in batch.first_steps() if isinstance(ev, SummaryEvent))
    while batch:
        done.update((k, ev.tokens) for k, ev in batch.step() if isinstance(ev, SummaryEvent))
    assert [done[k] for k in keys] == alone(model, prompts, cfg)


def test_a_shared_prefix_is_what_every_prompt_starts_with_and_leaves_each_a_token():
    """SharedPrefix.take: the tokens held serve prompts that start with enough of them; prompts sharing fewer
    than MIN_SHARED, or a prompt alone with nothing held, start from nothing."""
    from tr_core.prefix import MIN_SHARED, SharedPrefix, common_length

    assert common_length([[1, 2, 3, 4], [1, 2, 9], [1, 2, 3]]) == 2 and common_length([[5], [6]]) == 0
    runner = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB)).runner
    head = list(range(2, 2 + MIN_SHARED + 2))
    prefix = SharedPrefix()
    assert prefix.take(runner, [head + [40]]) == (None, 0)  # alone, nothing held: no one to share with
    assert prefix.take(runner, [head[:MIN_SHARED - 1] + [40], head[:MIN_SHARED - 1] + [41]]) == (None, 0)
    cache, n = prefix.take(runner, [head + [40], head + [41, 42]])
    assert n == len(head) and cache.layers[0].length == len(head)
    assert prefix.take(runner, [head[:MIN_SHARED] + [50]]) == (cache, MIN_SHARED)  # the held one serves a prefix
    assert prefix.take(runner, [head]) == (cache, len(head) - 1)  # a token of its own is left for its logits


def test_a_prefill_group_fills_free_rows_within_its_padded_budget():
    assert prefill_group([100, 120, 110, 90], free=8, budget=512) == 4  # 4 x 120 = 480
    assert prefill_group([100, 120, 110, 90, 50], free=8, budget=512) == 4  # a 5th: 5 x 120 = 600
    assert prefill_group([100, 120, 110], free=2, budget=512) == 2  # only two rows free
    assert prefill_group([900, 10], free=8, budget=512) == 1  # one longer than the budget goes alone
    assert prefill_group([], free=8) == 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_exact_bfloat16_batch_of_prompts_sharing_their_start_equals_alone(arch):
    """In exact mode (row-invariant products and attention, invariant.py) a bfloat16 batch of prompts that share
    their first tokens gives every answer the tokens it gives alone: each prompt's forward runs as it runs alone (a
    prompt's forward is not row-invariant: invariant.relaxed), the steps share one forward."""
    model = tiny_model(arch).to(torch.bfloat16)
    head = torch.randint(2, TINY_VOCAB, (10,), generator=torch.Generator().manual_seed(4)).tolist()
    prompts = [head + [7 + i] + p for i, p in enumerate(ragged_prompts(6, seed=3))]
    cfg = DecodeConfig(max_new_tokens=32, template="hybrid")
    pairs = list(generate_batch(Engine(model, TinyTokenizer(TINY_VOCAB), exact=True), prompts, cfg, max_rows=8))
    tokens = {i: ev.tokens for i, ev in pairs if isinstance(ev, SummaryEvent)}
    solo = [list(Engine(model, TinyTokenizer(TINY_VOCAB), exact=True).generate(p, cfg))[-1].tokens for p in prompts]
    assert [tokens[i] for i in range(len(prompts))] == solo


def test_the_batch_cost_is_learned_per_rows_and_width_and_shared_by_a_models_batches():
    """batch_cost.BatchCost: a (rows, width) timed costs what it was timed (later timings blended in); one never
    timed follows the alone curve's shape from this row count's one-token forward, or the width's timed ratio at
    the nearest row count; never below a narrower width timed for the same rows. One per model, shared."""
    from tr_core.batch_cost import ALPHA, BatchCost, shared_cost

    alone = lambda n: 40.0 + n  # noqa: E731  (one row of n tokens: nearly flat)
    cost = BatchCost(alone)
    assert cost(8, 2) == pytest.approx(48.0 * 56.0 / 48.0)  # nothing timed: the alone curve's t(16)
    cost.observe(8, 1, 52.0)
    assert cost(8, 1) == 52.0 and cost(8, 2) == pytest.approx(52.0 * 56.0 / 48.0)
    cost.observe(8, 2, 79.0)
    assert cost(8, 2) == 79.0 and cost(8, 3) == 79.0  # the alone shape says 52 * 64 / 48 = 69: not below w=2's
    cost.observe(8, 2, 89.0)
    assert cost(8, 2) == pytest.approx((1 - ALPHA) * 79.0 + ALPHA * 89.0)
    cost.observe(4, 1, 45.0)
    assert cost(4, 2) == pytest.approx(45.0 * cost(8, 2) / 52.0)  # the width's ratio where it was timed (8 rows)
    first, other = tiny_model("llama"), tiny_model("llama")
    assert shared_cost(first, alone) is shared_cost(first, lambda n: 1.0) and shared_cost(other, alone) is not \
        shared_cost(first, alone)


def test_a_batch_learns_that_drafting_loses_and_decodes_plainly():
    """Where a shared forward's every extra token costs as much as a row's plain step, trees do not pay: after a
    few forwards the batch's steps are plain (width 1), whatever the rows' alone curves promised."""
    from tr_core.batch_cost import BatchCost

    curve = [0.0, 0.6, 1.0, 1.2]
    cost = BatchCost(lambda n: 50.0 + 0.1 * n)  # alone: extra tokens nearly free, so drafting looks good at first
    truth = lambda rows, width: 50.0 * width  # noqa: E731  (in the batch: every width costs a whole forward more)
    widths = []
    for _ in range(6):
        m = tree_width([curve] * 8, 8, cost)
        widths.append(m + 1)
        cost.observe(8, m + 1, truth(8, m + 1))
    assert widths[0] > 1 and widths[-3:] == [1, 1, 1], widths
