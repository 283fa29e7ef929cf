"""A padded batch through `model.generate(..., custom_generate=tr_core.hf.generate)`: every row gets the tokens it
gets alone (transformers' own generate of the unpadded row, and tr_core.hf on that row), padded as generate pads."""
from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

import tr_core.hf as trhf
from tr_core import kernels

PROMPTS = [[5, 9, 14, 22, 9, 14], [30, 31, 32, 33, 30, 31, 32, 40, 41], [7, 8], [60, 61, 62, 63]]
PAD = 0


def padded(prompts: list[list[int]], side: str = "left") -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of the prompts padded to the longest, as a tokenizer pads them."""
    width = max(map(len, prompts))
    ids, mask = [], []
    for p in prompts:
        fill = [PAD] * (width - len(p))
        ids.append(fill + p if side == "left" else p + fill)
        mask.append([0] * len(fill) + [1] * len(p) if side == "left" else [1] * len(p) + [0] * len(fill))
    return torch.tensor(ids), torch.tensor(mask)


def alone(model, prompts: list[list[int]], custom: bool, **kw) -> list[list[int]]:
    """Each prompt's new tokens generated on its own, unpadded: by transformers, or by tr_core.hf (`custom`)."""
    extra = dict(custom_generate=trhf.generate) if custom else {}
    if not custom:
        kw = {k: v for k, v in kw.items() if k != "template"}
    return [model.generate(torch.tensor([p]), **kw, **extra)[0, len(p):].tolist() for p in prompts]


def as_batch(rows: list[list[int]]) -> list[list[int]]:
    """New tokens of rows that ended early padded to the longest, as generate returns them."""
    width = max(map(len, rows))
    return [r + [PAD] * (width - len(r)) for r in rows]


def stop_token(model) -> int:
    """A token some rows reach early and others never: the rows of one batch end at different lengths."""
    rows = alone(model, PROMPTS, custom=False, max_new_tokens=30, do_sample=False, pad_token_id=PAD)
    for token in rows[0][3:]:
        if token != PAD and any(token not in r for r in rows[1:]):
            return token
    raise AssertionError("no token ends some rows but not others")


@pytest.mark.parametrize("arch", ["llama", "gemma3", pytest.param("qwen2", marks=pytest.mark.slow),
                                  pytest.param("mistral", marks=pytest.mark.slow)])
def test_greedy_batch_rows_equal_each_row_alone(arch):
    """Left padding with its mask, three tree kinds, rows ending at different stop tokens; right padding and a
    padded single row give the same tokens."""
    model = tiny_model(arch)
    kw = dict(max_new_tokens=30, do_sample=False, pad_token_id=PAD, eos_token_id=stop_token(model))
    ids, mask = padded(PROMPTS)
    rows = alone(model, PROMPTS, custom=False, **kw)
    expected = as_batch(rows)
    assert len(set(map(len, rows))) > 1  # the rows really end apart
    for template in ("2.2.2", "adaptive", "hybrid"):
        trhf.reset(model)
        out = model.generate(ids, attention_mask=mask, custom_generate=trhf.generate, template=template, **kw)
        assert out[:, : ids.shape[1]].tolist() == ids.tolist() and out.dtype == torch.long
        assert out[:, ids.shape[1]:].tolist() == expected, template
        assert not kernels.is_routed(model)  # the timed products ride the batch only
        assert as_batch(alone(model, PROMPTS, custom=True, template=template, **kw)) == expected
    right, right_mask = padded(PROMPTS, side="right")
    out = model.generate(right, attention_mask=right_mask, custom_generate=trhf.generate, template="2.2.2", **kw)
    assert out[:, right.shape[1]:].tolist() == expected
    one, one_mask = padded([PROMPTS[2], PROMPTS[1]])
    out = model.generate(one[:1], attention_mask=one_mask[:1], custom_generate=trhf.generate, **kw)
    assert out[0, one.shape[1]:].tolist() == expected[2][: out.shape[1] - one.shape[1]]


def test_return_dict_scores_of_a_batch():
    """One [B, V] of scores per new position: each row's equal to transformers' for that row alone, zeros after the
    row ended."""
    model = tiny_model("llama")
    kw = dict(max_new_tokens=16, do_sample=False, pad_token_id=PAD, eos_token_id=stop_token(model),
              return_dict_in_generate=True, output_scores=True, repetition_penalty=1.2)
    ids, mask = padded(PROMPTS)
    out = model.generate(ids, attention_mask=mask, custom_generate=trhf.generate, template="2.2.2", **kw)
    assert type(out).__name__ == "GenerateDecoderOnlyOutput"
    assert len(out.scores) == out.sequences.shape[1] - ids.shape[1]
    assert all(s.shape == (len(PROMPTS), model.config.vocab_size) for s in out.scores)
    for i, p in enumerate(PROMPTS):
        ref = model.generate(torch.tensor([p]), **kw)
        n = len(ref.scores)
        assert out.sequences[i, ids.shape[1]: ids.shape[1] + n].tolist() == ref.sequences[0, len(p):].tolist()
        assert all(torch.allclose(a[i], b[0], atol=1e-4) for a, b in zip(out.scores, ref.scores))
        assert all(not s[i].any() for s in out.scores[n:])


