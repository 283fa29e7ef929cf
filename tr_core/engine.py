"""The Token Recycling engine: a generator of plain-data step events over an unmodified transformers model.

Each step is a short pipeline (paper Sec. 3), one small function each:
draft (the drafter proposes a tree) -> forward (ONE forward with a tree attention mask) -> verify (longest
agreeing path + bonus token) -> update (recycle every node's top-k into the matrix; the drafter's look-ahead)
-> sync (one host copy, `SyncPacket`) -> commit (emit, EOS and length inside the accepted path, KV
compaction) -> learn (the drafter observes the step) -> a StepEvent. The phase timings carry these names.
Which tree is drafted is the drafter's business (drafters.py, adaptive.py): the engine never asks its kind.
An answer's first step is drafted before the prompt's forward; when it drafts nothing, that forward takes the
prompt's last token too and verifies it (`_prefill`), so the step runs no forward of its own.
What the answers teach (matrix, drafters, clock) is owned by the base class (engine_state.py); verification's pure
functions live in verify.py; the microscope's provenance (provenance.py) is gathered only when a config asks.
"""
from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from .config import DecodeConfig
from .cost import StepClock, sync
from .drafters import Draft, DraftContext, Drafter, PlainDrafter, StaticTreeDrafter, StepResult
from .engine_state import EngineState
from .events import EVENT_DIGITS, StepEvent, SummaryEvent
from .invariant import LOW_PRECISION
from .kernels import installed, needs_tuning, use_exact
from .decode_state import DecodeState, Drafted
from .kv_cache import TreeKVCache
from .packet import SyncPacket
from .prompt import check_prompt, encode_chat, stop_tokens, token_text
from .provenance import event_fields, gather
from .reduce import row_argmax, top_rows
from .runner import ModelRunner
from .sampling import build_processors, choose_tokens, needs_prefix, node_prefixes, process
from .tree import DYNAMIC, HYBRID, HYBRID_FIXED, DraftTree, build_tree, resolve_template
from .tuning import ensure_tuned
from .verify import accept_tokens, path_to, verify_tree

