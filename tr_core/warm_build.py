"""Learning a warm start from the shipped corpus: decode it, average the rows its answers wrote, calibrate the
drafters to such a matrix, and capture a `WarmState` (warm_file.py). Why each pass: docs/warm-start.md."""
from __future__ import annotations

import contextlib
import datetime as _dt
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch

from .engine_state import DRAFTERS
from .warm_file import FORMAT, WarmState, model_fingerprint

# rows no answer wrote get the model's context-free guess for this many of the lowest ids (a BPE vocabulary's first
# merges: its commonest tokens); the shipped file has every id's (scripts/build_warm_start.py)
LEARN_CONTEXT_FREE = 16384
CONTEXT_FREE_REQUEST = "Hello."  # the conversation a context-free row's token opens the answer to
COUNT_CAP = 32.0  # calibration trials kept per key: the shipped rates start informed but still follow the session
CALIBRATE_EVERY = 4  # one corpus prompt in this many is decoded again, from the warm matrix, to calibrate the drafters
# with a time budget: the context-free rows stop at this share of it, the corpus answers at the next, calibration at 1
CONTEXT_FREE_SHARE, ANSWERS_SHARE = 0.3, 0.75
T = TypeVar("T")


class Pace:
    """A learn's time budget in seconds (None: none) on `clock`; `between()` runs between its steps and forwards."""

    def __init__(self, budget_s: float | None = None, clock: Callable[[], float] = time.monotonic,
                 between: Callable[[], None] | None = None) -> None:
        self.budget_s, self.clock, self.between = budget_s, clock, between
        self.start = clock()
        self.cut = False  # set once the budget stopped a pass early: the warm start is partial

    def spent(self) -> float:
        return self.clock() - self.start

    def allows(self, share: float, next_s: float = 0.0) -> bool:
        """Whether a unit expected to take `next_s` fits in `share` of the budget (always, without one)."""
        if self.budget_s is None or self.spent() + next_s <= share * self.budget_s:
            return True
        self.cut = True
        return False

    def paced(self, items: Iterable[T], share: float) -> Iterator[T]:
        """The items while the next one, taking as long as the last, fits in `share` of the budget."""
        last = 0.0
        for item in items:
            if not self.allows(share, last):
                return
            began = self.spent()
            yield item
            last = self.spent() - began

    def step(self) -> None:
        if self.between is not None:
            self.between()


