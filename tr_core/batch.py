"""Continuous batching: many answers decode together, each step's draft trees going through ONE forward.

Every answer keeps its own engine (matrix, drafters, clock), settings and sampling seed, so its tokens are the ones
it gives alone. Rows are ragged: a row's cache holds its own committed entries, the trees are written at the common
end and compacted back per row (kv_cache.BatchKVCache); each row has its own tree mask and position ids, and the
padding of short trees is masked out. Answers join and leave between steps.

    batch = Batch(max_rows=8)
    key = batch.add(engine.fork(), prompt_ids, DecodeConfig(max_new_tokens=64))
    while batch:
        for key, event in batch.step(): ...
"""
from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from .adaptive import DRAFT_MARGIN
from .config import DecodeConfig
from .batch_cost import BatchCost, shared_cost
from .cost import sync
from .decode_state import DecodeState, Drafted
from .engine import Engine
from .events import StepEvent, SummaryEvent
from .kernels import installed
from .kv_cache import BatchKVCache, BatchRow, row_caches
from . import rows_attention
from .prefix import SharedPrefix
from .tree import attention_bias

Event = StepEvent | SummaryEvent
# padded prompt tokens per shared prefill forward: on a 2-core Xeon (SmolLM2-135M) prompts of 119 tokens prefilled
# at 849 tokens/s one at a time, 1,165 four at once, 1,233 eight at once (2026-12-06); more rows mostly delay the first
PREFILL_TOKENS = 512


@dataclass
class Row:
    """One answer in the batch."""

    key: int
    engine: Engine
    state: DecodeState
    stop: Callable[[], bool] | None


