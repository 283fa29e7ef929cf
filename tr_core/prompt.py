"""The engine's side of the tokenizer: a conversation's prompt ids, the tokens that end an answer, a token's display
text, and a prompt checked before any decoding."""
from __future__ import annotations

from typing import Any

import torch

from .token_text import partial_token_text

_END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>", "<|endoftext|>", "<|end_of_text|>", "</s>",
                "<|eom_id|>", "<turn|>")


def stop_tokens(model: Any, tokenizer: Any, vocab_size: int) -> list[int]:
    """The ids that end an answer: the model's and tokenizer's EOS, and chat templates' end-of-turn special tokens."""
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for source in (getattr(gen, "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(source, int):
            ids.add(source)
        elif isinstance(source, (list, tuple)):
            ids.update(int(i) for i in source)
    vocab = tokenizer.get_vocab()
    special = list(getattr(tokenizer, "all_special_tokens", [])) + list(getattr(tokenizer, "added_tokens_encoder", {}))
    ids.update(vocab[text] for text in _END_OF_TURN if text in vocab and text in special)
    return sorted(i for i in ids if 0 <= i < vocab_size)


def encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    """Prompt ids for a conversation: the model's chat template, or plain 'Role: text' turns without one."""
    if not messages:
        raise ValueError("no messages to encode")
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
    return tokenizer("\n\n".join(lines) + "\n\nAssistant:")["input_ids"]


def token_text(tokenizer: Any, token_id: int) -> str:
    """Display text of one token; one holding part of a character shows that part's bytes ('‹e4bd›')."""
    text = tokenizer.decode([token_id])
    if "\ufffd" in text or not text:  # part of a character
        return partial_token_text(str(tokenizer.convert_ids_to_tokens(token_id)))
    return text


def check_prompt(prompt_ids: list[int] | torch.Tensor, vocab_size: int, context_limit: int) -> list[int]:
    """The prompt as a list of ids (a [1, L] tensor, as tokenizers return, is one sequence); ValueError when it is
    not one sequence, is empty, holds ids outside the vocabulary or does not fit the model's context."""
    if isinstance(prompt_ids, torch.Tensor):
        if prompt_ids.dim() == 2 and prompt_ids.shape[0] == 1:
            prompt_ids = prompt_ids[0]
        if prompt_ids.dim() != 1:
            raise ValueError(f"the prompt must be one sequence of token ids, shape [L] or [1, L]; "
                             f"got shape {list(prompt_ids.shape)}")
        prompt_ids = prompt_ids.tolist()
    try:
        prompt = [int(t) for t in prompt_ids]
    except (TypeError, ValueError) as exc:
        raise ValueError("the prompt must be one sequence of integer token ids") from exc
    if not prompt:
        raise ValueError("the prompt is empty")
    if any(t < 0 or t >= vocab_size for t in prompt):
        raise ValueError(f"prompt has token ids outside the vocabulary [0, {vocab_size})")
    if len(prompt) >= context_limit:
        raise ValueError(f"the prompt has {len(prompt)} tokens; this model's context holds {context_limit}")
    return prompt
