"""The library leaves a model as it found it (tr_core/kernels.py, tr_core/hf.py): after any call no module has new
attributes, the model pickles, other forward wrappers keep working and its own `generate` is stock; and decoding
with mixed plans (one product for one row, another for tree rows) gives the tokens an untouched model's `generate`
gave before anything was tuned."""
from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path

import pytest
import torch
from conftest import ARCHS, TINY_VOCAB, TinyTokenizer, tiny_config, tiny_model

import tr_core.hf as trhf
from tr_core import DecodeConfig, Engine, kernels
from tr_core.kernels import STOCK, TRANSPOSED, LinearPlan
from tr_core.tuning import TUNE_SIZES

WAYS_HERE = kernels.available_ways()
DATA = Path(__file__).resolve().parents[1] / "bench" / "data"
# (one-row way, tree-row way): every pairing of two different ways this torch build has
MIXED = [(one, tree) for one in WAYS_HERE for tree in WAYS_HERE if one != tree]


def mixed_plan(one: str, tree: str) -> LinearPlan:
    """One row (plain decoding, a root-alone step) one way; every tree of 2..64 rows (and a prefill) the other."""
    return LinearPlan({1: one, **{n: tree for n in TUNE_SIZES if n > 1}}, limit=max(TUNE_SIZES))


def raw_model(arch: str, seed: int = 0):
    """A tiny random model of `arch` with its weights as initialised, not scaled up: flat logits, near ties."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(arch), attn_implementation="sdpa", dtype=torch.float32).eval()


def state_of(model) -> dict[str, dict[str, int]]:
    """Every module's own attributes, by identity: what a library must leave as it found it."""
    return {name: {k: id(v) for k, v in m.__dict__.items()} for name, m in model.named_modules()}


class _Sink:
    """A file that only counts what is written to it (pickling the embedded model without keeping 0.5 GB)."""

    size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        return len(data)


def spy_products(monkeypatch) -> list[tuple[str, int]]:
    """(way, rows) of every call of a timed product from now on."""
    calls: list[tuple[str, int]] = []
    for way, product in list(kernels.PRODUCTS.items()):
        monkeypatch.setitem(kernels.PRODUCTS, way, lambda x, w, b, rows, way=way, product=product:
                            calls.append((way, rows)) or product(x, w, b, rows))
    return calls


def test_after_hf_generate_the_model_is_as_found_and_pickles():
    from transformers import StoppingCriteria

    model = tiny_model("llama")
    ids = torch.tensor([[5, 9, 14, 22, 9, 14]])
    kw = dict(max_new_tokens=30, do_sample=False, pad_token_id=0, eos_token_id=1)
    reference = model.generate(ids, **kw)
    before = state_of(model)
    routed = []

    class Watch(StoppingCriteria):  # asked after each step: were the timed products installed just then?
        def __call__(self, input_ids, scores, **kwargs):
            routed.append(kernels.is_routed(model))
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    # a plan that routes every row count (a machine's own timing may keep the library's product everywhere, and
    # then there is nothing to install): one way for one row, another for tree rows
    ways = {1: kernels.TRANSPOSED, 8: kernels.ONEDNN if kernels.ONEDNN in kernels.available_ways() else kernels.STOCK}
    kernels.set_plan(model, kernels.LinearPlan(ways, 8, {way: {n: 1.0} for n, way in ways.items()}))
    out = model.generate(ids, **kw, custom_generate=trhf.generate, template="2.2.2", stopping_criteria=[Watch()])
    assert out.tolist() == reference.tolist()
    assert routed and all(routed) and kernels.plan_of(model).layers > 0, "installed for the call, on every layer"
    assert state_of(model) == before, "no module has new or replaced attributes"
    assert not kernels.is_routed(model) and trhf.engine_of(model).matrix.rows_filled > 0  # kept beside the model
    assert pickle.loads(pickle.dumps(model)).generate(ids, **kw).tolist() == reference.tolist()
    assert model.generate(ids, **kw).tolist() == reference.tolist()


