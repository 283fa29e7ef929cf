"""Exact mode (tr_core/invariant.py): row-invariant products, so a tree forward rounds every row as a one-token
forward does, and Token Recycling gives plain decoding's tokens in bfloat16 and float16 too."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tr_core import invariant, kernels
from tr_core.config import DecodeConfig
from tr_core.engine import Engine

from conftest import ARCHS, TINY_VOCAB, TinyTokenizer, tiny_config
from test_untouched import state_of

# Trees of 1 to 80 nodes: a chain of one, a small bush, the first two levels of 2.2.2, the paper's whole tree
TREES = [[[0]], [[0], [1], [0, 0], [0, 1], [1, 0]], [[i] for i in range(8)] + [[i, j] for i in range(4) for j in range(3)],
         "2.2.2", "hybrid"]


def raw(arch: str, dtype: torch.dtype, seed: int = 0):
    """A tiny model of `arch` with weights as initialised (flat logits: near ties are common), in `dtype`."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch), attn_implementation="sdpa", dtype=torch.float32)
    return model.to(dtype).eval()


def answers(engine: Engine, prompts: list[list[int]], **cfg) -> list[list[int]]:
    return [list(engine.generate(p, DecodeConfig(max_new_tokens=40, **cfg)))[-1].tokens for p in prompts]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("arch", ARCHS)
def test_exact_mode_gives_plain_decodings_tokens_with_every_tree(arch, dtype):
    """Untrained weights in bfloat16 and float32, trees of 1 to 80 nodes and the hybrid tree: the same tokens as
    plain decoding through the same products, and trees that really accepted drafts."""
    model = raw(arch, dtype)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), exact=True)
    assert engine.exact and kernels.plan_of(model).exact is not None
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(2, TINY_VOCAB, (5 + 11 * i,), generator=g).tolist() for i in range(3)]
    reference = answers(engine, prompts, plain=True)
    accepted = []
    for tree in TREES:
        for prompt, ref in zip(prompts, reference):
            summary = list(engine.generate(prompt, DecodeConfig(max_new_tokens=40, template=tree)))[-1]
            assert summary.tokens == ref, f"{arch} {dtype}: tree {tree if isinstance(tree, str) else len(tree)}"
            accepted.append(summary.mean_accepted)
    assert max(accepted) > 1.2


def test_the_default_is_exact_in_16_bit_and_not_in_float32():
    model = raw("llama", torch.bfloat16)
    assert Engine(model, TinyTokenizer(TINY_VOCAB)).exact
    assert "exact mode" in kernels.describe_plan(model)["summary"]
    assert not Engine(raw("llama", torch.float32), TinyTokenizer(TINY_VOCAB)).exact
    assert not Engine(model, TinyTokenizer(TINY_VOCAB), exact=False).exact
    assert kernels.plan_of(model) is None  # taken away: the next answer tunes the products again