def learn(engine, prompts: list[str], max_new_tokens: int,
          progress: Callable[[int, int], None] | None = None,
          context_free: int | None = LEARN_CONTEXT_FREE, pace: Pace | None = None) -> WarmState:
    """The warm state learned from `prompts`, each pass within its share of `pace`'s budget; leaves the engine cold.
    `context_free`: how many of the lowest ids get a context-free row (None: all)."""
    pace = pace or Pace()
    engine.forget()
    vocab, k = engine.vocab_size, engine.matrix.k
    try:  # the ids the tokenizer names: those past its length are never emitted
        named = min(vocab, len(engine.tokenizer))
    except TypeError:  # a tokenizer without a length
        named = vocab
    guessed = list(range(named if context_free is None else min(named, context_free)))
    forwards = -(-len(guessed) // context_free_batch(vocab))
    calibrations = -(-len(prompts) // CALIBRATE_EVERY) if len(prompts) >= 2 * CALIBRATE_EVERY else 0
    total = forwards + len(prompts) + calibrations
    tick = (lambda i: progress(i, total)) if progress is not None else (lambda i: None)
    free = context_free_rows(engine, guessed, tick, pace)  # first: even a short budget gets every common token a row
    answers, steps = decode_answers(engine, prompts, max_new_tokens, lambda i: tick(forwards + i), pace)
    tops = dict(zip(answers, answer_tops(engine.model, list(answers.values()), vocab, k, pace.step)))
    set_rows(engine.matrix, *free)
    held = [i for i in range(0, len(prompts), CALIBRATE_EVERY) if i in answers] \
        if len(answers) >= 2 * CALIBRATE_EVERY else []
    calibrated = 0
    if held:
        set_rows(engine.matrix, *average_tops([t for i, t in tops.items() if i not in held], vocab, k))
        calibrated = calibrate(engine, [prompts[i] for i in held], max_new_tokens,
                               lambda i: tick(forwards + len(prompts) + i), pace=pace)
    averaged = average_tops(list(tops.values()), vocab, k)
    set_rows(engine.matrix, *averaged)
    state = capture(engine, {"answers": len(answers), "tokens": sum(len(a) for _, a in answers.values()),
                             "steps": steps, "max_new_tokens": max_new_tokens, "calibration_answers": calibrated,
                             "rows_context_free": len(set(free[0].tolist()) - set(averaged[0].tolist())),
                             "corpus_answers": len(prompts), "partial": pace.cut,
                             "learn_s": round(pace.spent(), 1), "budget_s": pace.budget_s})
    engine.forget()
    return with_library(state, [answer for _, answer in answers.values()])


def with_library(state: WarmState, answers: list[list[int]]) -> WarmState:
    """The warm state with `answers` (token ids) as the hybrid's library, counted in its manifest."""
    state.library = [list(a) for a in answers if a]
    state.manifest.update(library_answers=len(state.library), library_tokens=sum(map(len, state.library)))
    return state


def decode_answers(engine, prompts: list[str], max_new_tokens: int, tick: Callable[[int], None],
                   pace: Pace | None = None) -> tuple[dict[int, tuple[list[int], list[int]]], int]:
    """Pass 1, within ANSWERS_SHARE of the budget: {prompt index: (prompt ids, answer ids)} and the steps taken."""
    pace = pace or Pace()
    answers, steps = {}, 0
    for i, prompt in pace.paced(enumerate(prompts), ANSWERS_SHARE):
        answer, answer_steps = _decode(engine, prompt, max_new_tokens, "hybrid" if i % 2 == 0 else "adaptive",
                                       pace=pace, share=ANSWERS_SHARE)
        if answer is not None:
            answers[i], steps = answer, steps + answer_steps
        tick(i + 1)
    return answers, steps


def context_free_batch(vocab_size: int) -> int:
    """Tokens per forward of `context_free_rows`: 256, fewer for vocabularies whose logits would pass 128 MB."""
    return max(16, min(256, (32 << 20) // max(vocab_size, 1)))


def _no_rows(k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.zeros(0, dtype=torch.long), torch.zeros(0, k, dtype=torch.int32), torch.zeros(0, k, dtype=torch.uint8)


@torch.no_grad()
def context_free_rows(engine, tokens: list[int], tick: Callable[[int], None] = lambda i: None,
                      pace: Pace | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, candidates, probabilities) of `tokens` (those within CONTEXT_FREE_SHARE of the budget): the model's
    top-k after each token opening the answer to CONTEXT_FREE_REQUEST, a batch of siblings a forward."""
    from .kv_cache import TreeKVCache

    pace = pace or Pace()
    runner, k, vocab = engine.runner, engine.matrix.k, engine.vocab_size
    prompt = engine.encode_chat([{"role": "user", "content": CONTEXT_FREE_REQUEST}])
    cache = TreeKVCache()
    runner.prefill(prompt, cache)
    past, size = len(prompt), context_free_batch(vocab)
    tables, probs = [], []
    for i, start in pace.paced(enumerate(range(0, len(tokens), size)), CONTEXT_FREE_SHARE):
        pace.step()
        chunk = torch.tensor(tokens[start:start + size], dtype=torch.long, device=runner.device)
        depths = torch.zeros(chunk.numel(), dtype=torch.long, device=runner.device)
        alone = torch.eye(chunk.numel(), dtype=torch.bool, device=runner.device)
        logits = runner.forward(chunk[None], (past + depths)[None], runner.mask(alone, depths, past), cache)
        cache.truncate(past)
        top_p, top_ids = torch.softmax(logits[:, :vocab].float(), dim=-1).topk(k, dim=-1)
        tables.append(top_ids.to(torch.int32).cpu())
        probs.append((top_p * 255).round().clamp(0, 255).to(torch.uint8).cpu())
        tick(i + 1)
    if not tables:
        return _no_rows(k)
    table = torch.cat(tables)
    return torch.tensor(tokens[:len(table)], dtype=torch.long), table, torch.cat(probs)


def set_rows(matrix, rows: torch.Tensor, table: torch.Tensor, probs: torch.Tensor) -> None:
    """Write whole rows into the matrix (rows [R] long, candidates [R, k] int32, probabilities [R, k] uint8)."""
    on = rows.to(matrix.device)
    matrix.table[on], matrix.probs[on] = table.to(matrix.device), probs.to(matrix.device)
    matrix.filled[on] = True


def calibrate(engine, prompts: list[str], max_new_tokens: int, tick: Callable[[int], None],
              pace: Pace | None = None) -> int:
    """Pass 3: how many of `prompts` were answered within the budget, each from the matrix as it is now."""
    pace = pace or Pace()
    engine.drop_older_row_calibration()
    start = engine.matrix.clone()
    start.stamps.fill_(-1)  # every row written before the answers: rated as older rows, as in a warm session
    done = 0
    for i, prompt in pace.paced(enumerate(prompts), 1.0):
        engine.forget()
        engine.matrix.copy_from(start)
        _decode(engine, prompt, max_new_tokens, "hybrid" if i % 2 == 0 else "adaptive", pace=pace)
        done += 1
        tick(i + 1)
    engine.forget()
    engine.matrix.copy_from(start)
    return done


def _decode(engine, prompt: str, max_new_tokens: int, template: str, pace: Pace | None = None,
            share: float = 1.0) -> tuple[tuple[list[int], list[int]] | None, int]:
    """((prompt ids, answer ids), steps) of one greedy answer, cut past `share` of the budget; (None, 0): no room."""
    from .config import DecodeConfig
    from .events import SummaryEvent

    pace = pace or Pace()
    ids = engine.encode_chat([{"role": "user", "content": prompt}])
    if len(ids) + max_new_tokens >= engine.context_limit:
        return None, 0
    run = engine.generate(ids, DecodeConfig(max_new_tokens=max_new_tokens, template=template),
                          stop=lambda: not pace.allows(share))
    with contextlib.closing(run):
        pace.step()
        for event in run:
            if isinstance(event, SummaryEvent):
                return (ids, list(event.tokens)), event.steps
            pace.step()
    return None, 0


def average_rows(model, answers: list[tuple[list[int], list[int]]], vocab_size: int,
                 k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows, candidates, mean probabilities) of the model's average top-k after each token of `answers`."""
    return average_tops(answer_tops(model, answers, vocab_size, k), vocab_size, k)


@torch.no_grad()
def answer_tops(model, answers: list[tuple[list[int], list[int]]], vocab_size: int, k: int,
                between: Callable[[], None] = lambda: None) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per answer, one forward: (tokens before its answer tokens [L], top-k after each [L, k], probabilities)."""
    device = next(model.parameters()).device
    out = []
    for prompt, answer in answers:
        between()
        ids, start = list(prompt) + list(answer), len(prompt) - 1
        if start < 0 or not answer:
            out.append((torch.zeros(0, dtype=torch.long), torch.zeros(0, k, dtype=torch.long),
                        torch.zeros(0, k, dtype=torch.float64)))
            continue
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, start:, :vocab_size]
        probs, cands = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)  # [L, k]
        out.append((torch.tensor(ids[start:], dtype=torch.long), cands.cpu(), probs.cpu().double()))
    return out


def average_tops(tops: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], vocab_size: int,
                 k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`average_rows` from the answers' `answer_tops`: each row's k candidates of highest summed probability."""
    if not any(rows.numel() for rows, _, _ in tops):
        return _no_rows(k)
    seen = torch.zeros(vocab_size, dtype=torch.float64)
    for rows, _, _ in tops:
        seen.index_add_(0, rows, torch.ones(rows.numel(), dtype=torch.float64))
    keys = torch.cat([(rows[:, None] * vocab_size + cands).view(-1) for rows, cands, _ in tops])
    pairs, where = torch.unique(keys, return_inverse=True)  # ascending: by row, then candidate
    flat_probs = torch.cat([p.view(-1) for *_, p in tops])
    score = torch.zeros(pairs.numel(), dtype=torch.float64).index_add_(0, where, flat_probs)
    row = pairs // vocab_size
    order = torch.argsort(-score, stable=True)
    order = order[torch.argsort(row[order], stable=True)]  # by row, best candidate first
    row, cand, score = row[order], (pairs % vocab_size)[order], score[order]
    starts = torch.searchsorted(row, row, right=False)  # each entry's row's first index
    keep = torch.arange(row.numel()) - starts < k  # every row has >= k candidates: each place gave k distinct ones
    rows = row[keep].view(-1, k)[:, 0]
    probs = (score[keep] / seen[row[keep]]).view(-1, k)
    return rows, cand[keep].view(-1, k).to(torch.int32), (probs * 255).round().clamp(0, 255).to(torch.uint8)


def capture(engine, manifest: dict[str, Any]) -> WarmState:
    """The engine's learned state as a WarmState (its manifest: `manifest` plus the model and matrix facts)."""
    matrix = engine.matrix
    rows = matrix.filled.nonzero().view(-1).cpu()
    learned = {}
    for name, state in engine.learned().items():  # at most COUNT_CAP trials a key, each key's rate kept
        scale = torch.clamp(COUNT_CAP / state["trials"].clamp(min=1e-9), max=1.0)
        learned[name] = {"hits": state["hits"] * scale, "trials": state["trials"] * scale, "trust": state["trust"]}
    info = {"format": FORMAT, "fingerprint": model_fingerprint(engine), "vocab_size": matrix.vocab_size,
            "k": matrix.k, "rows_filled": int(rows.numel()),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "trust": {name: learned[name]["trust"] for name in DRAFTERS}, **manifest}
    return WarmState(rows=rows, table=matrix.table[rows.to(matrix.device)].cpu().to(torch.int32),
                     probs=matrix.probs[rows.to(matrix.device)].cpu(), learned=learned, manifest=info)
