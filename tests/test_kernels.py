"""The linear layers' product on a CPU (tr_core/kernels.py): the same numbers either way, lossless decoding with
every row count routed to W @ x^T, one timed plan per model, and nothing routed where it must not be."""
from __future__ import annotations

import copy
import dataclasses
import gc
import json

import pytest
import torch
from conftest import ARCHS, TINY_VOCAB, TinyTokenizer, tiny_model

from tr_core import DecodeConfig, Engine
from tr_core import kernels, machine, tuning
from tr_core.kernels import ONEDNN, STOCK, TRANSPOSED, LinearPlan

WAYS_HERE = kernels.available_ways()


def every_row(way: str) -> LinearPlan:
    return LinearPlan({m: way for m in range(1, 33)}, limit=32)


EVERY_ROW = every_row(TRANSPOSED)


@pytest.mark.parametrize("way", WAYS_HERE[1:])
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 17])
@pytest.mark.parametrize("bias", [True, False])
def test_each_product_equals_the_library_product(way, rows, bias):
    g = torch.Generator().manual_seed(rows)
    layer = torch.nn.Linear(24, 40, bias=bias)
    x = torch.randn(1, rows, 24, generator=g)
    with torch.no_grad():  # decoding's setting (the packed oneDNN product has no gradient)
        out = kernels.PRODUCTS[way](x, layer.weight, layer.bias, rows)
    assert out.shape == (1, rows, 40) and out.is_contiguous()
    torch.testing.assert_close(out, torch.nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)


def test_a_column_major_input_gives_the_same_numbers_and_a_row_major_output():
    """An elementwise product of transposed results can arrive column-major; the output must still be row-major."""
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(16, 3).t()  # [3, 16], strides (1, 3)
    assert not x.is_contiguous()
    out = kernels.transposed_linear(x, layer.weight, layer.bias, 3)
    assert out.is_contiguous()
    torch.testing.assert_close(out, layer(x))


def test_routes_follow_the_nearest_timed_row_count():
    plan = LinearPlan({1: TRANSPOSED, 2: TRANSPOSED, 3: STOCK, 4: TRANSPOSED, 6: STOCK, 8: ONEDNN}, limit=9)
    routes = plan.routes()
    assert len(routes) == 10 and routes[0] == 0
    t, s, o = (kernels.WAYS.index(w) for w in (TRANSPOSED, STOCK, ONEDNN))
    assert list(routes[1:]) == [t, t, s, t, t, s, s, o, o]
    assert LinearPlan({}, limit=4).routes() == ()
    ms = {STOCK: {1: 5.0, 2: 3.0, 3: 4.0}, TRANSPOSED: {1: 4.0, 2: 3.0, 3: 1.0}, ONEDNN: {1: 4.5, 2: 2.0}}
    assert tuning.choose(ms) == {1: TRANSPOSED, 2: ONEDNN}, "the fastest way per size timed every way"
    assert tuning.choose({STOCK: {1: 3.0}, TRANSPOSED: {1: 3.0}}) == {1: STOCK}, "a tie keeps the library's"


def test_row_counts_past_the_largest_timed_follow_its_way(monkeypatch):
    """A long prompt's prefill (more rows than any size timed) takes the way of the largest size timed."""
    layer = torch.nn.Linear(8, 6)
    taken: list[tuple[str, int]] = []
    for way in (TRANSPOSED, STOCK):
        monkeypatch.setitem(kernels.PRODUCTS, way, lambda x, w, b, rows, way=way: taken.append((way, rows)) or
                            torch.nn.functional.linear(x, w, b))
    kernels.set_plan(layer, LinearPlan({1: STOCK, 4: TRANSPOSED}, limit=4))
    with torch.no_grad(), kernels.installed(layer):
        for rows in (1, 3, 4, 5, 300):
            layer(torch.randn(1, rows, 8))
    assert taken == [(TRANSPOSED, 3), (TRANSPOSED, 4), (TRANSPOSED, 5), (TRANSPOSED, 300)], "1 row: the library's"
    kernels.set_plan(layer, LinearPlan({1: TRANSPOSED, 4: STOCK}, limit=4))
    taken.clear()
    with torch.no_grad(), kernels.installed(layer):
        layer(torch.randn(300, 8))
    assert taken == [], "past the limit, where the largest size took the library's product, so does the prefill"


