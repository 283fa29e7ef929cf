"""Token Recycling inside transformers' generate(): `model.generate(..., custom_generate=tr_core.hf.generate)`."""
from __future__ import annotations

import contextlib
import io
import re
import threading
from pathlib import Path

import pytest
import torch
from conftest import TINY_VOCAB, TinyTokenizer, tiny_model

import tr_core.hf as trhf

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 9, 14, 22, 9, 14], [30, 31, 32, 33, 30, 31, 32, 40, 41]]
COMMON = dict(eos_token_id=1, pad_token_id=0, do_sample=False)


def both(model, prompt, **kw):
    """(plain generate, Token Recycling generate) on the same arguments."""
    ids = torch.tensor([prompt])
    ours = {k: kw.pop(k) for k in ("template", "topk_candidates") if k in kw}
    return model.generate(ids, **kw), model.generate(ids, custom_generate=trhf.generate, **kw, **ours)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral", "gemma3"])
def test_greedy_penalty_scores_and_eos_equal_plain_generate(arch):
    model = tiny_model(arch)
    trhf.reset(model)
    for prompt in PROMPTS:
        for template in ("2.2.2", "adaptive", "hybrid"):
            ref, out = both(model, prompt, max_new_tokens=40, template=template, **COMMON)
            assert out.tolist() == ref.tolist() and out.dtype == torch.long
        ref, out = both(model, prompt, max_new_tokens=40, repetition_penalty=1.3, **COMMON)
        assert out.tolist() == ref.tolist()
        ref, out = both(model, prompt, max_new_tokens=16, return_dict_in_generate=True, output_scores=True, **COMMON)
        assert type(out).__name__ == "GenerateDecoderOnlyOutput" and out.sequences.tolist() == ref.sequences.tolist()
        assert len(out.scores) == len(ref.scores) and all(torch.allclose(a, b, atol=1e-4)
                                                           for a, b in zip(out.scores, ref.scores))
    engine = trhf.engine_of(model)
    assert engine.matrix.rows_filled > 0  # kept on the model between calls
    trhf.reset(model)
    assert trhf.engine_of(model) is not engine and trhf.engine_of(model).matrix.rows_filled == 0


def test_eos_inside_an_accepted_run_and_min_new_tokens():
    model = tiny_model("llama")
    prompt = PROMPTS[1]
    free = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, pad_token_id=0)
    text = free[0, len(prompt):].tolist()
    eos = text[12]  # a token the answer reaches mid-way: the stop must land exactly where generate stops
    trhf.reset(model)
    model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, pad_token_id=0,
                   custom_generate=trhf.generate, template="2.2.2")  # warm the matrix: drafts get accepted
    for kw in (dict(max_new_tokens=40), dict(max_new_tokens=40, min_new_tokens=20)):
        ref, out = both(model, prompt, eos_token_id=eos, pad_token_id=0, do_sample=False, template="2.2.2", **kw)
        assert out.tolist() == ref.tolist()
    accepted = max(len(e.emitted) for e in trhf.engine_of(model).generate(prompt, trhf.DecodeConfig(
        max_new_tokens=40, template="2.2.2", stop_token_ids=(eos,))) if hasattr(e, "emitted"))
    assert accepted >= 2  # the stop token came inside a multi-token step


def test_sampling_draws_from_the_same_distribution_as_generate():
    """Chi-square over seeds: the first sampled token follows softmax(logits / T) after top-k, like generate's."""
    model = tiny_model("llama", seed=3)
    with torch.no_grad():
        model.lm_head.weight.mul_(0.05)  # flatten the distribution so several tokens are likely
    prompt = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        probs = torch.softmax(model(prompt).logits[0, -1] / 0.7, -1)
    n = 1200
    counts = torch.zeros(TINY_VOCAB)
    for seed in range(n):
        torch.manual_seed(seed)
        out = model.generate(prompt, max_new_tokens=1, do_sample=True, temperature=0.7, top_k=0, pad_token_id=0,
                             custom_generate=trhf.generate, template="2.2.2")
        counts[out[0, -1]] += 1
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    chi2 = float(((obs - exp) ** 2 / exp.clamp(min=1e-9)).sum())
    dof = int(big.sum())
    assert dof >= 5 and chi2 < dof + 4.0 * (2 * dof) ** 0.5 + 10, f"chi2 {chi2:.1f} with {dof} dof"
    torch.manual_seed(7)
    a = model.generate(prompt, max_new_tokens=12, do_sample=True, pad_token_id=0, custom_generate=trhf.generate)
    torch.manual_seed(7)
    b = model.generate(prompt, max_new_tokens=12, do_sample=True, pad_token_id=0, custom_generate=trhf.generate)
    assert a.tolist() == b.tolist()  # torch.manual_seed makes it repeatable