class Batch:
    """One decode loop over one model: `add` answers (each with an engine of its own), `step` them together."""

    def __init__(self, max_rows: int = 8) -> None:
        if max_rows < 1:
            raise ValueError("max_rows must be at least 1")
        self.max_rows = max_rows
        self.rows: list[Row] = []
        self.cache = BatchKVCache()
        self._keys = itertools.count()
        self._kernels = contextlib.ExitStack()
        self.cost: BatchCost | None = None  # t(rows, width) of a batched forward, learned online (batch_cost.py)
        self.cap: int | None = None  # the draft nodes per row of the last sized step (None: not sized)
        self.prefix = SharedPrefix()  # the first tokens joining prompts share, prefilled once (prefix.py)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def full(self) -> bool:
        return len(self.rows) >= self.max_rows

    @torch.no_grad()
    def add(self, engine: Engine, prompt_ids: list[int], cfg: DecodeConfig | None = None,
            stop: Callable[[], bool] | None = None, logits_processor: Iterable[Any] = (),
            scores_hook: Callable[[torch.Tensor], None] | None = None) -> int:
        """Prefill a new answer and give it a row; returns its key. The engine must run the batch's model and be in
        no other row (`engine.fork()` gives each answer one that learns on its own). `stop`, `logits_processor`
        and `scores_hook` as for Engine.generate."""
        self._check_joining(engine, [])
        try:
            state = engine.open_answer(prompt_ids, cfg, logits_processor, scores_hook)
        except BaseException:
            self._release_if_empty()
            raise
        return self._take_row(engine, state, stop)

    @torch.no_grad()
    def add_together(self, joining: list[Joining]) -> list[int | Exception]:
        """Several answers at once, their prompts prefilled in ONE forward (right-padded: ModelRunner.prefill_rows;
        PREFILL_TOKENS padded tokens at most is the caller's rule). Returns a key per answer, in order, or the
        error that kept that answer out (a bad prompt); the others join. An error of the shared forward is raised."""
        results: list[int | Exception | None] = []
        opened: list[tuple[Joining, DecodeState]] = []
        for j in joining:
            try:
                self._check_joining(j.engine, [o.engine for o, _ in opened])
                opened.append((j, j.engine.open_answer(j.prompt_ids, j.cfg, prefill=False)))
                results.append(None)
            except Exception as exc:  # noqa: BLE001 - this answer's error, handed back to its caller
                results.append(exc)
        try:
            prefill_together([(o.engine, state) for o, state in opened], self.prefix)
            keys = iter([self._take_row(o.engine, state, o.stop) for o, state in opened])
        finally:
            self._release_if_empty()
        return [next(keys) if r is None else r for r in results]

    def _check_joining(self, engine: Engine, joining: list[Engine]) -> None:
        """Raise unless `engine` may take a row beside the rows and the `joining` engines; install the timed
        products for the batch's first answer."""
        if len(self.rows) + len(joining) >= self.max_rows:
            raise RuntimeError(f"the batch is full ({self.max_rows} rows)")
        others = [row.engine for row in self.rows] + joining
        if others and engine.model is not others[0].model:
            raise ValueError("every answer of a batch must run the same model")
        if any(other is engine or other.matrix is engine.matrix for other in others):
            raise ValueError("this engine already decodes in the batch: give each answer its own (engine.fork())")
        if not others:
            self._install(engine)

    def _install(self, engine: Engine) -> None:
        """The batch's first answer installs the timed products (kernels.py) until the batch empties."""
        if not self.rows and engine.tune_kernels:
            self._kernels.close()
            self._kernels.enter_context(installed(engine.model))

    def _take_row(self, engine: Engine, state: DecodeState, stop: Callable[[], bool] | None) -> int:
        """A prefilled answer's row: its cache copied in; returns its key."""
        self.cache.add_row(state.cache)
        state.cache = BatchRow(self.cache, len(self.rows))
        key = next(self._keys)
        self.rows.append(Row(key, engine, state, stop))
        return key

    def cancel(self, key: int) -> SummaryEvent | None:
        """End an answer now (its visitor left): its row is freed; returns its summary, None if unknown."""
        for i, row in enumerate(self.rows):
            if row.key == key:
                row.state.stop_reason = "stopped"
                self._drop({i})
                return row.engine.close_answer(row.state)
        return None

    @torch.no_grad()
    def step(self) -> list[tuple[int, Event]]:
        """One step of every row: each drafts, ONE forward verifies all the trees, each settles on its own logits.
        Returns (key, event) pairs: a StepEvent per row, and a SummaryEvent for each answer that ended."""
        if not self.rows:
            return []
        self._size_trees()
        drafted = [row.engine.draft_step(row.state) for row in self.rows]
        forwarded = [d.logits is None for d in drafted]
        logits = self._forward(drafted, forwarded) if any(forwarded) else None
        return self._settle(list(range(len(self.rows))), drafted, logits)

    @torch.no_grad()
    def first_steps(self) -> list[tuple[int, Event]]:
        """Step only the rows whose step needs no forward (answers that just joined: the prompt's forward verified
        their first step), so each shows its first token at once while others still join. Events as `step`'s."""
        ready = [i for i, row in enumerate(self.rows) if row.state.verified_first]
        drafted = [self.rows[i].engine.draft_step(self.rows[i].state) for i in ready]
        return self._settle(ready, drafted, None)

    def _settle(self, indices: list[int], drafted: list[Drafted],
                logits: torch.Tensor | None) -> list[tuple[int, Event]]:
        """Settle rows `indices` on their logits (row i of the shared forward's, or their own); drop ended ones."""
        out, ended = [], set()
        for i, d in zip(indices, drafted):
            row, f = self.rows[i], d.logits is None
            d.timer.mark("forward")
            row.state.cache.forwarded = f
            own = logits[i, : d.draft.size] if f else d.logits
            event, finished = row.engine.settle_step(row.state, d, own, alone=len(self.rows) == 1)
            out.append((row.key, event))
            if not finished and row.stop is not None and row.stop():
                row.state.stop_reason, finished = "stopped", True
            if finished:
                out.append((row.key, row.engine.close_answer(row.state)))
                ended.add(i)
        self._drop(ended)
        return out

    def _forward(self, drafted: list[Drafted], forwarded: list[bool]) -> torch.Tensor:
        """ONE forward of every forwarded row's tree (padded to the widest), each at its own positions and mask,
        each row's attention reading only its own keys (rows_attention.py)."""
        runner = self.rows[0].engine.runner
        width = max(d.draft.size for d, f in zip(drafted, forwarded) if f)
        starts = self.cache.begin_forward(width)
        pasts = [row.state.past for row in self.rows]
        device = runner.device
        ids = torch.zeros(len(self.rows), width, dtype=torch.long, device=device)
        positions = torch.tensor(pasts, dtype=torch.long, device=device)[:, None].repeat(1, width)
        for i, (d, f) in enumerate(zip(drafted, forwarded)):
            if f:
                ids[i, : d.draft.size] = d.draft.tokens
                positions[i, : d.draft.size] += d.draft.depths
        mask = batch_mask(runner, [d.draft if f else None for d, f in zip(drafted, forwarded)], pasts, starts, width)
        for d in drafted:
            d.timer.forward_begins()
        began = time.perf_counter()
        with rows_attention.rows(runner, [s + width for s in starts], needs_mask(runner, starts, width)):
            logits = runner.forward_rows(ids, positions, mask, self.cache)
        for d in drafted:
            d.timer.forward_ends()
        if self.cost is not None:
            sync(device)
            self.cost.observe(len(self.rows), width, (time.perf_counter() - began) * 1e3)
        return logits

    def _size_trees(self) -> None:
        """Cap the cost-sized rows' trees for this step (`tree_width`): a shared forward pays for every row's tree,
        so trees shrink as the batch grows; a row alone drafts as it would alone."""
        sized = []
        for row in self.rows:
            row.state.drafter.cap = None
            curve = row.state.drafter.next_curve()
            if curve is not None:
                sized.append((row.state.drafter, curve))
        self.cap = None
        if len(self.rows) < 2 or not sized:
            return
        if self.cost is None:  # what this model's batches timed, shaped by the first sized row's alone curve
            self.cost = shared_cost(self.rows[0].engine.runner.model, sized[0][0].cost)
        self.cap = tree_width([curve for _, curve in sized], len(self.rows), self.cost)
        for drafter, _ in sized:
            drafter.cap = self.cap

    def _drop(self, ended: set[int]) -> None:
        """Free the rows of ended answers; the others keep their order."""
        if not ended:
            return
        keep = [i for i in range(len(self.rows)) if i not in ended]
        for i in ended:
            self.rows[i].state.drafter.cap = None  # the engine may decode alone again
        self.cache.drop_rows(keep)
        self.rows = [self.rows[i] for i in keep]
        for i, row in enumerate(self.rows):
            row.state.cache.row = i
        self._release_if_empty()

    def _release_if_empty(self) -> None:
        if not self.rows:
            self._kernels.close()
            self._kernels = contextlib.ExitStack()