@pytest.mark.parametrize("way", WAYS_HERE[1:])
@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_recycling_is_lossless_with_every_row_count_routed_one_way(arch, way):
    model = tiny_model(arch)
    stock_logits = model(torch.tensor([[3, 4, 5, 6]])).logits
    kernels.set_plan(model, every_row(way))
    with kernels.installed(model):
        routed = [m for m in model.modules() if "forward" in m.__dict__]
        assert routed and len(routed) == kernels.plan_of(model).layers
        torch.testing.assert_close(model(torch.tensor([[3, 4, 5, 6]])).logits, stock_logits, rtol=1e-4, atol=1e-5)
    assert not any("forward" in m.__dict__ for m in model.modules()), "removed when the block ends"
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    g = torch.Generator().manual_seed(7)
    accepted = []
    for i in range(3):
        prompt = torch.randint(2, TINY_VOCAB, (5 + 7 * i,), generator=g).tolist()
        plain = list(engine.generate(prompt, DecodeConfig(max_new_tokens=40, plain=True)))[-1]
        for template in ("2.2.2", "adaptive-fixed", "hybrid", "hybrid-fixed"):
            tr = list(engine.generate(prompt, DecodeConfig(max_new_tokens=40, template=template)))[-1]
            assert tr.tokens == plain.tokens, f"{arch}/{template} diverged from plain decoding"
            accepted.append(tr.mean_accepted)
    assert max(accepted) > 2.0, "drafts must be accepted, or the comparison proves little"
    assert set(kernels.plan_of(model).ways.values()) == {way}, "an existing plan is never re-timed"


def test_one_timing_per_model_shared_by_every_engine(monkeypatch):
    model = tiny_model("llama")
    calls = []
    real = tuning.tune
    monkeypatch.setattr(tuning, "tune", lambda runner, context, **kw: calls.append(1) or real(runner, context, repeats=1))
    first = Engine(model, TinyTokenizer(TINY_VOCAB))
    assert first.times_forwards_first(DecodeConfig(plain=True)), "an untuned model's first answer times forwards"
    list(first.generate([3, 4, 5], DecodeConfig(max_new_tokens=4, plain=True)))
    second = Engine(model, TinyTokenizer(TINY_VOCAB))
    list(second.generate([3, 4, 5], DecodeConfig(max_new_tokens=4, template="2.2.2")))
    assert calls == [1]
    plan = kernels.plan_of(model)
    assert set(plan.ms) == set(WAYS_HERE) and set(plan.ms[STOCK]) == set(tuning.TUNE_SIZES)
    assert plan.ways == tuning.choose(plan.ms)
    described = kernels.describe_plan(model)
    assert described["ways"] == {str(n): w for n, w in plan.ways.items()} and "linear layers" in described["summary"]
    assert not second.times_forwards_first(DecodeConfig(plain=True))


def test_an_engine_told_not_to_tune_leaves_the_model_alone():
    model = tiny_model("llama")
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), tune_kernels=False)
    list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=4, plain=True)))
    assert kernels.plan_of(model) is None
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert kernels.describe_plan(model)["ways"] == {}


def test_uninstall_gives_the_library_forward_back():
    model = tiny_model("llama")
    kernels.set_plan(model, EVERY_ROW)
    with kernels.installed(model):
        assert kernels.is_routed(model)
        kernels.uninstall(model)  # even in use: back to the library's product at once
        assert kernels.plan_of(model) is None and not kernels.is_routed(model)
        assert not any("forward" in m.__dict__ for m in model.modules())


@pytest.mark.parametrize("way", WAYS_HERE[1:])
@torch.no_grad()
def test_a_deep_copy_routes_its_own_weights(way):
    model = tiny_model("llama")
    kernels.set_plan(model, every_row(way))
    ids = torch.tensor([[3, 4, 5]])
    with kernels.installed(model):
        before = model(ids).logits.clone()
        twin = copy.deepcopy(model)  # mid-call, after a forward: oneDNN's packed weights exist, must not be shared
        for p in twin.parameters():
            p.mul_(0.5)
        assert not torch.allclose(twin(ids).logits, before)
        torch.testing.assert_close(model(ids).logits, before)


