"""Token Recycling inside transformers' own `generate()`: `model.generate(..., custom_generate=tr_core.hf.generate)`.

transformers 5 prepares the generation and calls this in place of its sampling loop. The engine's learned state is
kept beside the model in a weak mapping (`reset(model)` forgets it); nothing is written onto it (docs/library.md)."""
from __future__ import annotations

import inspect
import os
import threading
import weakref
from typing import Any

import torch

from .config import DecodeConfig
from .engine import Engine
from .events import SummaryEvent
from .sampling import PER_NODE
from .tree import default_template

# model -> its engine, parked: the learned state (matrix, drafters) without the engine's references to the model, so
# the weak key can die with the model (a value that held the model would keep it alive for ever)
_ENGINES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_ENGINES_LOCK = threading.Lock()


class _Vocabless:
    """The little an Engine asks of a tokenizer when none is given: stop tokens come from the generation config."""

    eos_token_id = None
    chat_template = None

    def get_vocab(self) -> dict[str, int]:
        return {}

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Events name tokens by id here: no tokenizer was given."""
        return "".join(f"<{i}>" for i in ids)

    def convert_ids_to_tokens(self, token_id: int) -> str:
        return f"<{token_id}>"


def engine_of(model: Any, topk_candidates: int = 8) -> Engine:
    """An Engine on `model` sharing the learned state kept beside it (made on first use, or again when k changes)."""
    with _ENGINES_LOCK:
        parked = _ENGINES.get(model)
        if parked is None or parked.matrix.k != topk_candidates:
            engine = Engine(model, _Vocabless(), topk_candidates=topk_candidates)
            _ENGINES[model] = parked = engine.on_model(None)  # no reference to the model: the weak key can die
    return parked.on_model(model)  # the matrix, drafters and clock are the parked engine's own


def reset(model: Any) -> None:
    """Forget everything the model's adjacency matrix learned (and the adaptive tree's calibration)."""
    with _ENGINES_LOCK:
        _ENGINES.pop(model, None)


def _refuse_unsupported(input_ids: torch.Tensor, config: Any, model_kwargs: dict) -> None:
    """Clear errors for settings Token Recycling does not implement."""
    for name, ok in (("num_beams", getattr(config, "num_beams", 1) in (None, 1)),
                     ("num_return_sequences", getattr(config, "num_return_sequences", 1) in (None, 1)),
                     ("assistant_model", model_kwargs.get("assistant_model") is None),
                     ("prompt_lookup_num_tokens", getattr(config, "prompt_lookup_num_tokens", None) is None)):
        if not ok:
            raise ValueError(f"Token Recycling does not support `{name}`; remove it from the generate call")
    if input_ids.shape[0] != 1:
        raise ValueError(f"Token Recycling decodes one sequence at a time: batch size {input_ids.shape[0]} "
                         "(input_ids.shape[0]) is not supported")
    mask = model_kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        raise ValueError("Token Recycling does not support padded inputs (attention_mask with zeros)")


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
    eos = config.eos_token_id
    eos = () if eos is None else tuple(int(e) for e in (eos.tolist() if torch.is_tensor(eos) else
                                                        (eos if isinstance(eos, (list, tuple)) else [eos])))
    sample = bool(config.do_sample)
    seed = int(torch.randint(0, 2**31 - 1, (1,)).item()) if sample else 0  # from torch's generator: manual_seed works
    return DecodeConfig(max_new_tokens=max(int(max_new), 1), min_new_tokens=max(int(min_new), 0),
                        temperature=1.0 if sample else 0.0, seed=seed, template=template, stop_token_ids=eos)


def generate(model: Any, input_ids: torch.LongTensor, logits_processor: Any = None, stopping_criteria: Any = None,
             generation_config: Any = None, synced_gpus: bool = False, streamer: Any = None,
             template: str | None = None, topk_candidates: int = 8, **model_kwargs: Any):
    """transformers' `custom_generate` callable. input_ids [1, L] -> [1, L + new] like `generate`, or a
    GenerateDecoderOnlyOutput with `return_dict_in_generate=True` (`scores` with `output_scores=True`)."""
    config = generation_config
    streamer = streamer if streamer is not None else _streamer_of_generate(inspect.currentframe())
    _refuse_unsupported(input_ids, config, model_kwargs)
    prompt = input_ids[0].tolist()
    processors, min_new = _split_processors(logits_processor, len(prompt))
    engine = engine_of(model, topk_candidates)
    cfg = _decode_config(config, len(prompt), template or default_template(engine.device), min_new)
    scores: list[torch.Tensor] = []
    hook = scores.append if getattr(config, "output_scores", False) else None
    new = _run(engine, prompt, cfg, processors, hook, stopping_criteria, streamer, input_ids)
    if streamer is not None:
        streamer.end()
    sequences = torch.cat([input_ids, torch.tensor([new], dtype=input_ids.dtype, device=input_ids.device)], dim=1)
    if not getattr(config, "return_dict_in_generate", False):
        return sequences
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    rows = torch.cat(scores)[: len(new)] if scores else None
    return GenerateDecoderOnlyOutput(sequences=sequences,
                                     scores=tuple(r[None] for r in rows) if rows is not None else None)


def _streamer_of_generate(frame: Any) -> Any:
    """The `streamer` of the `generate` call that called us (`frame`: our own), None when none or not called by
    transformers: it drops `streamer` before calling `custom_generate`, so it is read from `generate`'s frame. Raises
    where that frame has none (a moved local): a `TextIteratorStreamer` consumer would otherwise wait for ever."""
    from transformers.generation.utils import GenerationMixin

    caller = frame.f_back if frame is not None else None
    try:
        if caller is None or not _in_transformers(caller):
            return None
        target = _generate_code(GenerationMixin.generate)
        while caller is not None and caller.f_code is not target:
            caller = caller.f_back
        if caller is None or "streamer" not in caller.f_locals:
            import transformers

            raise RuntimeError(
                f"tr_core.hf cannot read the `streamer` of this generate call: transformers {transformers.__version__} "
                "no longer keeps it where transformers 5.x did (a local of GenerationMixin.generate). Pass no streamer "
                "to Token Recycling's generate, or a transformers release this version of tr_core was tested on")
        return caller.f_locals["streamer"]
    finally:
        del frame, caller


def _generate_code(function: Any) -> Any:
    """The code object of `generate` under its decorators (deprecations, no_grad)."""
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function.__code__


def _in_transformers(frame: Any) -> bool:
    """True when `frame` runs transformers' own code (it called us as `custom_generate`)."""
    import transformers

    return frame.f_code.co_filename.startswith(os.path.dirname(transformers.__file__) + os.sep)


