"""The studio's shared decode loop (studio/decode_loop.py): visitors in threads decode together, each getting the
tokens it gets alone; one who leaves frees their row; those beyond the rows wait in line and know their place."""
from __future__ import annotations

import threading
from collections import deque

import torch
from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

from studio.decode_loop import BatchedEngine, DecodeLoop, Ticket, next_to_join
from tr_core import DecodeConfig, Engine, StepEvent, SummaryEvent


def prompts(n: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(21)
    return [torch.randint(2, TINY_VOCAB, (4 + 3 * i,), generator=g).tolist() for i in range(n)]


def test_visitors_in_threads_decode_together_with_their_alone_tokens():
    model = tiny_model("llama", seed=3)
    cfg = DecodeConfig(max_new_tokens=40, template="hybrid")
    asks = prompts(10)  # more visitors than rows: the later ones wait for a row
    alone = [list(Engine(model, TinyTokenizer(TINY_VOCAB)).generate(p, cfg))[-1].tokens for p in asks]
    got: dict[int, list[int]] = {}
    shared = []

    def visitor(i: int) -> None:
        decoder = BatchedEngine(Engine(model, TinyTokenizer(TINY_VOCAB)))
        events = list(decoder.generate(asks[i], cfg))
        assert isinstance(events[-1], SummaryEvent) and all(isinstance(e, StepEvent) for e in events[:-1])
        got[i] = events[-1].tokens
        shared.append(decoder.loop)

    threads = [threading.Thread(target=visitor, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert [got[i] for i in range(len(asks))] == alone
    assert len({id(loop) for loop in shared}) == 1  # one loop for the model
    assert shared[0].load() == 0 and len(shared[0].batch) == 0


def test_a_visitor_who_leaves_frees_their_row_and_the_line_moves():
    model = tiny_model("llama", seed=4)
    loop = DecodeLoop(rows=1)
    first = BatchedEngine(Engine(model, TinyTokenizer(TINY_VOCAB)))
    second = BatchedEngine(Engine(model, TinyTokenizer(TINY_VOCAB)))
    first.loop = second.loop = loop
    running = first.generate(prompts(1)[0], DecodeConfig(max_new_tokens=400, template="2.2.2", stop_token_ids=()))
    assert next(running).step == 0  # the first answer has the only row and decodes
    result: list = []
    waiting = second.generate(prompts(2)[1], DecodeConfig(max_new_tokens=5, template="2.2.2"))
    thread = threading.Thread(target=lambda: result.extend(waiting))
    thread.start()
    for _ in range(500):
        if second.place() == 1:
            break
        threading.Event().wait(0.01)
    assert second.place() == 1 and not result  # next in line, nothing decoded yet
    assert loop.admitting() == 1  # waiting for a first token: the studio draws nobody's figures meanwhile
    running.close()  # the first visitor leaves mid-answer: their row is freed after the current step
    thread.join(timeout=120)
    assert isinstance(result[-1], SummaryEvent) and len(result[-1].tokens) == 5
    assert loop.load() == 0 and second.place() == 0 and loop.admitting() == 0


def test_a_bad_prompt_fails_that_answer_only():
    model = tiny_model("llama", seed=5)
    decoder = BatchedEngine(Engine(model, TinyTokenizer(TINY_VOCAB)))
    try:
        list(decoder.generate([TINY_VOCAB + 3], DecodeConfig(max_new_tokens=4)))
    except ValueError as exc:
        assert "vocabulary" in str(exc) or "id" in str(exc)
    else:
        raise AssertionError("a prompt outside the vocabulary must be refused")
    ok = list(BatchedEngine(Engine(model, TinyTokenizer(TINY_VOCAB))).generate([5, 6], DecodeConfig(max_new_tokens=4)))
    assert len(ok[-1].tokens) == 4


def test_those_who_get_a_row_now_prefill_shortest_first_and_the_line_stays_first_come():
    """Of those in line who get a row now, the shortest prompts prefill first, together in one forward as far as
    the padded budget allows (tr_core.batch.prefill_group); one free row: the first in line, alone."""
    line = deque(Ticket(None, [1] * n, None, lambda: False) for n in (9, 3, 7, 2))
    lengths = lambda group: [len(t.prompt_ids) for t in group]  # noqa: E731
    assert lengths(next_to_join(line, free=3)) == [3, 7, 9]  # the 4th in line (2 tokens) does not get a row yet
    assert lengths(next_to_join(line, free=4)) == [2, 3, 7, 9]
    assert lengths(next_to_join(line, free=1)) == [9]
    assert lengths(next_to_join(line, free=0)) == [9]
    long = deque(Ticket(None, [1] * n, None, lambda: False) for n in (300, 100, 200))
    assert lengths(next_to_join(long, free=3)) == [100, 200]  # a third row would pad the forward to 3 x 300 tokens


def test_in_a_crowd_first_words_go_before_anyones_figures(monkeypatch):
    """studio.answer.draws_figures: alone or in slow motion every update draws; in a crowd an answer's first
    update is its text alone, and nobody's figures are drawn while others wait for their first token."""
    from studio import answer
    from studio.settings import ChatSettings

    steps = [object(), object()]
    trace = type("T", (), {"steps": steps})()
    settings, slow = ChatSettings(), ChatSettings(delay=0.5)
    for crowd, newcomers, new_steps, draws in [(1, 0, steps, True), (1, 0, steps[1:], True), (30, 0, steps, False),
                                               (30, 0, steps[1:], True), (30, 3, steps[1:], False)]:
        monkeypatch.setattr(answer, "crowd", lambda: crowd)
        monkeypatch.setattr(answer, "newcomers", lambda: newcomers)
        assert answer.draws_figures(trace, new_steps, settings) is draws
        assert answer.draws_figures(trace, new_steps, slow)
