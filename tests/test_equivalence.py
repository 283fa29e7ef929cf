"""Losslessness: Token Recycling returns exactly plain decoding's tokens, on tiny models of 16 architectures."""
from __future__ import annotations

import pytest
import torch
from conftest import ARCHS, MORE_ARCHS, TINY_VOCAB, TinyTokenizer, tiny_model, tiny_model_of

from tr_core import DecodeConfig, Engine, StepEvent, SummaryEvent


def prompts(n: int, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, TINY_VOCAB, (4 + 6 * i,), generator=g).tolist() for i in range(n)]


def run(engine: Engine, prompt: list[int], **kw) -> SummaryEvent:
    events = list(engine.generate(prompt, DecodeConfig(**kw)))
    assert isinstance(events[-1], SummaryEvent)
    assert all(isinstance(e, StepEvent) for e in events[:-1])
    return events[-1]


def check_lossless(model, label: str, templates: tuple[str, ...], n_prompts: int, max_new_tokens: int) -> None:
    """Greedy plain decoding through the engine equals transformers' generate, and every template equals it, on
    `n_prompts` prompts; drafts must really be accepted, or the comparison proves little."""
    # transformers' own answers first, on the model as it came: before any engine has timed or installed anything
    untouched = [model.generate(torch.tensor([p]), max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=1,
                                pad_token_id=0)[0, len(p):].tolist() for p in prompts(n_prompts)]
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    accepted = []
    for prompt, hf in zip(prompts(n_prompts), untouched):
        plain = run(engine, prompt, max_new_tokens=max_new_tokens, plain=True)
        assert plain.tokens == hf, "the harness itself must equal transformers' generate on the untouched model"
        for template in templates:
            tr = run(engine, prompt, max_new_tokens=max_new_tokens, template=template)
            assert tr.tokens == plain.tokens, f"{label}/{template} diverged from plain decoding"
            accepted.append(tr.mean_accepted)
    assert max(accepted) > 2.0


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_recycling_equals_plain_and_hf_generate(arch, attn):
    templates = ("2.2.2", "small-16", "adaptive", "adaptive-fixed", "hybrid", "hybrid-fixed")
    check_lossless(tiny_model(arch, attn), f"{arch}/{attn}", templates, n_prompts=3, max_new_tokens=50)


@pytest.mark.parametrize("arch", sorted(MORE_ARCHS))
def test_greedy_recycling_equals_plain_on_eleven_more_architectures(arch):
    model = tiny_model_of(arch, **MORE_ARCHS[arch])
    check_lossless(model, arch, ("2.2.2", "hybrid", "hybrid-fixed"), n_prompts=2, max_new_tokens=40)


@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt2", "gemma2", "gpt_oss"])
def test_seeded_sampling_recycling_equals_plain(arch):
    model = tiny_model(arch) if arch in ARCHS else tiny_model_of(arch, **MORE_ARCHS[arch])
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    outputs = set()
    for seed in range(3):
        for prompt in prompts(2, seed=seed + 5):
            kw = dict(max_new_tokens=40, temperature=0.8, top_p=0.9, top_k=30, seed=seed)
            plain = run(engine, prompt, plain=True, **kw)
            for template in ("2.2.2", "adaptive", "hybrid", "hybrid-fixed"):
                assert run(engine, prompt, template=template, **kw).tokens == plain.tokens
            outputs.add(tuple(plain.tokens))
    assert len(outputs) == 6, "different seeds and prompts must give different samples"


@pytest.mark.parametrize("arch", ARCHS)
def test_the_gpu_code_path_is_lossless_too_run_on_cpu_tensors(arch):
    """On a GPU the adaptive and hybrid trees are grown with tensor ops on the device and ride the step's one sync
    (`grow_on_device`, `lookahead_on_device`); on a CPU in plain Python. No GPU here: the device path runs on CPU
    tensors, greedy and with seeded sampling, and must give plain decoding's tokens, with drafts accepted."""
    from tr_core.adaptive import AdaptiveDrafter
    from tr_core.hybrid import HybridDrafter

    engine = Engine(tiny_model(arch), TinyTokenizer(TINY_VOCAB))
    engine.adaptive = AdaptiveDrafter(engine.device, on_host=False)
    engine.hybrid = HybridDrafter(engine.device, on_host=False)
    for drafter in (engine.adaptive, engine.hybrid):  # forwards that cost alike at every size, whatever the machine's
        drafter.cost.set_measured({n: [10.0] for n in (1, 2, 4, 8, 16, 32, 64, 128)}, max_tokens=128)  # timings:
        drafter.cost.observe = lambda *args, **kw: None  # trees are drafted (a busy machine once made them not pay)
    accepted = []
    for prompt in prompts(3):
        for kw in (dict(max_new_tokens=40), dict(max_new_tokens=30, temperature=0.8, top_p=0.9, seed=3)):
            plain = run(engine, prompt, plain=True, **kw)
            for template in ("adaptive", "adaptive-fixed", "hybrid", "hybrid-fixed"):
                events = list(engine.generate(prompt, DecodeConfig(template=template, **kw)))
                assert events[-1].tokens == plain.tokens, f"{arch}/{template}/{kw} diverged on the device path"
                assert any(e.node_probs is not None and len(e.tokens) > 1 for e in events[:-1])  # trees were drafted
                accepted.append(events[-1].mean_accepted)
    assert not engine.adaptive.on_host and not engine.hybrid.on_host and max(accepted) > 2.0