def _run(engine: Engine, prompt: list[int], cfg: DecodeConfig, processors: list, hook: Any, stopping_criteria: Any,
         streamer: Any, input_ids: torch.Tensor) -> list[int]:
    """Decode, streaming each step's tokens and honouring the stopping criteria token by token."""
    new: list[int] = []
    for ev in engine.generate(prompt, cfg, logits_processor=processors, scores_hook=hook):
        if isinstance(ev, SummaryEvent):
            break
        cut = _first_stop(stopping_criteria, input_ids, new, ev.emitted)
        tokens = ev.emitted if cut is None else ev.emitted[: cut + 1]
        new.extend(tokens)
        if streamer is not None and tokens:
            streamer.put(torch.tensor(tokens, dtype=torch.long))
        if cut is not None:
            break
    return new


def _first_stop(criteria: Any, input_ids: torch.Tensor, done: list[int], emitted: list[int]) -> int | None:
    """Index in `emitted` after which a stopping criterion fires (checked token by token, as generate does)."""
    if not criteria:
        return None
    from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria

    custom = [c for c in criteria if not isinstance(c, (EosTokenCriteria, MaxLengthCriteria))]  # the engine does these
    if not custom:
        return None
    for i in range(len(emitted)):
        seq = torch.tensor([input_ids[0].tolist() + done + emitted[: i + 1]], device=input_ids.device)
        if any(bool(c(seq, None).any()) for c in custom):
            return i
    return None