class Joining(NamedTuple):
    """An answer asking for a row (Batch.add_together)."""

    engine: Engine
    prompt_ids: list[int]
    cfg: DecodeConfig | None = None
    stop: Callable[[], bool] | None = None


def prefill_group(lengths: list[int], free: int, budget: int = PREFILL_TOKENS) -> int:
    """How many of the first prompts in line (`lengths`) to prefill in one forward: as many as have a free row and
    keep the padded forward (count x longest) within `budget` tokens; at least one."""
    count, longest = 0, 0
    for n in lengths[: max(free, 1)]:
        if count and (count + 1) * max(longest, n) > budget:
            break
        count, longest = count + 1, max(longest, n)
    return max(count, 1) if lengths else 0


def prefill_together(opened: list[tuple[Engine, DecodeState]], prefix: SharedPrefix | None = None) -> None:
    """Run the prompts of answers opened without their prefill (Engine.open_answer(prefill=False)): in ONE forward
    when the model can keep only the logits read, after the first tokens they share with each other or with what
    `prefix` holds (run once: prefix.py), else one by one."""
    todo = [(engine, state) for engine, state in opened if state.prefill_ids]
    runner = opened[0][0].runner if opened else None
    ids = [state.prefill_ids for _, state in todo]
    # exact mode: each prompt's forward as it runs alone (they are not row-invariant: invariant.relaxed)
    together = bool(todo) and not any(engine.exact for engine, _ in todo) and runner.has_logits_to_keep
    past, start = prefix.take(runner, ids) if prefix is not None and together and shares_prefix(runner) else (None, 0)
    if (len(todo) > 1 or past is not None) and together:
        logits, shared = runner.prefill_rows([p[start:] for p in ids], past, start)
        for i, (solo, (engine, state)) in enumerate(zip(row_caches(shared, [len(p) for p in ids]), todo)):
            state.cache = solo
            engine.finish_prefill(state, logits[i : i + 1])
    else:
        for engine, state in todo:
            engine.finish_prefill(state, runner.prefill(state.prefill_ids, state.cache))
    for engine, state in opened:
        if state.prefill_ids is not None:  # nothing to run (a one-token prompt whose first step drafts a tree)
            engine.finish_prefill(state, None)