def test_unsupported_settings_are_refused_by_name():
    model = tiny_model("llama")
    ids = torch.tensor([PROMPTS[0]])
    cases = [(dict(num_beams=2), "num_beams"), (dict(no_repeat_ngram_size=2), "NoRepeatNGramLogitsProcessor"),
             (dict(num_return_sequences=2, do_sample=True), "num_return_sequences")]
    for kw, name in cases:  # batches and padding: tests/test_hf_batch.py
        with pytest.raises(ValueError, match=name):
            model.generate(ids, max_new_tokens=5, pad_token_id=0, custom_generate=trhf.generate, **kw)


def test_streamers_and_the_embedded_model(embedded):
    from transformers import TextIteratorStreamer, TextStreamer

    model, tokenizer = embedded
    trhf.reset(model)
    messages = [{"role": "user", "content": "List the days of the week, then list them again."}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    kw = dict(max_new_tokens=48, do_sample=False)
    for extra in (dict(), dict(repetition_penalty=1.3)):
        ref = model.generate(**inputs, **kw, **extra)
        out = model.generate(**inputs, **kw, **extra, custom_generate=trhf.generate, template="2.2.2")
        assert out.tolist() == ref.tolist()
    printed = []
    for custom in (None, trhf.generate):
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            model.generate(**inputs, **kw, streamer=TextStreamer(tokenizer, skip_prompt=True),
                           **({"custom_generate": custom} if custom else {}))
        printed.append(buf.getvalue())
    assert printed[0] == printed[1] and len(printed[0].strip()) > 20
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
    worker = threading.Thread(target=model.generate, kwargs=dict(**inputs, **kw, streamer=streamer,
                                                                  custom_generate=trhf.generate))
    worker.start()
    chunks = list(streamer)
    worker.join()
    assert "".join(chunks).strip() == printed[0].strip() and len(chunks) > 1


def test_the_readmes_use_it_in_your_code_example_runs(embedded, capsys):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Use it in your code"):]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "identical: True" in out


class _Recording:
    """A streamer that records what it is given (transformers' BaseStreamer interface)."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        self.chunks.append(value.flatten().tolist())

    def end(self) -> None:
        self.ended = True


def test_the_streamer_is_read_from_generate_or_its_absence_fails_loudly(monkeypatch):
    """transformers hands a custom_generate no `streamer`: it is read from generate's frame on the installed release,
    and where that frame cannot be read the call raises rather than leave a streamer's consumer waiting for ever."""
    from transformers import GenerationConfig

    model = tiny_model("llama")
    ids = torch.tensor([PROMPTS[0]])
    streamer = _Recording()
    out = model.generate(ids, max_new_tokens=12, streamer=streamer, custom_generate=trhf.generate, **COMMON)
    assert streamer.chunks[0] == PROMPTS[0] and streamer.ended  # the prompt from generate, then ours
    assert sum(streamer.chunks[1:], []) == out[0, len(PROMPTS[0]):].tolist()
    direct = trhf.generate(model, ids, generation_config=GenerationConfig(max_new_tokens=5, do_sample=False))
    assert direct.shape == (1, len(PROMPTS[0]) + 5)  # called directly, not by transformers: no frame is needed
    monkeypatch.setattr(trhf, "_generate_code", lambda function: test_unsupported_settings_are_refused_by_name.__code__)
    with pytest.raises(RuntimeError, match="cannot read the `streamer` of this generate call: transformers 5"):
        model.generate(ids, max_new_tokens=12, streamer=_Recording(), custom_generate=trhf.generate, **COMMON)