@pytest.mark.skipif(ONEDNN not in WAYS_HERE, reason="this torch build has no oneDNN product")
def test_onednn_packs_each_weight_once_and_again_after_it_changes():
    layer = torch.nn.Linear(24, 40)
    x = torch.randn(4, 24)
    with torch.no_grad():
        first = kernels.packed_weight(layer.weight)
        assert kernels.packed_weight(layer.weight) is first, "packed once, then reused"
        layer.weight.mul_(2.0)  # an in-place change (a loaded state dict, a fine-tune step)
        out = kernels.onednn_linear(x, layer.weight, layer.bias, 4)
        assert kernels.packed_weight(layer.weight) is not first
    torch.testing.assert_close(out, torch.nn.functional.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    with torch.enable_grad():  # autograd on (whatever another test left): the library's product, differentiable
        out = kernels.onednn_linear(x, layer.weight, layer.bias, 4)
        out.sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.shape == layer.weight.shape


@pytest.mark.skipif(ONEDNN not in WAYS_HERE, reason="this torch build has no oneDNN product")
@torch.no_grad()
def test_packed_weights_are_freed_when_no_row_count_takes_onednn():
    model = tiny_model("llama")
    weights = [layer.weight for layer in kernels.linear_layers(model)]
    kernels.set_plan(model, every_row(ONEDNN))
    with kernels.installed(model):
        model(torch.tensor([[3, 4, 5]]))
    assert all(kernels.is_packed(w) for w in weights), "every routed layer multiplies its packed weight"
    kernels.set_plan(model, EVERY_ROW)  # transposed everywhere: the packed copies are dead weight
    assert not any(kernels.is_packed(w) for w in weights)
    kernels.set_plan(model, every_row(ONEDNN))
    with kernels.installed(model):
        model(torch.tensor([[3, 4, 5]]))
    kernels.uninstall(model)
    assert not any(kernels.is_packed(w) for w in weights)


@pytest.mark.skipif(ONEDNN not in WAYS_HERE, reason="this torch build has no oneDNN product")
@torch.no_grad()
def test_a_weight_that_dies_takes_its_pack_with_it():
    layer = torch.nn.Linear(24, 40)
    kernels.packed_weight(layer.weight)
    key = id(layer.weight)
    assert kernels.is_packed(layer.weight) and key in kernels._PACKS
    del layer
    gc.collect()
    assert key not in kernels._PACKS, "the pack of a freed weight is freed too"


def test_packs_are_made_only_where_free_memory_holds_them_twice_over():
    model = tiny_model("llama")
    need = sum(layer.weight.numel() * layer.weight.element_size() for layer in kernels.linear_layers(model))
    assert kernels.no_room_for_packs(model, free=2 * need) == ""
    note = kernels.no_room_for_packs(model, free=2 * need - 1)
    assert "packed" in note and "GiB" in note
    free = machine.free_memory()
    assert free is None or free > 0  # this machine's own reading (Linux: /proc/meminfo and the control group)


@pytest.mark.skipif(ONEDNN not in WAYS_HERE, reason="this torch build has no oneDNN product")
def test_a_machine_without_room_for_the_packs_tunes_without_onednn(monkeypatch):
    monkeypatch.setattr(machine, "free_memory", lambda: 1024)
    model = tiny_model("llama")
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    plain = list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=6, plain=True)))[-1].tokens
    plan = kernels.plan_of(model)
    assert ONEDNN not in plan.ms and STOCK in plan.ms
    assert "packed product not tried" in plan.summary() and kernels.describe_plan(model)["note"] == plan.note
    assert not any(kernels.is_packed(layer.weight) for layer in kernels.linear_layers(model))
    assert list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=6, template="hybrid")))[-1].tokens == plain


def test_only_plain_linear_layers_on_a_cpu_are_routed():
    class Quantized(torch.nn.Linear):  # a subclass (e.g. a quantized layer) keeps its own forward
        pass

    net = torch.nn.Sequential(torch.nn.Linear(8, 8), Quantized(8, 8))
    assert kernels.linear_layers(net) == [net[0]]
    assert kernels.needs_tuning(net, torch.device("cpu"))
    assert not kernels.needs_tuning(net, torch.device("cuda"))
    assert not kernels.needs_tuning(torch.nn.Sequential(torch.nn.ReLU()), torch.device("cpu"))
    kernels.set_plan(net, EVERY_ROW)
    with kernels.installed(net):
        assert "forward" in net[0].__dict__ and "forward" not in net[1].__dict__
        x = torch.randn(2, 8, dtype=torch.float64)  # another dtype than the weights: the library's path (its error)
        with pytest.raises(RuntimeError):
            net[0](x)