def test_accelerate_hooks_keep_running_around_the_timed_product(monkeypatch):
    from accelerate.hooks import ModelHook, add_hook_to_module, remove_hook_from_module

    class Count(ModelHook):
        calls = 0

        def pre_forward(self, module, *args, **kwargs):
            self.calls += 1
            return args, kwargs

    model = tiny_model("llama")
    plain = list(Engine(model, TinyTokenizer(TINY_VOCAB), tune_kernels=False).generate(
        [3, 4, 5, 6], DecodeConfig(max_new_tokens=20, plain=True)))[-1].tokens
    hooked, foreign = model.model.layers[0].mlp.down_proj, model.model.layers[1].mlp.down_proj
    hook = Count()
    add_hook_to_module(hooked, hook)
    mine = foreign.forward  # a per-instance wrapper with no accelerate-style seam: left in charge of its layer
    seen = []
    foreign.forward = lambda x: seen.append(x.shape) or mine(x)
    wrappers = {name: dict(layer.__dict__) for name, layer in (("hooked", hooked), ("foreign", foreign))}
    kernels.set_plan(model, mixed_plan(TRANSPOSED, WAYS_HERE[-1]))
    weights: list[int] = []
    for way, product in list(kernels.PRODUCTS.items()):
        monkeypatch.setitem(kernels.PRODUCTS, way, lambda x, w, b, rows, product=product:
                            weights.append(id(w)) or product(x, w, b, rows))
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    for cfg in (DecodeConfig(max_new_tokens=20, plain=True), DecodeConfig(max_new_tokens=20, template="hybrid")):
        assert list(engine.generate([3, 4, 5, 6], cfg))[-1].tokens == plain
    assert hook.calls > 0 and id(hooked.weight) in weights, "accelerate's hook ran, and the timed product inside it"
    assert seen and id(foreign.weight) not in weights, "the other wrapper ran its own forward"
    assert {"hooked": dict(hooked.__dict__), "foreign": dict(foreign.__dict__)} == wrappers, "restored exactly"
    remove_hook_from_module(hooked)
    assert hooked.forward.__func__ is torch.nn.Linear.forward and "_old_forward" not in hooked.__dict__


def test_overlapping_answers_share_one_installation_until_the_last_ends():
    """The speed meter alternates a Token Recycling and a plain generator on one model; the studio runs answers in
    worker threads; answers are closed early or raise. The last one running gives the model back."""
    from studio.meter import interleave

    model = tiny_model("llama")
    kernels.set_plan(model, mixed_plan(TRANSPOSED, STOCK))
    before = state_of(model)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    prompt, cfg = [3, 4, 5, 6], DecodeConfig(max_new_tokens=40, template="hybrid")
    tr, plain = engine.generate(prompt, cfg), engine.generate(prompt, DecodeConfig(max_new_tokens=40, plain=True))
    next(tr)
    next(plain)
    tr.close()
    assert kernels.is_routed(model), "the plain answer still runs: still installed"
    next(plain)
    plain.close()
    assert not kernels.is_routed(model) and state_of(model) == before

    def leaves() -> bool:
        raise RuntimeError("the visitor left")

    with pytest.raises(RuntimeError, match="visitor left"):
        list(engine.generate(prompt, cfg, stop=leaves))
    assert not kernels.is_routed(model) and state_of(model) == before
    estimates = list(interleave(engine.generate(prompt, cfg), engine.generate(prompt, DecodeConfig(
        max_new_tokens=40, plain=True)), chunk_ms=2.0, max_s=30.0))
    assert estimates[-1].identical is not False and state_of(model) == before
    worker = threading.Thread(target=lambda: list(engine.generate(prompt, cfg)))
    worker.start()
    list(engine.generate(prompt, DecodeConfig(max_new_tokens=40, plain=True)))
    worker.join()
    assert not kernels.is_routed(model) and state_of(model) == before