class Engine(EngineState):
    """A model, its tokenizer and what answers teach it (EngineState: the adjacency matrix, the drafters' learned
    state, the matrix clock) across `generate` calls."""

    def __init__(self, model, tokenizer, topk_candidates: int = 8, tune_kernels: bool = True,
                 exact: bool | None = None):
        self.model = model
        self.tokenizer = tokenizer
        self.runner = ModelRunner(model)
        self.device, self.dtype = self.runner.device, self.runner.dtype
        # exact mode (invariant.py): row-invariant products, so trees and plain decoding round alike; by default in
        # bfloat16 and float16, where near ties are common. It is the model's plan, shared by its engines.
        self.exact = use_exact(model, exact if exact is not None else self.dtype in LOW_PRECISION)
        # on a CPU: each linear layer's product chosen by timing (kernels.py); the exact plan is installed alike
        self.tune_kernels = tune_kernels or self.exact
        self.vocab_size = self.runner.vocab_size()
        super().__init__(self.device, self.vocab_size, topk_candidates)
        self.stop_token_ids = stop_tokens(model, tokenizer, self.vocab_size)
        self.context_limit = self.runner.context_limit()
        self._static: dict[Any, StaticTreeDrafter] = {}  # per template, built once (a fork shares them)
        self.plain = PlainDrafter(self.device)
        # The prompt's forward includes its last token, whose logits then verify a first step that drafts nothing
        # (as `adaptive` and `hybrid` do, and plain decoding): one forward fewer per answer. Off: a tree forward.
        self.first_step_from_prompt = True

    def on_model(self, model: Any) -> "Engine":
        """This engine running `model` (None: parked, holding no reference to a model), sharing all it learned: the
        matrix, drafters and clock are the same objects (transformers' `generate` keeps them beside the model)."""
        twin = copy.copy(self)
        twin.runner = copy.copy(self.runner)
        twin.model = twin.runner.model = model
        return twin

    def fork(self, sizes: list[int] | None = None) -> "Engine":
        """EngineState.fork, with static drafters of its own (they carry an answer's look-ahead, so two answers
        decoding at once must not share one); the trees themselves are shared."""
        twin = super().fork(sizes)
        twin._static = {key: StaticTreeDrafter(drafter.tree) for key, drafter in self._static.items()}
        return twin

    # -- chat helpers -----------------------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt ids for a conversation: the model's chat template, or plain 'Role: text' turns without one."""
        return encode_chat(self.tokenizer, messages)

    def decode(self, ids: list[int]) -> str:
        """Text of some token ids, special tokens dropped."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """Display text of one token; one holding part of a character shows that part's bytes ('‹e4bd›')."""
        return token_text(self.tokenizer, token_id)

    def check_prompt(self, prompt_ids: list[int] | torch.Tensor) -> list[int]:
        """The prompt as a list of ids; raises ValueError when it is empty, not one sequence, holds ids outside the
        vocabulary or does not fit the model's context (a [1, L] tensor is one sequence)."""
        return check_prompt(prompt_ids, self.vocab_size, self.context_limit)

    # -- drafters ---------------------------------------------------------------------------------------------
    def static_tree(self, template: str | list) -> DraftTree:
        """The DraftTree for a named or user template, built once and cached on the model's device."""
        return self._static_drafter(template).tree

    def _static_drafter(self, template: str | list) -> StaticTreeDrafter:
        key = template if isinstance(template, str) else tuple(map(tuple, template))
        if key not in self._static:
            name, paths = resolve_template(template, self.matrix.k)
            self._static[key] = StaticTreeDrafter(build_tree(name, paths, self.device))
        return self._static[key]

    def drafter_for(self, cfg: DecodeConfig) -> Drafter:
        """The drafter a configuration asks for: plain, a static template, the adaptive or the hybrid tree."""
        if cfg.plain:
            return self.plain
        if cfg.template in (HYBRID, HYBRID_FIXED):
            return self.hybrid
        if cfg.template in DYNAMIC:
            return self.adaptive
        return self._static_drafter(cfg.template)

    def times_forwards_first(self, cfg: DecodeConfig) -> bool:
        """True when an answer with `cfg` will first time this device's forwards (a pause of seconds before its first
        step, once per engine): callers can say so."""
        return self._kernels_untuned() or self.drafter_for(cfg).times_forwards(cfg)

    def _kernels_untuned(self) -> bool:
        return self.tune_kernels and needs_tuning(self.model, self.device)

    # -- decoding ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt_ids: list[int], cfg: DecodeConfig | None = None, stop: Callable[[], bool] | None = None,
                 logits_processor: Iterable[Any] = (),
                 scores_hook: Callable[[torch.Tensor], None] | None = None) -> Iterator[StepEvent | SummaryEvent]:
        """Decode after `prompt_ids`, yielding a StepEvent per step, then a SummaryEvent.

        `stop`, polled after every step, ends the answer early (stop_reason "stopped"). `logits_processor`:
        extra transformers processors, each applied to every tree node with its own prefix (others are refused).
        `scores_hook(scores)`: called each step with the processed scores [emitted, V] that chose each emitted
        token (for transformers' `output_scores`); it costs a copy of those rows.
        """
        cfg = cfg or DecodeConfig()
        prompt = self.check_prompt(prompt_ids)
        drafter = self.drafter_for(cfg)
        processors = build_processors(cfg, logits_processor)
        # The timed matrix products (kernels.py) ride this answer only, reference-counted per model: the last answer
        # running on it gives the model back as it was, also when it is closed early or raises.
        with installed(self.model) if self.tune_kernels else contextlib.nullcontext():
            state = self._begin(prompt, cfg, drafter, processors, scores_hook)
            while True:
                event, finished = self.step(state)
                yield event
                if finished:
                    break
                if stop is not None and stop():
                    state.stop_reason = "stopped"
                    break
            yield self.close_answer(state)

    def open_answer(self, prompt_ids: list[int], cfg: DecodeConfig | None = None, logits_processor: Iterable[Any] = (),
                    scores_hook: Callable[[torch.Tensor], None] | None = None, prefill: bool = True) -> DecodeState:
        """An answer ready for its first step (the prompt checked, seeded and prefilled), for callers that run the
        steps themselves (batch.py); `generate` is the usual way. The caller installs the timed products. With
        `prefill` False the prompt's forward is left to the caller: `state.prefill_ids` go through the model into
        `state.cache` (several answers' in one forward: batch.py), then `finish_prefill` takes the last logits."""
        cfg = cfg or DecodeConfig()
        prompt = self.check_prompt(prompt_ids)
        return self._begin(prompt, cfg, self.drafter_for(cfg), build_processors(cfg, logits_processor), scores_hook,
                           prefill)

    def _begin(self, prompt: list[int], cfg: DecodeConfig, drafter: Drafter, processors: list,
               scores_hook: Callable[[torch.Tensor], None] | None, prefill: bool = True) -> DecodeState:
        """Seed the matrix from the prompt if asked, let the drafter prepare and draft the first step, prefill."""
        t_start = time.perf_counter()
        seeding = cfg.prompt_seeding if cfg.prompt_seeding is not None else drafter.seeds_prompt
        start = self.clock.start_answer()
        if seeding and drafter.recycles:
            self.matrix.seed_from_text(prompt, stamp=start)
        self.clock.tick += 1
        if self.tune_kernels:
            ensure_tuned(self.runner, prompt)  # once per model: a no-op when tuned, on a GPU or without linear layers
        drafter.begin(DraftContext(prompt=prompt, cfg=cfg, matrix=self.matrix, runner=self.runner, answer_start=start))
        budget = min(cfg.max_new_tokens, self.context_limit - len(prompt))
        context = None
        if needs_prefix(processors):
            context = torch.zeros(len(prompt) + budget, dtype=torch.long, device=self.device)
            context[: len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        stop_ids = sorted(set(cfg.stop_token_ids if cfg.stop_token_ids is not None else self.stop_token_ids))
        state = DecodeState(prompt_len=len(prompt), cache=TreeKVCache(), stop_ids=set(stop_ids),
                            stop_tensor=torch.tensor(stop_ids, dtype=torch.long, device=self.device),
                            past=len(prompt) - 1, budget=budget, context=context, committed=len(prompt),
                            root=torch.tensor([prompt[-1]], dtype=torch.long, device=self.device), out=[],
                            cfg=cfg, drafter=drafter, processors=processors, scores_hook=scores_hook, opened_at=t_start)
        active = self._active(state, drafter)
        draft = active.draft(state.root, self.matrix)
        # the prompt's forward: the whole prompt when the first draft is the root alone (its last logits verify the
        # step), else, and always in exact mode (invariant.relaxed), all but the last token, for the step's forward
        verifies = draft.size == 1 and self.first_step_from_prompt and not self.exact
        state.first, state.prefill_ids = (active, draft, None), prompt if verifies else prompt[:-1]
        if prefill:
            self.finish_prefill(state, self.runner.prefill(state.prefill_ids, state.cache))
        return state

    def finish_prefill(self, state: DecodeState, last_logits: torch.Tensor | None) -> None:
        """The prompt's forward has run into `state.cache`: its last row of logits [1, V] verifies the first step
        when that step drafts the root alone (else it is not needed); the answer's clock starts."""
        active, draft, _ = state.first
        verifies = last_logits is not None and len(state.prefill_ids) == state.prompt_len
        state.first = (active, draft, last_logits if verifies else None)
        state.prefill_ids = None
        sync(self.device)
        state.prefill_s = time.perf_counter() - state.opened_at
        state.decode_start = time.perf_counter()

    def _active(self, state: DecodeState, drafter: Drafter) -> Drafter:
        """The answer's drafter, or plain decoding where its deepest draft would pass the model's context."""
        return drafter if state.past + drafter.max_depth < self.context_limit else self.plain

    def step(self, state: DecodeState) -> tuple[StepEvent, bool]:
        """One decoding step of an open answer: draft -> forward -> verify -> update -> sync -> commit -> learn."""
        drafted = self.draft_step(state)
        logits = drafted.logits
        if logits is None:
            logits = self._forward(state, drafted.draft, drafted.timer)
        drafted.timer.mark("forward")
        return self.settle_step(state, drafted, logits)

    def draft_step(self, state: DecodeState) -> Drafted:
        """The step's draft (its logits too when the prompt's forward already verified it), its clock running."""
        timer = StepClock(self.device, state.cfg.sync_timings)
        active, draft, logits = self._draft(state, state.drafter)
        timer.mark("draft")
        return Drafted(active, draft, logits, timer)

    def _draft(self, state: DecodeState, drafter: Drafter) -> tuple[Drafter, Draft, torch.Tensor | None]:
        """The step's drafter and draft, with the logits that verify it when the prompt's forward already ran it."""
        if state.first is not None:  # drafted, and perhaps verified by the prompt's forward, in `_begin`
            first, state.first = state.first, None
            return first
        active = self._active(state, drafter)
        return active, active.draft(state.root, self.matrix), None

    def settle_step(self, state: DecodeState, drafted: Drafted, logits: torch.Tensor,
                    alone: bool = True) -> tuple[StepEvent, bool]:
        """Everything after the forward: verify -> update -> sync -> commit -> learn, and the step's event (the
        batched loop, batch.py, runs one forward for many answers and settles each on its own rows of logits;
        `alone` False: the forward was shared, so its time is not this tree's cost to learn)."""
        cfg, (active, draft, _, timer) = state.cfg, drafted
        forwarded = drafted.logits is None
        targets, best, top = self._verify(state, cfg, draft, logits, state.processors, active.recycles)
        timer.mark("verify")
        packet = self._update(active, draft, logits, top, targets, best, cfg.provenance)
        timer.mark("update")
        host = packet.sync()  # the one host sync of the step
        timer.mark("sync")
        position = state.past
        accepted, emitted, bonus, finished = self._commit(state, draft, host)
        timer.mark("commit")
        so_far = timer.timings()
        active.observe(StepResult(parents=host["parents"], accepted=accepted, emitted=emitted,
                                  forward_tokens=draft.size, forward_ms=so_far["forward"], step_ms=so_far["total"],
                                  extras=_drafter_part(host), forwarded=forwarded and alone))
        timer.mark("learn")
        self.clock.tick += 1
        timings = timer.timings()
        state.forward_ms += timings["forward"]
        state.overhead_ms += timings["total"] - timings["forward"]
        state.steps += 1
        event = self._event(state.steps - 1, position, draft, host, accepted, emitted, bonus, timings,
                            active.recycles and cfg.provenance)
        return event, finished

    def _forward(self, state: DecodeState, draft: Draft, timer: StepClock) -> torch.Tensor:
        """ONE forward of the whole tree at positions past + depth, with the tree attention mask. [N, V]."""
        state.cache.require_length(state.past)
        mask = self.runner.mask(draft.tree_mask, draft.depths, state.past)
        timer.forward_begins()
        logits = self.runner.forward(draft.tokens[None], (state.past + draft.depths)[None], mask, state.cache)
        timer.forward_ends()
        return logits

    def _verify(self, state: DecodeState, cfg: DecodeConfig, draft: Draft, logits: torch.Tensor, processors,
                recycles: bool) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """The model's choice at every node (processed as `generate` would) and the end of the accepted path."""
        top = top_rows(logits, self.matrix.k) if recycles else None  # argmax and the matrix update's top-k
        early = len(state.out) < cfg.min_new_tokens
        if cfg.greedy and not processors and not early and state.scores_hook is None:
            targets = top[0] if top is not None else row_argmax(logits)
        else:
            scores = self._scores(state, cfg, draft, logits, processors)
            targets = choose_tokens(scores, cfg, state.past + 1, draft.depths, draft.levels)
        best = verify_tree(draft.tokens, targets, draft.parents, draft.depths, draft.tree_mask)
        if state.scores_hook is not None:  # the rows that chose the emitted tokens: the accepted path's nodes
            state.scores_hook(scores[draft.tree_mask[best]].clone())
        return targets, best, top

    def _scores(self, state: DecodeState, cfg: DecodeConfig, draft: Draft, logits: torch.Tensor,
                processors) -> torch.Tensor:
        """Every node's processed scores [N, V] (fp32): the processors with each node's prefix, then min_new_tokens."""
        prefixes = None
        if state.context is not None:
            prefixes = node_prefixes(state.context[: state.committed], draft.tokens, draft.tree_mask)
        scores = process(logits, processors, prefixes)
        if len(state.out) < cfg.min_new_tokens and state.stop_tensor.numel():
            if scores.data_ptr() == logits.data_ptr():
                scores = scores.clone()  # the matrix update still reads the raw logits
            too_early = (len(state.out) + draft.depths) < cfg.min_new_tokens  # [N]: the token after node i is early
            scores[too_early.nonzero(as_tuple=True)[0][:, None], state.stop_tensor[None, :]] = float("-inf")
        return scores

    def _update(self, drafter: Drafter, draft: Draft, logits: torch.Tensor, top: tuple | None,
                targets: torch.Tensor, best: torch.Tensor, provenance: bool) -> SyncPacket:
        """Recycle every node's top-k into the matrix (Sec. 3.3), let the drafter look ahead; gather the sync (and,
        when asked, the rows read and the candidates' origins before the rewrite: tr_core.provenance)."""
        packet = SyncPacket().update({"best": best.view(1), "targets": targets, "tokens": draft.tokens,
                                      "parents": draft.parents, "depths": draft.depths, "ranks": draft.ranks})
        if draft.node_probs is not None:
            packet.add("node_probs", draft.node_probs)
        packet.update({f"drafter.{k}": v for k, v in draft.extras.items()})
        if drafter.recycles:
            if provenance:
                packet.update(gather(self.matrix, draft))
            first, row_ids, row_probs = self.matrix.update(draft.tokens, logits, top=top[1:], consume=True,
                                                           stamp=self.clock.tick, path=draft.tree_mask[best])
            # as the matrix stores them (the same float32 ops as its update): every figure of a row then agrees
            packet.update({"first": first, "row_ids": row_ids, "row_probs": row_probs.mul(255).round_()})
            ahead = drafter.lookahead(targets[best].view(1), self.matrix)
            packet.update({f"drafter.{k}": v for k, v in ahead.items()})
        return packet

    def _commit(self, state: DecodeState, draft: Draft,
                host: dict[str, list]) -> tuple[list[int], list[int], int | None, bool]:
        """Emit the accepted path and the bonus (EOS and length checked inside it); keep their KV entries."""
        best = host["best"][0]
        host["parents"][0], host["ranks"][0] = -1, -1
        accepted = path_to(host["parents"], best)
        path_tokens = [host["tokens"][j] for j in accepted[1:]]
        emitted, reason = accept_tokens(path_tokens, host["targets"][best], state.stop_ids,
                                        state.budget - len(state.out))
        bonus = emitted[-1] if len(emitted) == len(accepted) else None
        state.out.extend(emitted)
        finished = reason is not None
        if reason is not None:
            state.stop_reason = reason
        else:
            state.cache.keep(state.past, accepted)
            state.past += len(accepted)
            state.root = torch.tensor([bonus], dtype=torch.long, device=self.device)
            if state.context is not None:
                state.context[state.committed : state.committed + len(emitted)] = torch.tensor(emitted)
                state.committed += len(emitted)
        return accepted, emitted, bonus, finished

    def _event(self, step: int, position: int, draft: Draft, host: dict[str, list], accepted: list[int],
               emitted: list[int], bonus: int | None, timings: dict[str, float], provenance: bool) -> StepEvent:
        """The step as plain data (`provenance`: a recycling step that gathered its provenance)."""
        rows, values, probs = [], [], []
        k = self.matrix.k
        for j, first in enumerate(host.get("first", [])):
            if first:
                rows.append(host["tokens"][j])
                values.append(host["row_ids"][j * k : (j + 1) * k])
                probs.append([round(q / 255, EVENT_DIGITS) for q in host["row_probs"][j * k : (j + 1) * k]])
        node_probs = [round(p, EVENT_DIGITS) for p in host["node_probs"]] if "node_probs" in host else None
        recorded = event_fields(host, draft.sources, rows, k, self.clock.origin_of) if provenance else {}
        return StepEvent(step=step, position=position, tokens=host["tokens"], parents=host["parents"],
                         depths=host["depths"], ranks=host["ranks"], accepted=accepted, emitted=emitted, bonus=bonus,
                         timings=timings, matrix_rows=rows, matrix_values=values, matrix_probs=probs,
                         node_probs=node_probs, template=draft.name,
                         sources=list(draft.sources) if draft.sources is not None else None,
                         origins=list(draft.origins) if draft.origins is not None else None,
                         answer=self.clock.answer, choices=host["targets"], **recorded, **self._no_draft(draft, host))

    def _no_draft(self, draft: Draft, host: dict[str, list]) -> dict[str, Any]:
        """The event's `no_draft` reason and `unverified` tree: set when the drafter says why it drafted nothing."""
        if draft.no_draft is None or draft.size != 1:
            return {}
        return {"no_draft": draft.no_draft.as_data(),
                "unverified": draft.no_draft.unverified()}

    def close_answer(self, state: DecodeState) -> SummaryEvent:
        """The end of the answer."""
        cfg, prefill_s, decode_s = state.cfg, state.prefill_s, time.perf_counter() - state.decode_start
        n, steps = len(state.out), max(state.steps, 1)
        return SummaryEvent(
            tokens=state.out, prompt_tokens=state.prompt_len,
            new_tokens=n, steps=state.steps, mean_accepted=n / steps, tokens_per_s=n / max(decode_s, 1e-9),
            prefill_s=prefill_s, decode_s=decode_s, wall_s=prefill_s + decode_s, stop_reason=state.stop_reason,
            method="plain" if cfg.plain else "recycling", template="" if cfg.plain else self._template_name(cfg),
            matrix_rows_filled=self.matrix.rows_filled, matrix_mb=self.matrix.size_mb,
            overhead_ms=state.overhead_ms / steps, forward_ms=state.forward_ms / steps)

    def _template_name(self, cfg: DecodeConfig) -> str:
        return cfg.template if cfg.template in DYNAMIC else self.static_tree(cfg.template).name


def _drafter_part(host: dict[str, list]) -> dict[str, list]:
    """The synced tensors a drafter registered (under "drafter."), by their own names."""
    return {k[len("drafter."):]: v for k, v in host.items() if k.startswith("drafter.")}
