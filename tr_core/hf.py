"""Token Recycling inside transformers' own `generate()`: `model.generate(..., custom_generate=tr_core.hf.generate)`.
The engine's learned state is kept beside the model in a weak mapping (`reset(model)` forgets it; docs/library.md);
a padded batch decodes its rows together through tr_core.batch, each row without its padding."""
from __future__ import annotations

import inspect
import os
import threading
import weakref
from typing import Any

import torch

from .batch import Batch
from .config import DecodeConfig
from .engine import Engine
from .events import SummaryEvent
from .sampling import PER_NODE
from .tree import default_template

# model -> its engine, parked without a reference to the model (else the weak key would keep it alive for ever)
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ENGINES_LOCK = threading.Lock()


class _Vocabless:
    """The little an Engine asks of a tokenizer when none is given: events name tokens by id."""

    eos_token_id = None
    chat_template = None

    def get_vocab(self) -> dict[str, int]:
        return {}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(f"<{i}>" for i in ids)

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return f"<{token_id}>"


def engine_of(model: Any, topk_candidates: int = 8) -> Engine:
    """An Engine on `model` sharing the learned state kept beside it (made on first use, or again when k changes)."""
    with _ENGINES_LOCK:
        parked = _ENGINES.get(model)
        if parked is None or parked.matrix.k != topk_candidates:
            engine = Engine(model, _Vocabless(), topk_candidates=topk_candidates)
            _ENGINES[model] = parked = engine.on_model(None)
    return parked.on_model(model)  # the matrix, drafters and clock are the parked engine's own


def reset(model: Any) -> None:
    """Forget everything the model's adjacency matrix learned (and the adaptive tree's calibration)."""
    with _ENGINES_LOCK:
        _ENGINES.pop(model, None)


def _refuse_unsupported(input_ids: torch.Tensor, config: Any, model_kwargs: dict, streamer: Any) -> None:
    for name, ok in (("num_beams", getattr(config, "num_beams", 1) in (None, 1)),
                     ("num_return_sequences", getattr(config, "num_return_sequences", 1) in (None, 1)),
                     ("assistant_model", model_kwargs.get("assistant_model") is None),
                     ("prompt_lookup_num_tokens", getattr(config, "prompt_lookup_num_tokens", None) is None),
                     ("streamer", streamer is None or input_ids.shape[0] == 1)):
        if not ok:
            raise ValueError(f"Token Recycling does not support `{name}`"
                             + (f" with batch size {input_ids.shape[0]} (a streamer takes one sequence)"
                                if name == "streamer" else "") + "; remove it from the generate call")


def _spans(input_ids: torch.Tensor, mask: torch.Tensor | None) -> list[tuple[int, int]]:
    """Where each row's prompt lies between its padding: the run of ones in its attention mask (left or right)."""
    if mask is None:  # transformers drops a mask of all ones
        return [(0, input_ids.shape[1])] * input_ids.shape[0]
    if tuple(mask.shape) != tuple(input_ids.shape):
        raise ValueError(f"attention_mask has shape {tuple(mask.shape)}, input_ids {tuple(input_ids.shape)}")
    spans = []
    for i, keep in enumerate(mask.bool().tolist()):
        kept = [j for j, k in enumerate(keep) if k]
        if not kept or kept[-1] - kept[0] + 1 != len(kept):
            raise ValueError(f"Token Recycling needs each row's attention_mask to be one run of ones (left or right "
                             f"padding): row {i} has " + ("none" if not kept else "zeros between its tokens"))
        spans.append((kept[0], kept[-1] + 1))
    return spans


def _for_row(processors: list, row: int, span: tuple[int, int], width: int) -> list:
    """One row's processors, a repetition penalty's `prompt_ignore_length` (its left padding) counted unpadded."""
    from transformers import RepetitionPenaltyLogitsProcessor

    out = []
    for p in processors:
        ignore = p.prompt_ignore_length if isinstance(p, RepetitionPenaltyLogitsProcessor) else None
        if ignore is not None:
            start, stop = span
            ignore = int(ignore[row]) if torch.is_tensor(ignore) else int(ignore)
            ignore = (max(ignore - start, 0) if ignore <= stop else stop - start + max(ignore - width, 0))
            p = RepetitionPenaltyLogitsProcessor(p.penalty, prompt_ignore_length=ignore or None)
        out.append(p)
    return out