def test_seeded_sampling_each_row_equals_it_alone():
    """Row i draws the i-th seed from torch's generator: it equals that row alone through tr_core.hf after i draws
    (row 0: straight after the same torch.manual_seed), and a repeated prompt gets a sample of its own."""
    model = tiny_model("llama")
    prompts = [PROMPTS[0], PROMPTS[2], PROMPTS[0]]
    kw = dict(max_new_tokens=20, do_sample=True, temperature=0.9, top_p=0.95, pad_token_id=PAD,
              custom_generate=trhf.generate, template="2.2.2")
    ids, mask = padded(prompts)
    trhf.reset(model)
    torch.manual_seed(11)
    out = model.generate(ids, attention_mask=mask, **kw)[:, ids.shape[1]:].tolist()
    for i, p in enumerate(prompts):
        trhf.reset(model)
        torch.manual_seed(11)
        for _ in range(i):
            torch.randint(0, 2**31 - 1, (1,))
        assert out[i] == model.generate(torch.tensor([p]), **kw)[0, len(p):].tolist()
    assert out[0] != out[2]


def test_the_models_engine_keeps_what_row_0_taught_it():
    model = tiny_model("llama")
    kw = dict(max_new_tokens=24, do_sample=False, pad_token_id=PAD, custom_generate=trhf.generate, template="2.2.2")
    trhf.reset(model)
    model.generate(torch.tensor([PROMPTS[0]]), **kw)
    first = trhf.engine_of(model).state_dict()["matrix"]
    trhf.reset(model)
    ids, mask = padded(PROMPTS)
    model.generate(ids, attention_mask=mask, **kw)
    kept = trhf.engine_of(model).state_dict()["matrix"]
    assert all(torch.equal(first[name], kept[name]) for name in first)


def test_stopping_criteria_stop_each_row_on_its_own():
    from transformers import StoppingCriteria, StoppingCriteriaList

    class LastIs(StoppingCriteria):
        def __init__(self, token: int) -> None:
            self.token = token

        def __call__(self, input_ids, scores, **kwargs):
            return input_ids[:, -1] == self.token

    model = tiny_model("llama")
    token = stop_token(model)
    kw = dict(max_new_tokens=30, do_sample=False, pad_token_id=PAD,
              stopping_criteria=StoppingCriteriaList([LastIs(token)]))
    ids, mask = padded(PROMPTS)
    out = model.generate(ids, attention_mask=mask, custom_generate=trhf.generate, template="2.2.2", **kw)
    assert out[:, ids.shape[1]:].tolist() == as_batch(alone(model, PROMPTS, custom=False, **kw))


def test_what_a_batch_cannot_take_is_refused_by_name():
    model = tiny_model("llama")
    ids, mask = padded(PROMPTS[:2])

    class Streamer:
        def put(self, value):
            pass

        def end(self):
            pass

    call = dict(max_new_tokens=5, pad_token_id=PAD, custom_generate=trhf.generate)
    with pytest.raises(ValueError, match="`streamer` with batch size 2"):
        model.generate(ids, attention_mask=mask, streamer=Streamer(), **call)
    holed = mask.clone()
    holed[1, 4] = 0
    with pytest.raises(ValueError, match="row 1 has zeros between its tokens"):
        model.generate(ids, attention_mask=holed, **call)
    empty = mask.clone()
    empty[0] = 0
    with pytest.raises(ValueError, match="row 0 has none"):
        model.generate(ids, attention_mask=empty, **call)


def test_a_penalty_that_ignores_the_prompt_ignores_each_rows_own():
    """A RepetitionPenaltyLogitsProcessor(prompt_ignore_length=L) on a batch padded to L ignores each row's prompt,
    as `prompt_ignore_length=len(prompt)` does for the row alone."""
    from transformers import RepetitionPenaltyLogitsProcessor

    model = tiny_model("llama")
    kw = dict(max_new_tokens=20, do_sample=False, pad_token_id=PAD)
    ids, mask = padded(PROMPTS)
    penalty = RepetitionPenaltyLogitsProcessor(1.5, prompt_ignore_length=ids.shape[1])
    out = model.generate(ids, attention_mask=mask, logits_processor=[penalty], custom_generate=trhf.generate, **kw)
    rows = [model.generate(torch.tensor([p]), logits_processor=[RepetitionPenaltyLogitsProcessor(
        1.5, prompt_ignore_length=len(p))], **kw)[0, len(p):].tolist() for p in PROMPTS]
    assert out[:, ids.shape[1]:].tolist() == as_batch(rows)
    assert rows != alone(model, PROMPTS, custom=False, repetition_penalty=1.5, **kw)  # the prompt mattered