def test_the_cli_refuses_an_unknown_linear_choice(capsys):
    from tr_core.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["generate", "--prompt", "hi", "--linear", "fast"])
    assert exc.value.code == 2
    assert "--linear" in capsys.readouterr().err


@pytest.mark.parametrize("choice", ["auto", "stock"])
def test_profile_reports_how_the_linear_layers_multiply(tmp_path, capsys, choice):
    import json

    from tr_core.cli import main

    out = tmp_path / "curve.json"
    code = main(["profile", "--config", "llama-tiny", "--device", "cpu", "--sizes", "1,2,4", "--repeats", "1",
                 "--warmup", "0", "--context", "16", "--linear", choice, "--json", str(out)])
    assert code == 0
    linear = json.loads(out.read_text())["linear"]
    assert linear["summary"] in capsys.readouterr().out
    if choice == "auto":
        assert set(linear["ms"]) == set(WAYS_HERE) and "by row count" in linear["summary"]
        assert set(linear["ways"]) == {str(n) for n in tuning.TUNE_SIZES}
    else:
        assert linear["ways"] == {} and "not tuned" in linear["summary"]


def test_a_build_without_onednn_tunes_the_other_two_ways(monkeypatch):
    def missing(*args):
        raise RuntimeError("no mkldnn in this build")

    monkeypatch.setattr(kernels, "onednn_linear", missing)
    assert kernels.available_ways() == (STOCK, TRANSPOSED)
    model = tiny_model("llama")
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=3, plain=True)))
    assert set(kernels.plan_of(model).ms) == {STOCK, TRANSPOSED}


def test_the_cost_probe_takes_the_tuned_forwards_and_times_only_the_larger_sizes(monkeypatch):
    """After tuning on a CPU, the adaptive tree's start-up probe reuses the plan's timings of 1-32 and 64 tokens (the same
    whole forwards, timed the way they now run) and times only the grid sizes past them."""
    from tr_core import cost as cost_mod

    monkeypatch.setattr(kernels, "STEADY_SPREAD", float("inf"))  # tiny forwards on a busy machine: steady here
    monkeypatch.setattr(cost_mod, "STEADY_SPREAD", float("inf"))
    model = tiny_model("llama")
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    timed: list[list[int]] = []
    real = cost_mod.measure_forward_costs
    monkeypatch.setattr(cost_mod, "measure_forward_costs",
                        lambda runner, context, sizes, repeats=2, warmup=1: timed.append(list(sizes)) or
                        real(runner, context, sizes, repeats=1, warmup=0))
    list(engine.generate([3, 4, 5, 6], DecodeConfig(max_new_tokens=4, template="adaptive")))
    plan = kernels.plan_of(model)
    assert plan is not None and timed == [[48, 81]]  # 64 is a tuned size too
    known = kernels.timed_costs(model)
    assert set(known) == set(tuning.TUNE_SIZES)
    assert all(known[n] == plan.ms[plan.ways[n]][n] for n in known)
    curve = engine.adaptive.cost
    assert all(curve.probed[n] == known[n] for n in tuning.TUNE_SIZES if n <= 81) and curve.probed[81] > 0
    assert kernels.timed_costs(tiny_model("llama")) == {}  # never tuned: nothing known, the probe times every size


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_weights_on_a_cpu_tune_only_the_ways_that_run(dtype):
    """oneDNN has no float16 product on most CPUs: the tuner must leave it out, not crash the first answer."""
    model = tiny_model("llama").to(dtype)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), exact=False)  # exact mode (test_exact.py) tunes nothing
    plain = list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=10, plain=True)))[-1].tokens
    hybrid = list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=10, template="hybrid")))[-1].tokens
    plan = kernels.plan_of(model)
    assert set(plan.ms) == set(kernels.available_ways(dtype)) and STOCK in plan.ms
    assert plain and hybrid == plain