def test_exact_mode_leaves_the_model_as_it_found_it():
    """The products and the attention are installed only while an answer runs; afterwards every module and config
    holds what it held, and the model's own forward gives the same logits as before."""
    model = raw("gemma3", torch.bfloat16)
    ids = torch.tensor([[3, 4, 5, 6]])
    before_logits = model(ids).logits
    before, attn = state_of(model), model.config._attn_implementation
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), exact=True)
    out = list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=8, template="2.2.2")))
    assert out[-1].tokens and state_of(model) == before and model.config._attn_implementation == attn
    assert not kernels.is_routed(model) and torch.equal(model(ids).logits, before_logits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_chunked_products_multiply_as_the_library_does(dtype):
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(24, 16, generator=g).to(dtype), torch.randn(24, generator=g).to(dtype)
    for chunking in (invariant.Chunking(invariant.RAGGED, 4), invariant.Chunking(invariant.PADDED, 4)):
        for rows in (1, 3, 4, 9):
            x = torch.randn(2, rows, 16, generator=g).to(dtype)
            out = invariant.chunked_linear(x, w, b, 2 * rows, chunking)
            tol = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16: the bias is added after rounding
            assert out.shape == (2, rows, 24)
            assert torch.allclose(out.float(), F.linear(x, w, b).float(), rtol=tol, atol=tol)


def test_the_probe_rejects_a_product_whose_rows_depend_on_the_count(monkeypatch):
    """A product that rounds a row differently when it shares the chunk is not chosen; when none is invariant,
    exact mode is not available and the engine says so by `exact` False."""
    real = invariant._chunk_product

    def count_dependent(chunk, weight, chunking, product):
        return real(chunk, weight, chunking, product) * (1 + 0.05 * (chunk.shape[0] > 2))

    monkeypatch.setattr(invariant, "_chunk_product", count_dependent)
    monkeypatch.setattr(invariant, "_CHOSEN", {})  # probe afresh (and keep this probe's verdicts out of the others')
    weight = torch.randn(8, 8)
    assert not invariant.is_row_invariant(weight, invariant.Chunking(invariant.RAGGED, 8))
    assert invariant.choose([weight]) is None
    assert not Engine(raw("llama", torch.bfloat16), TinyTokenizer(TINY_VOCAB), exact=True).exact


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_each_row_alone_multiplies_as_the_library_does_and_keeps_its_bits_at_any_count(dtype):
    """bmm_product: each row its own product in one batched call, so a row's bits do not move with the count."""
    g = torch.Generator().manual_seed(1)
    w = torch.randn(40, 24, generator=g).to(dtype)
    chunking = invariant.Chunking(invariant.ANY, 8, invariant.BMM)
    x = torch.randn(19, 24, generator=g).to(dtype)
    out = invariant.chunked_linear(x, w, None, 19, chunking, invariant.bmm_product)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.allclose(out.float(), F.linear(x, w).float(), rtol=tol, atol=tol)
    assert invariant.is_row_invariant(w, chunking, invariant.bmm_product)
    assert "each row alone" in chunking.describe()


@pytest.mark.parametrize("lone_holds", [True, False])
def test_each_row_alone_takes_a_plain_steps_product_only_where_it_rounds_alike(monkeypatch, lone_holds):
    """Each row alone chosen: a lone row goes through F.linear (bmv_product) where the probe finds it rounds as the
    batched call does, else it stays in the batched call."""
    monkeypatch.setattr(invariant, "FAST", ())
    monkeypatch.setattr(invariant, "FALLBACKS", ((invariant.BMM, invariant.ANY, 8),))
    monkeypatch.setattr(invariant, "_CHOSEN", {})
    monkeypatch.setattr(invariant, "is_row_invariant",  # what the probe finds on this imagined device
                        lambda w, c, product=invariant.mm_product: lone_holds or c.product != invariant.BMV)
    chosen = invariant.choose([torch.randn(8, 8), torch.randn(16, 8)])
    assert chosen.product == (invariant.BMV if lone_holds else invariant.BMM)
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(40, 24, generator=g).bfloat16(), torch.randn(5, 24, generator=g).bfloat16()
    assert torch.equal(invariant.bmv_product(x[:1], w), F.linear(x[:1], w))  # a lone row: the library's product
    assert torch.equal(invariant.bmv_product(x, w), invariant.bmm_product(x, w))  # rows: the batched call
    assert ("a lone row" in chosen.describe()) == lone_holds


def test_without_a_whole_product_the_fastest_invariant_fallback_is_chosen(monkeypatch):
    """No FAST chunking holds: the fallbacks are timed, and the cheapest that is row-invariant wins, not the first
    listed; one that is cheaper but not invariant is passed over."""
    costs = {(invariant.BMM, 32): 3.0, (invariant.MM, 32): 4.0, (invariant.MM, 16): 1.0, (invariant.MM, 8): 2.0}
    real = invariant.is_row_invariant
    monkeypatch.setattr(invariant, "FAST", ())
    monkeypatch.setattr(invariant, "_CHOSEN", {})
    monkeypatch.setattr(invariant, "fallback_cost", lambda samples, c, product: costs[(c.product, c.width)])
    monkeypatch.setattr(invariant, "is_row_invariant",
                        lambda w, c, product=invariant.mm_product: c.width != 16 and real(w, c, product))
    chosen = invariant.choose([torch.randn(8, 8), torch.randn(8, 8)])  # each row alone not chosen: no lone-row form
    assert (chosen.product, chosen.kind, chosen.width) == (invariant.MM, invariant.PADDED, 8)


@pytest.mark.parametrize("softcap", [None, 30.0])
@pytest.mark.parametrize("masked", ["none", "additive", "bool"])
def test_float64_attention_agrees_with_eager_attention(masked, softcap):
    """Grouped heads, a tree-shaped mask (additive or boolean), with soft-capping (the eager steps) and without (the
    fused kernel): what transformers' eager attention computes, to float rounding."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, n, 16, generator=g) for h, n in ((4, 5), (2, 9), (2, 9)))
    allowed = torch.ones(5, 9, dtype=torch.bool)
    allowed[:, 4:] = torch.tril(torch.ones(5, 5, dtype=torch.bool)) & (torch.rand(5, 5, generator=g) > 0.3)
    allowed[:, 4:].fill_diagonal_(True)
    mask = {"none": None, "bool": allowed[None, None],
            "additive": torch.where(allowed, 0.0, torch.finfo(torch.float32).min)[None, None]}[masked]
    out, _ = invariant.attention(None, q, k, v, mask, scaling=0.25, softcap=softcap)
    kr, vr = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = q @ kr.transpose(2, 3) * 0.25
    scores = torch.tanh(scores / softcap) * softcap if softcap else scores
    if mask is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    want = (torch.softmax(scores, -1) @ vr).transpose(1, 2)
    assert out.shape == (1, 5, 4, 16) and torch.allclose(out, want, atol=1e-5)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2"])
def test_a_ragged_batch_in_bfloat16_gives_each_answer_plain_decodings_tokens(arch):
    """Exact mode across a shared forward: rows of different lengths joining as others leave, untrained weights in
    bfloat16; each answer equals the same prompt decoded plainly alone."""
    from test_batch import batched, ragged_prompts

    model = raw(arch, torch.bfloat16)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), exact=True)
    prompts = ragged_prompts(5)
    plain = [list(engine.generate(p, DecodeConfig(max_new_tokens=30, plain=True)))[-1].tokens for p in prompts]
    tokens, _ = batched(model, prompts, DecodeConfig(max_new_tokens=30, template="2.2.2"), max_rows=3)
    assert engine.exact and tokens == plain


def test_first_difference():
    from tr_core.divergence import first_difference

    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_a_divergence_names_the_token_the_competitor_and_their_gap():
    """Two answers parting at token 3, the second taking the runner-up there: the explanation names both tokens,
    scores them by a one-token forward of the common prefix (the first is the argmax), and says which setting
    would make them agree."""
    from tr_core.divergence import EXACT_MODE, UNKNOWN, explain

    model = raw("llama", torch.bfloat16)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), exact=False)
    prompt = [5, 9, 14, 3, 22]
    first = answers(engine, [prompt], plain=True)[0][:8]
    logits = model(torch.tensor([prompt + first[:3]])).logits[0, -1].float()
    runner_up = int(logits.topk(2).indices[1])
    second = first[:3] + [runner_up] + first[4:]
    why = explain(engine, prompt, first, second)
    assert (why.index, why.first_token, why.second_token, why.dtype) == (3, first[3], runner_up, "bfloat16")
    assert why.first_logit >= why.second_logit and why.gap == pytest.approx(why.first_logit - why.second_logit)
    assert why.fix == EXACT_MODE and why.as_data()["fix"] == EXACT_MODE
    assert explain(engine, prompt, first, first) is None and explain(engine, prompt, first, first[:5]) is None
    assert explain(Engine(model, TinyTokenizer(TINY_VOCAB), exact=True), prompt, first, second).fix == UNKNOWN


def test_the_meter_says_identical_up_to_rounding_outside_exact_mode_and_where_they_parted():
    from present.meter import MeterView, meter_html

    parted = {"index": 52, "first_token": 7, "second_token": 9, "first_text": " 9", "second_text": " 8",
              "first_logit": 14.25, "second_logit": 14.246, "gap": 0.004, "dtype": "bfloat16", "fix": "exact_mode"}
    near = meter_html(MeterView(state="measured", ratio=1.5, identical=False, exact=False, parted=parted))
    assert "≈ identical up to rounding" in near and "✗" not in near
    assert "parted at answer token 53: &#x27; 9&#x27; (Token Recycling) vs &#x27; 8&#x27; (plain)" in near
    assert "scored 0.004 apart in bfloat16, a near tie; exact mode" in near
    wrong = meter_html(MeterView(state="measured", ratio=1.5, identical=False, exact=True,
                                 parted={**parted, "fix": "unknown", "gap": None}))
    assert "✗ differs from plain decoding" in wrong and "should not happen" in wrong and "apart" not in wrong
    assert "✓ token-identical" in meter_html(MeterView(identical=True, exact=True))


def test_a_speed_record_with_a_parting_survives_a_trace_file(tmp_path):
    """The measurement's parting is kept with the trace, and a saved trace reads it back."""
    from studio.meter import SpeedEstimate
    from tr_core.trace import Trace
    from tr_core.trace_schema import SPEED_KEYS

    import dataclasses

    est = SpeedEstimate(1.4, 0.1, 20.0, 14.0, 2.0, 40, 4, True, identical=False, exact=False,
                        parted={"index": 3, "first_token": 5, "second_token": 6, "first_text": "a",
                                "second_text": "b", "first_logit": 1.0, "second_logit": 0.99, "gap": 0.01,
                                "dtype": "float32", "fix": "exact_mode"})
    assert set(dataclasses.asdict(est)) == SPEED_KEYS
    trace = Trace(model="m", speed=dataclasses.asdict(est))
    back = Trace.load(trace.save(tmp_path / "t.json"))
    assert back.speed["parted"] == est.parted and back.speed["exact"] is False


def test_the_studio_completes_a_parting_with_the_tokens_texts_and_scores():
    """After a measurement whose runs parted, the studio names both tokens and scores them by one forward."""
    import dataclasses

    from studio.measure import explained
    from studio.meter import SpeedEstimate
    from tr_core.events import SummaryEvent
    from tr_core.trace import Trace

    model = raw("llama", torch.bfloat16)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), exact=False)
    prompt = [5, 9, 14, 3, 22]
    answer = answers(engine, [prompt], plain=True)[0][:6]
    summary = list(engine.generate(prompt, DecodeConfig(max_new_tokens=6, plain=True)))[-1]
    trace = Trace(model="m", summary=dataclasses.replace(summary, tokens=answer))
    est = SpeedEstimate(1.2, 0.1, 10.0, 8.0, 1.5, 6, 2, True, identical=False,
                        parted={"index": 2, "first_token": answer[2], "second_token": (answer[2] + 1) % TINY_VOCAB})
    done = explained(est, engine, prompt, trace)
    p = done.parted
    assert done.exact is False and p["index"] == 2 and p["first_text"] == engine.token_text(answer[2])
    assert p["dtype"] == "bfloat16" and p["gap"] == pytest.approx(abs(p["first_logit"] - p["second_logit"]))
    assert p["first_logit"] >= p["second_logit"] and p["fix"] == "exact_mode"
    same = explained(dataclasses.replace(est, identical=True, parted=None), engine, prompt, trace)
    assert same.parted is None and same.exact is False
    assert isinstance(summary, SummaryEvent)