def _answers(model, prompts: list[list[int]], new: int) -> list[list[int]]:
    """Greedy `generate` of each prompt: what an untouched model answers."""
    return [model.generate(torch.tensor([p]), max_new_tokens=new, do_sample=False, pad_token_id=0,
                           eos_token_id=1)[0, len(p):].tolist() for p in prompts]


@pytest.mark.parametrize("arch", ARCHS)
def test_mixed_plans_give_an_untouched_models_tokens(arch, monkeypatch):
    """Weights as initialised (flat logits: near ties are common), the reference taken before any tuning, then each
    pairing of two ways forced: plain decoding and draft trees through the engine give the same tokens."""
    model = raw_model(arch)
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(2, TINY_VOCAB, (6 + 9 * i,), generator=g).tolist() for i in range(2)]
    reference = _answers(model, prompts, 40)
    calls = spy_products(monkeypatch)
    accepted = []
    for one, tree in MIXED:
        kernels.set_plan(model, mixed_plan(one, tree))
        engine = Engine(model, TinyTokenizer(TINY_VOCAB))
        calls.clear()
        for prompt, ref in zip(prompts, reference):
            assert list(engine.generate(prompt, DecodeConfig(max_new_tokens=40, plain=True)))[-1].tokens == ref
            for template in ("2.2.2", "hybrid", "hybrid"):  # the second hybrid answer reuses what the first taught
                summary = list(engine.generate(prompt, DecodeConfig(max_new_tokens=40, template=template)))[-1]
                assert summary.tokens == ref, f"{arch}: {one} for one row, {tree} for trees: diverged ({template})"
                accepted.append(summary.mean_accepted)
        assert ((one, 1) in calls) == (one != STOCK) and any(w == tree and n > 1 for w, n in calls) == (tree != STOCK)
    kernels.uninstall(model)
    assert _answers(model, prompts, 40) == reference and max(accepted) > 1.5


def _held_out(n: int) -> list[str]:
    """The first turns of n questions of the project's development sets (code and Spec-Bench), alternating."""
    rows = []
    for name in ("mbpp_dev.jsonl", "spec_bench_dev.jsonl"):
        with open(DATA / name, encoding="utf-8") as f:
            rows.append([json.loads(line)["turns"][0] for line in f if line.strip()])
    return [rows[i % 2][i // 2] for i in range(n)]


def test_the_embedded_model_under_mixed_plans_answers_as_untouched(embedded):
    model, tokenizer = embedded
    inputs = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"] for q in _held_out(3)]
    kept = kernels.plan_of(model)  # another test may have tuned it: only installed during calls, never now
    assert not kernels.is_routed(model) and not any("forward" in m.__dict__ for m in model.modules())
    reference = [model.generate(ids, max_new_tokens=32, do_sample=False) for ids in inputs]
    before = state_of(model)
    try:
        for one, tree in ((TRANSPOSED, WAYS_HERE[-1]), (WAYS_HERE[-1], STOCK)):
            kernels.set_plan(model, mixed_plan(one, tree))
            trhf.reset(model)
            for ids, ref in zip(inputs, reference):
                for template in ("2.2.2", "hybrid"):
                    out = model.generate(ids, max_new_tokens=32, do_sample=False, custom_generate=trhf.generate,
                                         template=template)
                    assert out.tolist() == ref.tolist(), f"{one} for one row, {tree} for trees ({template})"
    finally:
        kernels.uninstall(model)
        if kept is not None:
            kernels.set_plan(model, kept)
    assert state_of(model) == before
    sink = _Sink()
    pickle.dump(model, sink)
    assert sink.size > 100e6 and model.generate(inputs[0], max_new_tokens=32, do_sample=False).tolist() == \
        reference[0].tolist()