def test_a_way_that_fails_on_the_real_model_is_dropped_from_the_plan(monkeypatch):
    """The small agreement check passes, but the way raises on the model's own shapes: the tuning goes on without it."""
    way = WAYS_HERE[-1]
    real = kernels.PRODUCTS[way]

    def fails_from_four_rows(x, weight, bias, rows):
        if rows >= 4:
            raise RuntimeError("could not create a primitive descriptor")
        return real(x, weight, bias, rows)

    monkeypatch.setitem(kernels.PRODUCTS, way, fails_from_four_rows)
    model = tiny_model("llama")
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    out = list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=6, template="adaptive")))
    assert len(out[-1].tokens) == 6
    plan = kernels.plan_of(model)
    assert way not in plan.ms and way not in plan.ways.values() and STOCK in plan.ms


def test_a_later_process_takes_the_plan_this_machine_timed_for_the_same_shapes(monkeypatch, tmp_path):
    """Timing the products costs whole forwards (about 30 s for a 0.5B model on 2 cores): kept on disk per machine,
    torch threads and layer shapes, and timed again where the kept plan cannot be used or the file is damaged."""
    from tr_core import plan_cache

    path = tmp_path / "plans.json"
    monkeypatch.setenv("TR_PLAN_CACHE", str(path))
    monkeypatch.setattr(kernels, "STEADY_SPREAD", float("inf"))  # this busy machine's steadiness is tested below
    monkeypatch.setattr(tuning, "check_kept", lambda runner, context, plan: "")  # and the staleness check too
    calls = []
    real = tuning.tune
    monkeypatch.setattr(tuning, "tune", lambda runner, context, **kw: calls.append(1) or real(runner, context, repeats=1))
    first = tiny_model("llama")
    list(Engine(first, TinyTokenizer(TINY_VOCAB)).generate([3, 4, 5], DecodeConfig(max_new_tokens=6, plain=True)))
    assert calls == [1] and path.is_file() and kernels.plan_of(first).cached == ""
    assert kernels.plan_of(first).origin == f"timed now; kept in {path} for later runs"
    second = tiny_model("llama", seed=1)  # another model object of the same shapes: as a new process sees it
    engine = Engine(second, TinyTokenizer(TINY_VOCAB))
    assert list(engine.generate([3, 4, 5], DecodeConfig(max_new_tokens=6, plain=True)))[-1].tokens != [] and calls == [1]
    kept = kernels.plan_of(second)
    assert kept.ways == kernels.plan_of(first).ways and kept.ms == kernels.plan_of(first).ms
    assert f"kept in {path}" in kept.summary() and kernels.describe_plan(second)["cached"] == kept.cached
    assert kept.origin.startswith("loaded: timed on this machine")
    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)  # other threads: another key, timed again
    tuning.ensure_tuned(Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB)).runner, [3, 4])
    assert calls == [1, 1]
    monkeypatch.undo()
    monkeypatch.setenv("TR_PLAN_CACHE", str(path))
    path.write_text("{not json")  # a damaged file: timed again, and written afresh
    model = tiny_model("llama")
    assert plan_cache.load_plan(model) == (None, "")
    entry = plan_cache.plan_to_dict(kernels.LinearPlan({1: "no-such-way"}, 1, {"no-such-way": {1: 1.0}}))
    path.write_text(json.dumps({plan_cache.plan_key(model): entry}))
    assert plan_cache.load_plan(model)[1].endswith("names a way this torch build lacks")
    monkeypatch.setenv("TR_PLAN_CACHE", "")
    assert plan_cache.plan_cache_path() is None and plan_cache.load_plan(model) == (None, "")


def _kept_entry(model, path, **change):
    """Write a kept plan for `model` (every row the library's way, 1 ms a forward) with `change` to its entry."""
    from tr_core import plan_cache

    plan = kernels.LinearPlan({n: STOCK for n in (1, 8)}, 8, {STOCK: {1: 1.0, 8: 1.0}})
    entry = {**plan_cache.plan_to_dict(plan), **change}
    path.write_text(json.dumps({plan_cache.plan_key(model): entry}))