def test_the_decoding_line_names_the_setting_and_leaves_the_outcome_to_the_meter():
    from studio.views import decoding_html, decoding_text

    exact = {"temperature": 0.0, "dtype": "bfloat16", "exact": True}
    assert decoding_text(exact) == "Greedy decoding (the model's top token every step, exact mode)"
    assert 'title="bfloat16, exact mode' in decoding_html(exact)
    rounding = {"temperature": 0.0, "dtype": "float32", "exact": False}
    assert decoding_text(rounding) == "Greedy decoding (the model's top token every step)"
    assert "float32 without exact mode" in decoding_html(rounding)
    for settings in (exact, rounding, {"temperature": 0.0}):  # a promise here would sit beside the meter's outcome
        assert not any(word in decoding_text(settings) for word in ("identical", "rounding", "plain decoding"))
    assert "title" not in decoding_html({"temperature": 0.0})


def test_caches_first_written_in_exact_mode_store_float64_and_others_their_dtype():
    """Exact mode's attention computes in float64: its caches hold the (exactly converted) entries in float64, so
    that a forward converts only its new entries; other caches keep the model's dtype."""
    from tr_core.kv_cache import TreeKVCache

    k = torch.randn(1, 2, 3, 4).to(torch.bfloat16)
    with invariant.wide_storage():
        wide = TreeKVCache()
        keys, values = wide.update(k, k, 0)
    assert keys.dtype == values.dtype == torch.float64 and torch.equal(keys, k.double())
    assert TreeKVCache().update(k, k, 0)[0].dtype == torch.bfloat16