def shares_prefix(runner: Any) -> bool:
    """Whether prompts may start from a shared prefix's cache: a model that keeps only the logits read, and no
    sliding window (whose masks would need the prefix's positions counted per layer kind)."""
    return runner.has_logits_to_keep and runner.window is None


def tree_width(curves: list[list[float]], rows: int, cost: Callable[[int, int], float]) -> int:
    """The draft nodes per row that maximise the batch's expected tokens per ms: a shared forward of `rows` trees
    costs cost(rows, m + 1) (short trees are padded to the widest), and each sized row gains its curve up to m
    (`curves`: expected accepted tokens of each row's best m nodes; every row emits one token more). 0: a plain
    step, unless drafting beats it by DRAFT_MARGIN, as alone."""
    best, best_rate = 0, DRAFT_MARGIN * rows / cost(rows, 1)
    for m in range(1, max(len(c) for c in curves)):
        rate = (rows + sum(c[min(m, len(c) - 1)] for c in curves)) / cost(rows, m + 1)
        if rate > best_rate:
            best, best_rate = m, rate
    return best


def batch_mask(runner: Any, drafts: list, pasts: list[int], starts: list[int], width: int) -> Any:
    """The additive masks [B, 1, width, max(starts) + width] of a batched forward (one per layer kind for mixed
    models): row i sees its own committed entries [0, pasts[i]) and its tree's ancestors, written from starts[i]
    (BatchKVCache); its padding queries, and every query of a row not verified here (draft None), see only
    themselves."""
    kinds = {"full_attention": None}
    if runner.window is not None:
        kinds = {"sliding_attention": runner.window, **(kinds if runner.mixed_layers else {})}
    masks = {}
    pad = torch.arange(width, device=runner.device)
    at = torch.tensor(starts, dtype=torch.long, device=runner.device)
    for kind, window in kinds.items():
        big = torch.full((len(pasts), 1, width, max(starts) + width), torch.finfo(runner.dtype).min,
                         dtype=runner.dtype, device=runner.device)
        big[torch.arange(len(pasts), device=runner.device)[:, None], 0, pad[None], at[:, None] + pad[None]] = 0
        for i, (draft, past) in enumerate(zip(drafts, pasts)):
            if draft is None:
                continue
            n = draft.size
            bias = attention_bias(draft.tree_mask, past, runner.dtype, window, draft.depths)[0, 0]
            big[i, 0, :n, :past] = bias[:, :past]
            big[i, 0, :n, starts[i] : starts[i] + n] = bias[:, past:]
        masks[kind] = big
    return masks if len(masks) > 1 else next(iter(masks.values()))


def needs_mask(runner: Any, starts: list[int], width: int) -> bool:
    """Whether a row reading only its own keys still needs its mask: not for one token a row that sees every key
    it reads, as alone (ModelRunner.sees_every_key)."""
    return width > 1 or not runner.sees_every_key(max(starts))


def generate_batch(engine: Engine, prompts: list[list[int]], cfg: DecodeConfig | None = None,
                   max_rows: int = 8) -> Iterator[tuple[int, Event]]:
    """Answer several prompts together: (prompt index, event) pairs as they come. Each prompt decodes with its own
    fork of `engine` (the same tokens it gives alone); at most `max_rows` at once, the rest join as rows free up."""
    batch, waiting, index = Batch(max_rows), list(enumerate(prompts)), {}
    try:
        while waiting or batch:
            while waiting and not batch.full:
                group = [waiting.pop(0) for _ in range(prefill_group([len(p) for _, p in waiting],
                                                                     batch.max_rows - len(batch)))]
                keys = batch.add_together([Joining(engine.fork(), prompt, cfg) for _, prompt in group])
                for (i, _), key in zip(group, keys):
                    if isinstance(key, Exception):
                        raise key
                    index[key] = i
            for key, event in batch.step():
                yield index[key], event
    finally:
        for row in list(batch.rows):
            batch.cancel(row.key)
