"""The Token Recycling engine: a generator of plain-data step events over an unmodified transformers model.

Each step is a short pipeline (paper Sec. 3): draft the tree from the adjacency matrix -> ONE forward with a
tree attention mask -> verify (longest agreeing path + bonus token) -> keep the accepted KV entries ->
recycle every node's top-k into the matrix -> yield a StepEvent. One host sync per step.
Plain decoding runs through the same loop with a one-node tree and no matrix update.
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from .adaptive import AdaptiveDrafter
from .config import DecodeConfig
from .events import StepEvent, SummaryEvent
from .kv_cache import TreeKVCache
from .matrix import AdjacencyMatrix
from .reduce import top_rows
from .sampling import choose_tokens
from .tree import ADAPTIVE, DYNAMIC, DraftTree, attention_bias, bfs_draft, build_tree, resolve_template, tree_from_parents

# Token strings that end a chat turn in common chat templates (used when they are single tokens of the vocabulary).
_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "<|end_of_text|>", "</s>",
                "<|eom_id|>", "<turn|>")


def verify_tree(tokens: torch.Tensor, targets: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor,
                tree_mask: torch.Tensor) -> torch.Tensor:
    """The deepest node whose whole path agrees with the model: the end of the accepted path (Sec. 3.2).

    tokens, targets, parents, depths: [N] long; tree_mask: [N, N] bool ancestry. A node is accepted when it and
    every ancestor equal the model's choice at their parent. Siblings hold distinct candidates, so at most one
    child can match: this equals walking the tree from the root. Returns the node index [] (0 = nothing accepted).
    """
    ok = tokens == targets[parents]  # [N]; ok[i]: node i is what the model chose after its parent
    ok[0] = True
    accepted = ~(tree_mask & ~ok[None, :]).any(dim=1)  # [N]
    return torch.argmax(torch.where(accepted, depths, -1))  # first of the deepest: deterministic


def path_to(parents: list[int] | tuple[int, ...], node: int) -> list[int]:
    """Node indices from the root down to `node`."""
    path = [node]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    return path[::-1]


class Engine:
    """Holds a model, its tokenizer and the adjacency matrix that persists across `generate` calls."""

    def __init__(self, model, tokenizer, topk_candidates: int = 8):
        self.model = model
        self.tokenizer = tokenizer
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
        self.config = config
        attn = getattr(config, "_attn_implementation", None) or "eager"
        if "flash" in attn or "flex" in attn:
            raise ValueError(f"attention '{attn}' cannot take a tree mask; load the model with attn_implementation='sdpa'")
        layer_types = getattr(config, "layer_types", None) or []
        if "chunked_attention" in layer_types:
            raise ValueError("chunked-attention models are not supported yet")
        self.window: int | None = getattr(config, "sliding_window", None)
        self._mixed_layers = "sliding_attention" in layer_types
        if layer_types and not self._mixed_layers:
            self.window = None  # the config names a window but no layer uses it (e.g. Qwen2 defaults)
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._has_logits_to_keep = "logits_to_keep" in params
        self.vocab_size = self._probe_vocab()
        self.matrix = AdjacencyMatrix(self.vocab_size, topk_candidates, self.device)
        self.stop_token_ids = self._stop_tokens()
        self.context_limit = self._context_limit()
        self._trees: dict[Any, DraftTree] = {}
        self.adaptive = AdaptiveDrafter(self.device)

    # -- model plumbing ---------------------------------------------------------------------------------------
    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, mask: Any, cache: TreeKVCache,
                 last_only: bool = False) -> torch.Tensor:
        """One forward of [1, N] tokens; returns logits [N, V] (or [1, V] with last_only)."""
        kwargs = {"input_ids": input_ids, "position_ids": position_ids, "attention_mask": mask,
                  self._cache_arg: cache, "use_cache": True}
        if last_only and self._has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        logits = out.logits[0]
        return logits[-1:] if last_only else logits

    @torch.no_grad()
    def _probe_vocab(self) -> int:
        """V from the logits' last dimension (tokenizers often report fewer ids than the model scores)."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        return self._forward(ids, ids, None, TreeKVCache()).shape[-1]

    def _stop_tokens(self) -> list[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for source in (getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, (list, tuple)):
                ids.update(int(i) for i in source)
        vocab = self.tokenizer.get_vocab()
        for text in _END_OF_TURN:
            if text in vocab and text in getattr(self.tokenizer, "all_special_tokens", []) + list(
                getattr(self.tokenizer, "added_tokens_encoder", {})
            ):
                ids.add(vocab[text])
        return sorted(i for i in ids if 0 <= i < self.vocab_size)

    def _context_limit(self) -> int:
        for name in ("max_position_embeddings", "n_positions", "n_ctx"):
            value = getattr(self.config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return 1 << 30

    def _mask(self, tree: DraftTree, past: int) -> Any:
        """The additive tree mask for this model: one tensor, or one per layer type for mixed sliding models.

        A one-token step sees everything (within any window): no mask, so the model takes its usual fast path.
        """
        if tree.size == 1 and (self.window is None or past + 1 < self.window):
            return None
        full = attention_bias(tree.tree_mask, past, self.dtype)
        if self.window is None:
            return full
        sliding = attention_bias(tree.tree_mask, past, self.dtype, self.window, tree.depths)
        if self._mixed_layers:
            return {"full_attention": full, "sliding_attention": sliding}
        return sliding

    # -- chat helpers -----------------------------------------------------------------------------------------
    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Prompt ids for a conversation: the model's chat template, or plain 'Role: text' turns without one."""
        if not messages:
            raise ValueError("no messages to encode")
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
        return self.tokenizer("\n\n".join(lines) + "\n\nAssistant:")["input_ids"]

    def decode(self, ids: list[int]) -> str:
        """Text of some token ids, special tokens dropped."""
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_text(self, token_id: int) -> str:
        """Display text of one token (falls back to its vocabulary string for partial UTF-8 bytes)."""
        text = self.tokenizer.decode([token_id])
        if "\ufffd" in text or text == "":
            text = str(self.tokenizer.convert_ids_to_tokens(token_id))
        return text

    # -- trees ------------------------------------------------------------------------------------------------
    def static_tree(self, template: str | list) -> DraftTree:
        """The DraftTree for a named or user template, built once and cached on the model's device."""
        key = template if isinstance(template, str) else tuple(map(tuple, template))
        if key not in self._trees:
            name, paths = resolve_template(template, self.matrix.k)
            self._trees[key] = build_tree(name, paths, self.device)
        return self._trees[key]

    def _plain_tree(self) -> DraftTree:
        if "__plain__" not in self._trees:
            self._trees["__plain__"] = tree_from_parents("plain", [-1], [-1], self.device)
        return self._trees["__plain__"]

    @torch.no_grad()
    def _probe_cost(self, prompt: list[int], cfg: DecodeConfig) -> None:
        """Measure t(N) on this device once (about a second on a CPU), over a context like the real one."""
        cache = TreeKVCache()
        ctx = prompt[-256:]
        ids = torch.tensor([ctx], dtype=torch.long, device=self.device)
        self._forward(ids, torch.arange(len(ctx), device=self.device)[None], None, cache, last_only=True)
        past = len(ctx)

        def forward(n: int) -> None:
            tree = tree_from_parents("probe", [-1] + list(range(n - 1)), [-1] + [0] * (n - 1), self.device)
            tokens = ids[0, -1:].repeat(n)
            self._forward(tokens[None], (past + tree.depths)[None], self._mask(tree, past), cache)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            cache.truncate(past)

        self.adaptive.cost.probe(forward, max_tokens=cfg.node_budget + 1)

    # -- decoding ---------------------------------------------------------------------------------------------
    @torch.no_grad()
    def generate(self, prompt_ids: list[int], cfg: DecodeConfig | None = None,
                 stop: Callable[[], bool] | None = None) -> Iterator[StepEvent | SummaryEvent]:
        """Decode after `prompt_ids`, yielding a StepEvent per step, then a SummaryEvent.

        `stop`, polled after every step, ends the answer early (stop_reason "stopped").
        """
        cfg = cfg or DecodeConfig()
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise ValueError("the prompt is empty")
        if any(t < 0 or t >= self.vocab_size for t in prompt):
            raise ValueError(f"prompt has token ids outside the vocabulary [0, {self.vocab_size})")
        if len(prompt) >= self.context_limit:
            raise ValueError(f"the prompt has {len(prompt)} tokens; this model's context holds {self.context_limit}")
        use_adaptive = not cfg.plain and cfg.template in DYNAMIC
        hardware_aware = cfg.hardware_aware and cfg.template == ADAPTIVE  # adaptive-fixed: always the full budget
        static = None if (cfg.plain or use_adaptive) else self.static_tree(cfg.template)
        budget = min(cfg.max_new_tokens, self.context_limit - len(prompt))
        sync = cfg.sync_timings and self.device.type == "cuda"

        def now() -> float:
            if sync:
                torch.cuda.synchronize(self.device)
            return time.perf_counter()

        cache = TreeKVCache()
        t_start = now()
        seeding = cfg.prompt_seeding if cfg.prompt_seeding is not None else use_adaptive
        if seeding and not cfg.plain:
            self.matrix.seed_from_text(prompt)
        past = len(prompt) - 1
        if past > 0:  # prefill everything but the last token, which becomes the first root
            ids = torch.tensor([prompt[:-1]], dtype=torch.long, device=self.device)
            self._forward(ids, torch.arange(past, device=self.device)[None], None, cache, last_only=True)
        root = torch.tensor([prompt[-1]], dtype=torch.long, device=self.device)
        prefill_s = now() - t_start

        out: list[int] = []
        stop_set = set(self.stop_token_ids)
        steps, forward_total, overhead_total, stop_reason = 0, 0.0, 0.0, "length"
        k = self.matrix.k
        drafter = self.adaptive
        if use_adaptive:
            drafter.reset()
            if hardware_aware and not drafter.cost.measured:
                self._probe_cost(prompt, cfg)
        next_size = drafter.last_size if use_adaptive else 0
        decode_start = time.perf_counter()
        while True:
            t0 = now()
            step_past = past
            deepest = cfg.max_depth if use_adaptive else (static.max_depth if static is not None else 0)
            use_tree = not cfg.plain and past + deepest < self.context_limit  # near the context's end: plain steps
            adaptive_step = use_adaptive and use_tree
            if not use_tree:
                tree, tokens = self._plain_tree(), root
                drafter.next = None
            elif adaptive_step:
                grown = drafter.next if drafter.next is not None else drafter.grow(
                    self.matrix.table, self.matrix.probs, root, cfg.node_budget, cfg.max_depth)
                size = next_size if hardware_aware else cfg.node_budget
                tree, keep = drafter.take(grown, min(size, grown.tokens.shape[0] - 1), cfg.max_depth)
                tokens = grown.tokens[keep]
            else:
                tree, tokens = static, bfs_draft(self.matrix.table, root, static)
            n = tokens.shape[0]
            levels = cfg.max_depth + 1 if adaptive_step else tree.max_depth + 1
            mask = self._mask(tree, past)
            t1 = now()
            logits = self._forward(tokens[None], (past + tree.depths)[None], mask, cache)
            t2 = now()
            if use_tree:  # one chunked pass gives the argmax and the matrix update's top-k (reduce.py)
                argmax, top_values, top_ids = top_rows(logits, k)  # V = the matrix rows (_probe_vocab)
            greedy_tree = use_tree and cfg.greedy
            targets = argmax if greedy_tree else choose_tokens(logits, cfg, past + 1, tree.depths, levels)
            best = verify_tree(tokens, targets, tree.parents, tree.depths, tree.tree_mask)
            t3 = now()
            pieces = [best.view(1), targets, tokens]
            if use_tree:
                first, top_ids, top_probs = self.matrix.update(tokens, logits, top=(top_values, top_ids), consume=True)
                pieces += [first, top_ids.flatten(), (top_probs.flatten() * 1000).round()]
            if adaptive_step:  # tree shape for the events, and the next step's tree, grown from the bonus token
                pieces += [tree.parents, tree.depths, tree.ranks, (grown.scores[keep] * 1000).round(), grown.bins[keep]]
                drafter.next = drafter.grow(self.matrix.table, self.matrix.probs, targets[best].view(1),
                                            cfg.node_budget, cfg.max_depth)
                pieces.append(drafter.next.expected)
            t4 = now()
            flat = torch.cat([p.to(torch.float64) for p in pieces]).tolist()  # the one host sync of the step
            best_i = int(flat[0])
            targets_l = [int(x) for x in flat[1 : 1 + n]]
            tokens_l = [int(x) for x in flat[1 + n : 1 + 2 * n]]
            cursor = 1 + 2 * n
            rows, values, probs = [], [], []
            if use_tree:
                first_l = flat[cursor : cursor + n]
                ids_l = [int(x) for x in flat[cursor + n : cursor + n + n * k]]
                pr_l = flat[cursor + n + n * k : cursor + n + 2 * n * k]
                cursor += n + 2 * n * k
                for j in range(n):
                    if first_l[j]:
                        rows.append(tokens_l[j])
                        values.append(ids_l[j * k : (j + 1) * k])
                        probs.append([p / 1000 for p in pr_l[j * k : (j + 1) * k]])
            node_probs = None
            if adaptive_step:
                parents_l = [int(x) for x in flat[cursor : cursor + n]]
                parents_l[0] = -1
                depths_l = [int(x) for x in flat[cursor + n : cursor + 2 * n]]
                ranks_l = [int(x) for x in flat[cursor + 2 * n : cursor + 3 * n]]
                ranks_l[0] = -1
                node_probs = [x / 1000 for x in flat[cursor + 3 * n : cursor + 4 * n]]
                bins_l = [int(x) for x in flat[cursor + 4 * n : cursor + 5 * n]]
                expected_next = flat[cursor + 5 * n :]
            else:
                parents_l, depths_l, ranks_l = list(tree.parents_list), list(tree.depths_list), list(tree.ranks_list)
            accepted = path_to(parents_l, best_i)
            emitted, bonus = [], None
            for j in accepted[1:] + [None]:
                token = tokens_l[j] if j is not None else targets_l[best_i]
                emitted.append(token)
                if j is None:
                    bonus = token
                if token in stop_set:
                    stop_reason = "eos"
                    break
                if len(out) + len(emitted) >= budget:
                    stop_reason = "length"
                    break
            out.extend(emitted)
            finished = len(out) >= budget or stop_reason == "eos"
            if not finished:
                cache.keep(past, accepted)
                past += len(accepted)
                root = torch.tensor([bonus], dtype=torch.long, device=self.device)
            forward_ms = (t2 - t1) * 1e3
            if adaptive_step:  # learn from this step, then size the next tree
                drafter.observe(parents_l, bins_l, accepted, n, forward_ms)
                next_size = drafter.choose_size(expected_next, cfg.node_budget)
                drafter.last_size = next_size
            t5 = now()
            total_ms = (t5 - t0) * 1e3
            forward_total += forward_ms
            overhead_total += total_ms - forward_ms
            yield StepEvent(
                step=steps, position=step_past, tokens=tokens_l, parents=parents_l, depths=depths_l, ranks=ranks_l,
                accepted=accepted, emitted=emitted, bonus=bonus,
                timings={"draft": (t1 - t0) * 1e3, "forward": forward_ms, "verify": (t3 - t2) * 1e3,
                         "update": (t4 - t3) * 1e3, "commit": (t5 - t4) * 1e3, "total": total_ms},
                matrix_rows=rows, matrix_values=values, matrix_probs=probs, node_probs=node_probs,
                template=tree.name,
            )
            steps += 1
            if finished:
                break
            if stop is not None and stop():
                stop_reason = "stopped"
                break
        decode_s = time.perf_counter() - decode_start
        yield SummaryEvent(
            tokens=out, prompt_tokens=len(prompt), new_tokens=len(out), steps=steps,
            mean_accepted=len(out) / max(steps, 1), tokens_per_s=len(out) / max(decode_s, 1e-9),
            prefill_s=prefill_s, decode_s=decode_s, wall_s=prefill_s + decode_s, stop_reason=stop_reason,
            method="plain" if cfg.plain else "recycling",
            template="" if cfg.plain else (cfg.template if use_adaptive else static.name),
            matrix_rows_filled=self.matrix.rows_filled, matrix_mb=self.matrix.size_mb,
            overhead_ms=overhead_total / max(steps, 1), forward_ms=forward_total / max(steps, 1),
        )