def _split_processors(processors: Any, prompt_len: int) -> tuple[list, int]:
    """(per-node processors, min_new_tokens) from generate's prepared list; length rules become min_new_tokens."""
    from transformers import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

    keep, min_new = [], 0
    for p in processors or []:
        if isinstance(p, MinNewTokensLengthLogitsProcessor):
            min_new = max(min_new, p.min_new_tokens)
        elif isinstance(p, MinLengthLogitsProcessor):
            min_new = max(min_new, p.min_length - prompt_len)
        elif isinstance(p, PER_NODE):
            keep.append(p)
        else:
            raise ValueError(f"{type(p).__name__} cannot be applied per tree node (Token Recycling verifies many "
                             "positions at once); remove the setting that adds it")
    return keep, min_new


def _decode_config(config: Any, prompt_len: int, template: str, min_new: int) -> DecodeConfig:
    """The engine's settings from a prepared GenerationConfig (sampling warpers travel as processors)."""
    max_new = config.max_new_tokens if config.max_new_tokens is not None else config.max_length - prompt_len
    eos = () if config.eos_token_id is None else tuple(torch.as_tensor(config.eos_token_id).flatten().tolist())
    sample = bool(config.do_sample)
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if sample else 0  # from torch's generator: manual_seed works
    return DecodeConfig(max_new_tokens=max(int(max_new), 1), min_new_tokens=max(int(min_new), 0),
                        temperature=1.0 if sample else 0.0, seed=seed, template=template, stop_token_ids=eos)


def generate(model: Any, input_ids: torch.LongTensor, logits_processor: Any = None, stopping_criteria: Any = None,
             generation_config: Any = None, synced_gpus: bool = False, streamer: Any = None,
             template: str | None = None, topk_candidates: int = 8, **model_kwargs: Any):
    """transformers' `custom_generate` callable: what `generate` returns, each row decoded without its padding."""
    config = generation_config
    streamer = streamer if streamer is not None else _streamer_of_generate(inspect.currentframe())
    _refuse_unsupported(input_ids, config, model_kwargs, streamer)
    spans, width = _spans(input_ids, model_kwargs.get("attention_mask")), input_ids.shape[1]
    prompts = [input_ids[i, start:stop].tolist() for i, (start, stop) in enumerate(spans)]
    processors, min_new = _split_processors(logits_processor, width)
    processors = [_for_row(processors, i, span, width) for i, span in enumerate(spans)]
    engine = engine_of(model, topk_candidates)
    template = template or default_template(engine.device)
    cfgs = [_decode_config(config, width, template, min_new) for _ in prompts]  # a seed drawn per row
    scores: list[list[torch.Tensor]] = [[] for _ in prompts]
    hooks = [s.append if getattr(config, "output_scores", False) else None for s in scores]
    if len(prompts) == 1:
        news = [_run(engine, prompts[0], cfgs[0], processors[0], hooks[0], stopping_criteria, streamer, input_ids[0])]
    else:
        news = _run_batch(engine, prompts, cfgs, processors, hooks, stopping_criteria, input_ids)
    if streamer is not None:
        streamer.end()
    return _output(config, input_ids, news, scores)


def _output(config: Any, input_ids: torch.Tensor, news: list[list[int]], scores: list[list[torch.Tensor]]) -> Any:
    """What `generate` returns; a row's scores after it ended are zeros (transformers' pad scores choose nothing)."""
    width = max(len(new) for new in news)
    pad = _pad_token_id(config) if any(len(new) < width for new in news) else 0
    new_ids = torch.full((len(news), width), pad, dtype=input_ids.dtype, device=input_ids.device)
    for i, new in enumerate(news):
        new_ids[i, : len(new)] = torch.tensor(new, dtype=input_ids.dtype)
    sequences = torch.cat([input_ids, new_ids], dim=1)
    if not getattr(config, "return_dict_in_generate", False):
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    per_row = [torch.cat(s)[: len(new)] if s else None for s, new in zip(scores, news)]
    if any(rows is None for rows in per_row):
        return GenerateDecoderOnlyOutput(sequences=sequences, scores=None)
    steps = torch.zeros(width, len(news), per_row[0].shape[-1], dtype=per_row[0].dtype, device=per_row[0].device)
    for i, rows in enumerate(per_row):
        steps[: len(rows), i] = rows
    return GenerateDecoderOnlyOutput(sequences=sequences, scores=tuple(steps))