def test_a_kept_plan_that_no_longer_holds_is_noticed_and_timed_again(monkeypatch, tmp_path):
    """Stale entries: another machine or torch in the record, no record of steadiness (an older file), or forwards
    that now take far more or less time than the kept plan says."""
    from tr_core import plan_cache

    path = tmp_path / "plans.json"
    monkeypatch.setenv("TR_PLAN_CACHE", str(path))
    model = tiny_model("llama")
    _kept_entry(model, path, machine={**machine.timing_key(), "torch": "1.0"})
    assert plan_cache.load_plan(model)[1].startswith(f"the plan kept in {path} was timed on another machine")
    _kept_entry(model, path, spread=None)
    assert plan_cache.load_plan(model)[1] == f"the plan kept in {path} has no steady timings"
    _kept_entry(model, path)
    kept, why = plan_cache.load_plan(model)
    assert kept is not None and why == ""
    runner = Engine(model, TinyTokenizer(TINY_VOCAB)).runner
    slow = dataclasses.replace(kept, ms={STOCK: {1: 1e5, 8: 1e5}})  # 100 s a forward: nothing here is that slow
    assert "where the kept plan said 100000.0 ms" in tuning.check_kept(runner, [3, 4, 5], slow)
    monkeypatch.setattr(tuning, "tune", lambda runner, context, **kw: kernels.LinearPlan({1: STOCK}, 1, {STOCK: {1: 2.0}}))
    _kept_entry(model, path, ms={STOCK: {"1": 1e5, "8": 1e5}})  # kept as 100 s a forward: stale on any machine
    plan = tuning.ensure_tuned(runner, [3, 4, 5])
    assert plan.origin.startswith("timed now (the kept plan no longer held: a forward of 1 tokens took")


def test_an_unsteady_plan_is_retimed_then_not_kept_and_says_so(monkeypatch, tmp_path):
    path = tmp_path / "plans.json"
    monkeypatch.setenv("TR_PLAN_CACHE", str(path))
    monkeypatch.setattr(kernels, "STEADY_SPREAD", -1.0)  # every timing counts as unsteady
    rounds = []
    real = tuning._time_round
    monkeypatch.setattr(tuning, "_time_round", lambda *a, **kw: rounds.append(list(a[3])) or real(*a, **kw))
    model = tiny_model("llama")
    plan = tuning.ensure_tuned(Engine(model, TinyTokenizer(TINY_VOCAB)).runner, [3, 4, 5])
    assert len(rounds) == 3 + tuning.MAX_EXTRA_ROUNDS, "a warm-up, two rounds, then the bounded re-timing"
    assert not plan.steady and not path.exists()
    assert "not kept: its timings were too unsteady" in plan.origin and "timings unsteady" in plan.summary()
    assert kernels.timed_costs(model) == {}, "the cost probe must not take unsteady timings as fact"
    assert kernels.describe_plan(model)["steady"] is False


def test_products_are_admitted_by_their_agreement_with_the_one_row_product(monkeypatch):
    """A way that adds more rounding than the library's own n-row product already does is not timed at all."""
    model = tiny_model("llama")
    ways, agree, note = tuning.admitted_ways(model)
    assert ways[0] == STOCK and set(ways[1:]) == set(agree)
    for way in ways[1:]:
        assert agree[way]["way_rel"] <= tuning.ADMIT_FACTOR * max(agree[way]["library_rel"], 5e-7)
    real = kernels.PRODUCTS[TRANSPOSED]
    monkeypatch.setitem(kernels.PRODUCTS, TRANSPOSED, lambda x, w, b, rows: real(x, w, b, rows) * (1 + 1e-4))
    ways, agree, note = tuning.admitted_ways(model)
    assert TRANSPOSED not in ways and "transposed not tried" in note


def test_the_cli_says_what_this_run_did_with_the_matrix_products(monkeypatch, tmp_path, capsys):
    """Timed now and kept, then taken from the store: the message follows what happened, not what might."""
    from test_bench import _tiny_model_folder

    from tr_core.cli import main

    monkeypatch.setenv("TR_PLAN_CACHE", str(tmp_path / "plans.json"))
    monkeypatch.setattr(kernels, "STEADY_SPREAD", float("inf"))  # steadiness and staleness: tested above
    monkeypatch.setattr(tuning, "check_kept", lambda runner, context, plan: "")
    folder = _tiny_model_folder(tmp_path / "tiny")
    said = []
    for _ in range(2):
        assert main(["generate", "--prompt", "hi there", "--model", str(folder), "--device", "cpu",
                     "--max-new-tokens", "4", "--json", "--plain"]) == 0
        said.append([line for line in capsys.readouterr().err.splitlines() if line.startswith("matrix products:")])
    assert said[0] == [f"matrix products: timed now; kept in {tmp_path / 'plans.json'} for later runs"]
    assert len(said[1]) == 1 and said[1][0].startswith("matrix products: loaded: timed on this machine")