def test_a_layout_is_probed_once_per_process(monkeypatch):
    """The probe's verdict depends only on the layer layouts and products: a second engine of the same shapes, or
    an explanation asking whether exact mode is available, does not probe again."""
    monkeypatch.setattr(invariant, "_CHOSEN", {})
    probes = []
    real = invariant._probe
    monkeypatch.setattr(invariant, "_probe", lambda *a: probes.append(1) or real(*a))
    first = kernels.exact_plan(raw("llama", torch.bfloat16))
    assert kernels.exact_plan(raw("llama", torch.bfloat16, seed=1)).exact == first.exact and len(probes) == 1


def test_a_prompts_forward_takes_the_models_dtype_and_the_steps_float64(monkeypatch):
    """Exact mode runs a prompt's forward (all but its last token) in the model's dtype through the library's
    products (invariant.relaxed: 1.4-1.8x faster there), and every step, the first included, in float64 attention
    through row-invariant products; plain decoding's first step is a forward of its own, as a tree's is."""
    model = raw("llama", torch.bfloat16)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), exact=True)
    prompt = list(range(3, 20))
    list(engine.generate(prompt, DecodeConfig(max_new_tokens=2, plain=True)))  # tuning and probes first
    seen, sdpa = [], F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, *a, **kw: seen.append((q.shape[2], q.dtype)) or sdpa(q, *a, **kw))
    for plain in (True, False):
        seen.clear()
        list(engine.generate(prompt, DecodeConfig(max_new_tokens=3, plain=plain, template="2.2.2")))
        layers = model.config.num_hidden_layers
        assert seen[:layers] == [(len(prompt) - 1, torch.bfloat16)] * layers
        assert {dtype for _, dtype in seen[layers:]} == {torch.float64}