def _pad_token_id(config: Any) -> int:
    """The pad token, as transformers picks it: `pad_token_id`, else the first stop token."""
    pad, eos = getattr(config, "pad_token_id", None), getattr(config, "eos_token_id", None)
    if pad is None and eos is None:
        raise ValueError("rows of this batch ended at different lengths: set `pad_token_id` to pad the short ones")
    return int(pad if pad is not None else torch.as_tensor(eos).flatten()[0])


def _run_batch(engine: Engine, prompts: list[list[int]], cfgs: list[DecodeConfig], processors: list[list], hooks: list,
               stopping_criteria: Any, input_ids: torch.Tensor) -> list[list[int]]:
    """Every row in one Batch, row 0 on `engine` and the others on forks: each gets the tokens it would alone."""
    engines = [engine] + [engine.fork() for _ in prompts[1:]]
    batch, rows, news = Batch(max_rows=len(prompts)), {}, [[] for _ in prompts]
    try:
        for i, (row_engine, prompt, cfg) in enumerate(zip(engines, prompts, cfgs)):
            rows[batch.add(row_engine, prompt, cfg, logits_processor=processors[i], scores_hook=hooks[i])] = i
        while batch:
            for key, event in batch.step():
                if isinstance(event, SummaryEvent):
                    continue
                i = rows[key]
                cut = _first_stop(stopping_criteria, input_ids[i], news[i], event.emitted)
                news[i].extend(event.emitted if cut is None else event.emitted[: cut + 1])
                if cut is not None:
                    batch.cancel(key)
    finally:
        for row in list(batch.rows):
            batch.cancel(row.key)
    return news


def _streamer_of_generate(frame: Any) -> Any:
    """The `streamer` transformers' `generate` dropped before calling us, read from its frame (None: not called so).
    Raises where it cannot be read: a `TextIteratorStreamer` consumer would otherwise wait for ever."""
    import transformers
    from transformers.generation.utils import GenerationMixin

    caller = frame.f_back if frame is not None else None
    try:
        ours = os.path.dirname(transformers.__file__) + os.sep
        if caller is None or not caller.f_code.co_filename.startswith(ours):
            return None
        target = _generate_code(GenerationMixin.generate)
        while caller is not None and caller.f_code is not target:
            caller = caller.f_back
        if caller is None or "streamer" not in caller.f_locals:
            raise RuntimeError(
                f"tr_core.hf cannot read the `streamer` of this generate call: transformers {transformers.__version__} "
                "no longer keeps it where transformers 5.x did (a local of GenerationMixin.generate). Pass no streamer "
                "to Token Recycling's generate, or a transformers release this version of tr_core was tested on")
        return caller.f_locals["streamer"]
    finally:
        del frame, caller


def _generate_code(function: Any) -> Any:
    """The code object of `generate` under its decorators (deprecations, no_grad)."""
    return inspect.unwrap(function).__code__


def _run(engine: Engine, prompt: list[int], cfg: DecodeConfig, processors: list, hook: Any, stopping_criteria: Any,
         streamer: Any, row: torch.Tensor) -> list[int]:
    """Decode, streaming each step's tokens and honouring the stopping criteria token by token."""
    new: list[int] = []
    for ev in engine.generate(prompt, cfg, logits_processor=processors, scores_hook=hook):
        if isinstance(ev, SummaryEvent):
            break
        cut = _first_stop(stopping_criteria, row, new, ev.emitted)
        tokens = ev.emitted if cut is None else ev.emitted[: cut + 1]
        new.extend(tokens)
        if streamer is not None and tokens:
            streamer.put(torch.tensor(tokens, dtype=torch.long))
        if cut is not None:
            break
    return new


def _first_stop(criteria: Any, row: torch.Tensor, done: list[int], emitted: list[int]) -> int | None:
    """Index in `emitted` after which a custom stopping criterion fires on the padded row, token by token."""
    if not criteria:
        return None
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    custom = [c for c in criteria if not isinstance(c, (EosTokenCriteria, MaxLengthCriteria))]  # the engine does these
    if not custom:
        return None
    for i in range(len(emitted)):
        seq = torch.tensor([row.tolist() + done + emitted[: i + 1]], device=row.device)
        if any(bool(c(seq, None).any()) for c in custom):
            return i
    return None