def test_sampled_first_token_follows_model_distribution():
    """Chi-square over seeds: the engine's first sampled token is distributed as softmax(logits / T)."""
    model = tiny_model("llama", seed=3)
    with torch.no_grad():  # flatten the model's distribution so several tokens are likely
        model.lm_head.weight.mul_(0.05)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    prompt = [5, 6, 7]
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1] / 0.7, -1)
    n = 1500
    counts = torch.zeros(TINY_VOCAB)
    for seed in range(n):
        tok = run(engine, prompt, max_new_tokens=1, temperature=0.7, seed=seed, template="2.2.2").tokens[0]
        counts[tok] += 1
    expected = probs * n
    big = expected >= 5  # pool the rare tokens into one cell
    obs = torch.cat([counts[big], counts[~big].sum().view(1)])
    exp = torch.cat([expected[big], expected[~big].sum().view(1)])
    chi2 = float(((obs - exp) ** 2 / exp.clamp(min=1e-9)).sum())
    dof = int(big.sum())
    critical = dof + 4.0 * (2 * dof) ** 0.5 + 10  # well beyond p = 0.001 for these dof
    assert dof >= 5 and chi2 < critical, f"chi2 {chi2:.1f} with {dof} dof"


def _warm_engine(arch="llama"):
    model = tiny_model(arch)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    prompt = prompts(1, seed=9)[0]
    plain = run(engine, prompt, max_new_tokens=60, plain=True)
    run(engine, prompt, max_new_tokens=60, template="2.2.2")  # teach the matrix this continuation
    return engine, prompt, plain.tokens


def test_max_new_tokens_inside_an_accepted_path():
    engine, prompt, reference = _warm_engine()
    cut_inside = 0
    for limit in range(1, 13):
        events = list(engine.generate(prompt, DecodeConfig(max_new_tokens=limit, template="2.2.2")))
        summary = events[-1]
        assert summary.tokens == reference[:limit] and summary.stop_reason == "length"
        last = events[-2]
        cut_inside += last.bonus is None  # the limit fell inside the accepted path: no bonus emitted
        assert len(last.emitted) <= len(last.accepted)
    assert cut_inside > 0, "the matrix predicts this text, so some limit must fall inside an accepted path"


def test_eos_inside_an_accepted_path_stops_there():
    engine, prompt, reference = _warm_engine()
    cuts_inside = 0
    for cut in range(3, 40):
        stop_token = reference[cut - 1]
        if reference.index(stop_token) != cut - 1:
            continue
        engine.stop_token_ids = [stop_token]
        events = list(engine.generate(prompt, DecodeConfig(max_new_tokens=60, template="2.2.2")))
        summary = events[-1]
        assert summary.tokens == reference[:cut] and summary.stop_reason == "eos"
        last = events[-2]
        assert last.emitted[-1] == stop_token
        cuts_inside += last.bonus is None  # the stop token was a draft token: what followed it was dropped
    assert cuts_inside > 0, "drafts must be accepted past a stop token for this test to mean anything"
    plain = list(engine.generate(prompt, DecodeConfig(max_new_tokens=60, plain=True)))[-1]
    assert plain.tokens == summary.tokens


def test_events_are_plain_data_and_consistent():
    import json

    engine, prompt, reference = _warm_engine()
    events = list(engine.generate(prompt, DecodeConfig(max_new_tokens=30, template="2.2.2")))
    json.dumps([e.to_dict() for e in events])  # no tensors anywhere
    emitted = [t for e in events[:-1] for t in e.emitted]
    assert emitted == events[-1].tokens == reference[:30]
    for e in events[:-1]:
        # the paper's 81 nodes, less any under a row never written
        assert len(e.tokens) == len(e.parents) == len(e.depths) == len(e.ranks) <= 81
        assert e.accepted[0] == 0
        assert all(e.parents[b] == a for a, b in zip(e.accepted, e.accepted[1:]))  # a root-down path
        drafts = [e.tokens[j] for j in e.accepted[1:]]
        assert e.emitted[: len(drafts)] == drafts[: len(e.emitted)]  # accepted drafts first, then the bonus
        assert set(e.timings) == {"draft", "forward", "verify", "update", "sync", "commit", "learn", "total"}
        assert len(e.matrix_rows) == len(set(e.tokens)) == len(e.matrix_values)
    summary = events[-1]
    assert summary.mean_accepted == pytest.approx(summary.new_tokens / summary.steps)


def test_bad_prompts_are_refused():
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    with pytest.raises(ValueError, match="empty"):
        list(engine.generate([], DecodeConfig()))
    with pytest.raises(ValueError, match="vocabulary"):
        list(engine.generate([TINY_VOCAB + 5], DecodeConfig()))
    with pytest.raises(ValueError, match="context"):
        list(engine.generate([3] * 600, DecodeConfig()))
    with pytest.raises(ValueError, match="top_p"):
        DecodeConfig(top_p=0.0)


def test_matrix_persists_across_answers_and_resets():
    engine, prompt, _ = _warm_engine()
    filled = engine.matrix.rows_filled
    assert filled > 0
    again = list(engine.generate(prompt, DecodeConfig(max_new_tokens=60, template="2.2.2")))[-1]
    assert again.mean_accepted > 3.0  # the second answer to the same prompt reuses what the first taught
    engine.matrix.reset()
    assert engine.matrix.rows_filled == 0


def test_context_end_falls_back_to_plain_steps():
    """Near max_position_embeddings, tree nodes would sit past the last position: plain steps finish the answer."""
    engine = Engine(tiny_model("gpt2"), TinyTokenizer(TINY_VOCAB))  # learned absolute positions: 512 of them
    prompt = (prompts(1, seed=4)[0] * 200)[:500]
    plain = run(engine, prompt, max_new_tokens=60, plain=True)
    assert plain.new_tokens == 12 and plain.stop_reason == "length"  # the context holds 512 positions
    for template in ("2.2.2", "adaptive"):
        assert run(engine, prompt, max_new_tokens=60, template=template).tokens == plain.tokens
