"""The engine's seams and invariants: drafters, the sync packet, forward costs, logits processors, cache invariants."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import ARCHS, TINY_VOCAB, TinyTokenizer, tiny_model, tiny_model_of

from tr_core import DecodeConfig, Engine, SummaryEvent, build_tree, resolve_template
from tr_core.cost import COST_GRID, ForwardCost, StepClock, measure_forward_costs
from tr_core.drafters import PlainDrafter, StaticTreeDrafter
from tr_core.kv_cache import CacheInvariantError, TreeKVCache
from tr_core.packet import SyncPacket
from tr_core.runner import ModelRunner

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [[5, 9, 14, 22, 9, 14], [30, 31, 32, 33, 30, 31, 32, 40, 41], [7] * 5 + [8, 9, 10]]


def tokens_of(engine: Engine, prompt: list[int], **kw) -> list[int]:
    events = list(engine.generate(prompt, DecodeConfig(**kw)))
    assert isinstance(events[-1], SummaryEvent)
    return events[-1].tokens


def test_engine_picks_drafters_by_configuration_only():
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    assert isinstance(engine.drafter_for(DecodeConfig(plain=True)), PlainDrafter)
    static = engine.drafter_for(DecodeConfig(template="2.2.2"))
    assert isinstance(static, StaticTreeDrafter) and static.tree.size == 81 and static.max_depth == 6
    assert engine.drafter_for(DecodeConfig(template="adaptive")) is engine.adaptive
    assert engine.drafter_for(DecodeConfig(template="2.2.2")) is static  # built once


def test_a_prompt_is_one_sequence_of_ids_as_a_list_or_a_tokenizers_tensor():
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    as_list = tokens_of(engine, PROMPTS[0], max_new_tokens=6, plain=True)
    for tensor in (torch.tensor(PROMPTS[0]), torch.tensor([PROMPTS[0]])):  # [L] and [1, L] (return_tensors="pt")
        assert tokens_of(engine, tensor, max_new_tokens=6, plain=True) == as_list
    for bad, message in ((torch.tensor([PROMPTS[0], PROMPTS[0]]), r"shape \[L\] or \[1, L\]; got shape \[2, 6\]"),
                         ([[5, 9], [14]], "one sequence of integer token ids"), ([], "empty"),
                         ([5, TINY_VOCAB], "outside the vocabulary")):
        with pytest.raises(ValueError, match=message):
            engine.check_prompt(bad)


def test_sync_packet_round_trips_ints_and_floats_exactly():
    packet = SyncPacket().update({"ids": torch.tensor([0, 49151, 2**40]), "p": torch.tensor([0.123456789, 1e-7]),
                                  "flag": torch.tensor([True, False])})
    out = packet.sync()
    assert out["ids"] == [0, 49151, 2**40] and all(isinstance(x, int) for x in out["ids"])
    assert out["p"] == torch.tensor([0.123456789, 1e-7]).tolist()  # float32 values, unrounded
    assert out["flag"] == [1, 0]
    with pytest.raises(ValueError, match="already holds"):
        packet.add("ids", torch.tensor([1]))


def test_forward_cost_probe_learning_and_a_cheaper_larger_forward():
    runner = ModelRunner(tiny_model("llama"))
    times = measure_forward_costs(runner, list(range(2, 40)), [1, 4, 16], repeats=2, warmup=1)
    assert set(times) == {1, 4, 16} and all(len(v) == 2 and min(v) > 0 for v in times.values())
    cost = ForwardCost()
    cost.probe(runner, list(range(2, 40)), max_tokens=16)
    assert cost.measured and all(cost.ms[n] > 0 for n in COST_GRID)
    assert cost.ms[32] == pytest.approx(cost.ms[16] * 2)  # past the probed sizes: linear from the last one
    before = cost(4)
    cost.observe(4, before * 3)  # a slower forward pulls the estimate up, a tenth of the way
    assert cost(4) == pytest.approx(before * 1.2)
    # measured costs are kept as measured: where 4 tokens are cheaper than 3, the drafter may take 4
    from tr_core.adaptive import AdaptiveDrafter

    drafter = AdaptiveDrafter(torch.device("cpu"))
    drafter.cost.set_measured({1: [10.0], 2: [15.6], 3: [20.2], 4: [15.6], 6: [30.0], 8: [30.0]}, max_tokens=8)
    assert drafter.cost(3) > drafter.cost(4)
    assert drafter.choose_size([0.0, 0.55, 1.0, 1.4, 1.5], budget=4) == 3  # 3 drafts + root = a 4-token forward


def test_tested_candidates_count_the_whole_tree_not_only_the_draft():
    from tr_core.calibration import tested_candidates

    # root 0 -> 1 (-> 3), 2; drafted: root and node 1; node 1 accepted, then the bonus 77
    tokens, parents, depths, keys = [5, 10, 11, 12], [0, 0, 0, 1], [0, 1, 1, 2], [0, 4, 5, 6]
    keys_hits = tested_candidates(tokens, parents, depths, keys, kept=[0, 1], accepted=[0, 1], emitted=[10, 77])
    assert keys_hits == ([4, 5, 6], [True, False, False])  # 2 lost to 1 at depth 1; 3 (left out) is not 77
    keys_hits = tested_candidates(tokens, parents, depths, keys, kept=[0, 1], accepted=[0, 1], emitted=[10, 12])
    assert keys_hits == ([4, 5, 6], [True, False, True])  # greedy would have accepted the left-out 3
    keys_hits = tested_candidates(tokens, parents, depths, keys, kept=[0], accepted=[0], emitted=[11])
    assert keys_hits == ([4, 5], [False, True])  # a zero-draft step tests the first level; 3's parent was not run


def test_adaptive_zero_draft_steps_still_calibrate(monkeypatch):
    """With every step forced plain, verified-only learning would learn nothing; the whole tree teaches."""
    from tr_core.adaptive import AdaptiveDrafter

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    monkeypatch.setattr(AdaptiveDrafter, "choose_size", lambda self, expected, budget: 0)
    trials = engine.adaptive.trials.sum().item()
    tokens = tokens_of(engine, PROMPTS[1], template="adaptive", max_new_tokens=24)
    assert engine.adaptive.trials.sum().item() > trials + 24
    assert tokens == tokens_of(engine, PROMPTS[1], plain=True, max_new_tokens=24)


@pytest.mark.parametrize("template", ["adaptive", "hybrid"])
def test_cost_sized_answers_start_with_a_plain_step_then_draft(monkeypatch, template):
    """An answer's first step has no look-ahead curve to size a draft by: it verifies the root alone, whatever size
    the last answer ended with; the next steps are sized by their curves again."""
    from tr_core.adaptive import AdaptiveDrafter

    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    tokens_of(engine, PROMPTS[0], template=template, max_new_tokens=8)  # measures the cost, fills the matrix
    engine.matrix.filled[:] = True  # every row counts as written: the tree's size, not its rows, is under test
    monkeypatch.setattr(AdaptiveDrafter, "choose_size", lambda self, expected, budget: min(3, len(expected) - 1))
    engine.adaptive.next_size = engine.hybrid.next_size = 30  # what a previous answer might have left
    events = list(engine.generate(PROMPTS[1], DecodeConfig(template=template, max_new_tokens=8)))
    assert len(events[0].tokens) == 1
    assert len(events[1].tokens) == 4  # the second step drafts what its curve chose
    assert events[-1].tokens == tokens_of(engine, PROMPTS[1], plain=True, max_new_tokens=8)


def test_step_clock_names_every_phase_and_its_total():
    clock = StepClock(torch.device("cpu"))
    for phase in ("draft", "forward", "verify", "update", "sync", "commit", "learn"):
        clock.mark(phase)
    t = clock.timings()
    assert set(t) == {"draft", "forward", "verify", "update", "sync", "commit", "learn", "total"}
    assert t["total"] == pytest.approx(sum(v for k, v in t.items() if k != "total"))


def test_attention_kinds_that_cannot_take_a_tree_mask_are_refused():
    class Fake(torch.nn.Module):
        def __init__(self, **config):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.config = SimpleNamespace(**config)

        def forward(self, input_ids, past_key_values=None, **kw):
            raise AssertionError("never called")

    for attn in ("flash_attention_2", "flex_attention"):
        with pytest.raises(ValueError, match="cannot take a tree mask"):
            ModelRunner(Fake(_attn_implementation=attn))
    with pytest.raises(ValueError, match="chunked-attention"):
        ModelRunner(Fake(_attn_implementation="sdpa", layer_types=["chunked_attention", "full_attention"]))


# Real (tiny) models of families a tree cannot pass through exactly, and the words their refusal must say. Left to
# run, MPT gave other tokens than plain decoding, GPT-Neo too (past its local window), Bloom and the recurrent
# families failed deep inside the model ("too many values to unpack", "list index out of range").
REFUSED = [
    ("bloom", dict(n_layer=2, n_head=4), "ALiBi"),
    ("mpt", dict(d_model=64, n_layers=2, n_heads=4, max_seq_len=512), "ALiBi"),
    ("falcon", dict(alibi=True), "ALiBi"),
    ("gpt_neo", dict(num_layers=2, attention_types=[[["global", "local"], 1]], window_size=8), "local attention"),
    ("mamba", {}, "only full and sliding attention"),
    ("qwen3_next", dict(head_dim=16), "only full and sliding attention"),
    ("lfm2", dict(layer_types=["conv", "full_attention"]), "only full and sliding attention"),
    ("llama4_text", dict(head_dim=16), "chunked-attention"),
]


@pytest.mark.parametrize("arch,extra,words", REFUSED, ids=[r[0] for r in REFUSED])
def test_families_a_tree_cannot_pass_through_are_refused_with_the_reason(arch, extra, words):
    model = tiny_model_of(arch, **extra)
    with pytest.raises(ValueError, match=words):
        Engine(model, TinyTokenizer(TINY_VOCAB))


def test_loading_a_model_a_tree_cannot_pass_through_says_why(embedded, tmp_path):
    from tr_core.models import ModelLoadError, load_model

    tiny_model_of("mpt", d_model=64, n_layers=2, n_heads=4, max_seq_len=512).save_pretrained(tmp_path)
    embedded[1].save_pretrained(tmp_path)  # any tokenizer: the model is refused after loading
    with pytest.raises(ModelLoadError, match="cannot be used for Token Recycling: mpt uses ALiBi"):
        load_model(str(tmp_path), device="cpu")
    # the same folder with a family that can take a tree loads
    tiny_model_of("falcon").save_pretrained(tmp_path)
    model, _ = load_model(str(tmp_path), device="cpu")
    assert model.config.model_type == "falcon"


def test_grouped_key_value_heads_are_shared_on_a_cpu_unless_the_user_says_otherwise(monkeypatch):
    from tr_core.runner import GQA_SWITCH, share_kv_heads

    grouped, plain = SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), SimpleNamespace(num_attention_heads=4)
    monkeypatch.delenv(GQA_SWITCH, raising=False)
    assert not share_kv_heads(plain, torch.device("cpu")) and GQA_SWITCH not in os.environ
    assert not share_kv_heads(grouped, torch.device("meta")) and GQA_SWITCH not in os.environ  # not a CPU
    assert share_kv_heads(grouped, torch.device("cpu")) and os.environ[GQA_SWITCH] == "1"
    monkeypatch.setenv(GQA_SWITCH, "0")  # the user's choice stands
    assert not share_kv_heads(grouped, torch.device("cpu")) and os.environ[GQA_SWITCH] == "0"


def test_a_tree_forward_gives_bitwise_the_same_logits_with_shared_key_value_heads(monkeypatch):
    from tr_core.runner import GQA_SWITCH

    runner = ModelRunner(tiny_model("llama"))  # 4 query heads share 2 key/value heads
    cache = TreeKVCache()
    runner.prefill(list(range(2, 60)), cache)
    tree = build_tree(*resolve_template("2.2.2", 8))
    tokens = torch.randint(2, TINY_VOCAB, (1, tree.size))
    out = {}
    for switch in ("0", "1"):
        monkeypatch.setenv(GQA_SWITCH, switch)
        with torch.no_grad():
            out[switch] = runner.forward(tokens, (58 + tree.depths)[None], runner.mask(tree.tree_mask, tree.depths, 58),
                                         cache)
        cache.truncate(58)
    assert torch.equal(out["0"], out["1"])


def test_duplicate_siblings_from_half_filled_rows_stay_lossless():
    engine = Engine(tiny_model("qwen2"), TinyTokenizer(TINY_VOCAB))
    for prompt in PROMPTS:
        plain = tokens_of(engine, prompt, max_new_tokens=40, plain=True)
        engine.matrix.reset()
        engine.matrix.table[:, : engine.matrix.k // 2] = 3  # the first half of every row: one repeated token
        engine.matrix.filled[:] = True
        events = list(engine.generate(prompt, DecodeConfig(max_new_tokens=40, template="2.2.2")))
        first = events[0]
        siblings = [first.tokens[i] for i in range(1, len(first.tokens)) if first.parents[i] == 0]
        assert len(siblings) > len(set(siblings))  # the root's children repeat a token
        assert events[-1].tokens == plain


def test_closing_a_generation_early_leaves_the_engine_usable():
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    prompt = PROMPTS[1]
    reference = tokens_of(engine, prompt, max_new_tokens=40, plain=True)
    for template in ("2.2.2", "adaptive"):
        gen = engine.generate(prompt, DecodeConfig(max_new_tokens=40, template=template))
        next(gen), next(gen)
        gen.close()  # the consumer stops iterating
        assert tokens_of(engine, prompt, max_new_tokens=40, template=template) == reference


@pytest.mark.parametrize("arch", ARCHS)
def test_repetition_penalty_greedy_equals_plain_and_transformers(arch):
    model = tiny_model(arch)
    engine = Engine(model, TinyTokenizer(TINY_VOCAB))
    differs = False
    for prompt in PROMPTS:
        plain = tokens_of(engine, prompt, max_new_tokens=40, plain=True, repetition_penalty=1.3)
        hf = model.generate(torch.tensor([prompt]), max_new_tokens=40, do_sample=False, repetition_penalty=1.3,
                            eos_token_id=1, pad_token_id=0)[0, len(prompt):].tolist()
        assert plain == hf[: len(plain)] and len(plain) == len(hf)
        for template in ("2.2.2", "adaptive-fixed"):
            assert tokens_of(engine, prompt, max_new_tokens=40, template=template, repetition_penalty=1.3) == plain
        differs |= plain != tokens_of(engine, prompt, max_new_tokens=40, plain=True)
    assert differs  # the penalty really changed some answer


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_repetition_penalty_with_seeded_sampling_equals_plain(arch):
    engine = Engine(tiny_model(arch), TinyTokenizer(TINY_VOCAB))
    for seed, prompt in enumerate(PROMPTS):
        kw = dict(max_new_tokens=30, temperature=0.8, top_k=40, top_p=0.95, seed=seed, repetition_penalty=1.2)
        plain = tokens_of(engine, prompt, plain=True, **kw)
        for template in ("2.2.2", "adaptive"):
            assert tokens_of(engine, prompt, template=template, **kw) == plain


def test_repetition_penalty_on_the_embedded_model(embedded):
    model, tokenizer = embedded
    engine = Engine(model, tokenizer)
    ids = engine.encode_chat([{"role": "user", "content": "List the days of the week, then list them again."}])
    plain = tokens_of(engine, ids, max_new_tokens=40, plain=True, repetition_penalty=1.3)
    hf = model.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, repetition_penalty=1.3,
                        eos_token_id=engine.stop_token_ids, pad_token_id=engine.stop_token_ids[0])
    assert plain == hf[0, len(ids):].tolist()[: len(plain)]
    assert tokens_of(engine, ids, max_new_tokens=40, template="2.2.2", repetition_penalty=1.3) == plain
    sampled = dict(max_new_tokens=24, temperature=0.7, seed=3, repetition_penalty=1.3)
    assert tokens_of(engine, ids, template="adaptive", **sampled) == tokens_of(engine, ids, plain=True, **sampled)


def test_prompt_seeding_with_a_static_template_is_lossless_and_seeds_rows():
    engine = Engine(tiny_model("mistral"), TinyTokenizer(TINY_VOCAB))
    prompt = [30, 31, 32, 33, 34, 30, 31, 32]  # the root (32) follows itself earlier: 32 -> 33
    plain = tokens_of(engine, prompt, max_new_tokens=30, plain=True)
    engine.matrix.reset()
    events = list(engine.generate(prompt, DecodeConfig(max_new_tokens=30, template="small-16", prompt_seeding=True)))
    assert events[-1].tokens == plain
    first = events[0]
    assert first.tokens[1] == 33 and first.ranks[1] == 0  # the seeded successor is the root's first candidate
    engine.matrix.reset()
    list(engine.generate(prompt, DecodeConfig(max_new_tokens=1, template="small-16")))  # off by default for static
    assert not bool(engine.matrix.filled[prompt[0]])


def test_cache_invariant_is_an_error_even_under_python_O():
    cache = TreeKVCache()
    cache.update(torch.zeros(1, 1, 4, 2), torch.zeros(1, 1, 4, 2), 0)
    with pytest.raises(CacheInvariantError, match="holds 4 entries but 5"):
        cache.require_length(5)
    code = ("import torch; from tr_core.kv_cache import TreeKVCache, CacheInvariantError\n"
            "c = TreeKVCache(); c.update(torch.zeros(1,1,4,2), torch.zeros(1,1,4,2), 0)\n"
            "try:\n    c.require_length(3)\nexcept CacheInvariantError:\n    print('raised')\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "raised", out.stderr


def test_snapshot_and_restore_return_to_the_same_learned_state():
    """What answers teach the engine (matrix, calibration, trust, costs, context index, clock) is restored by
    `restore`, and the snapshot stays usable: the same answer decoded again drafts the same trees. (`hybrid-fixed`:
    a cost-sized tree's sizes also follow the step times measured during the answer, which differ run to run.)"""
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    cfg = DecodeConfig(max_new_tokens=24, template="hybrid-fixed")
    list(engine.generate(PROMPTS[0], cfg))
    snap = engine.snapshot()
    table, rates, clock = engine.matrix.table.clone(), engine.hybrid.rate.clone(), engine.clock.tick
    matrix = engine.matrix
    first = list(engine.generate(PROMPTS[1], cfg))
    assert engine.clock.tick > clock and not torch.equal(engine.hybrid.rate, rates)
    for _ in range(2):  # twice from the same snapshot
        engine.restore(snap)
        assert engine.matrix is matrix and torch.equal(engine.matrix.table, table)  # copied in place
        assert torch.equal(engine.hybrid.rate, rates) and engine.clock.tick == clock
        again = list(engine.generate(PROMPTS[1], cfg))
        assert again[-1].tokens == first[-1].tokens
        assert [e.tokens for e in again[:-1]] == [e.tokens for e in first[:-1]]  # every step's tree


def test_a_fork_is_an_independent_twin_that_decodes_as_the_engine_did_from_the_same_start():
    """`fork`: the same model, its own matrix, clock and drafters; what either learns leaves the other as it was."""
    engine = Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB))
    cfg = DecodeConfig(max_new_tokens=24, template="hybrid-fixed")
    list(engine.generate(PROMPTS[0], cfg))
    twin = engine.fork()
    assert twin.model is engine.model and twin.matrix is not engine.matrix and twin.clock == engine.clock
    assert twin.clock is not engine.clock and twin.hybrid is not engine.hybrid
    assert twin.hybrid.trust is not engine.hybrid.trust and twin.hybrid.index is not engine.hybrid.index
    table, clock = engine.matrix.table.clone(), engine.clock.tick
    first = list(twin.generate(PROMPTS[1], cfg))
    assert torch.equal(engine.matrix.table, table) and engine.clock.tick == clock  # the twin taught only itself
    again = list(engine.generate(PROMPTS[1], cfg))
    assert [e.tokens for e in again[:-1]] == [e.tokens for e in first[:-1]]  # the same trees from the same start


def test_state_dict_round_trips_and_start_session_and_forget_to_a_snapshot():
    """`state_dict` / `load_state_dict` carry the matrix, clock, calibration, trust (and costs when asked) as CPU
    data; `start_session` returns to the priors keeping the forward cost; `forget(to=...)` empties all but the
    snapshot's matrix; `on_model` shares everything it learned."""
    engine, other = (Engine(tiny_model("llama"), TinyTokenizer(TINY_VOCAB)) for _ in range(2))
    list(engine.generate(PROMPTS[0], DecodeConfig(max_new_tokens=16, template="adaptive")))
    state = engine.state_dict()
    assert all(t.device.type == "cpu" for t in state["matrix"].values())
    other.load_state_dict(state, costs=True)
    assert other.clock == engine.clock and torch.equal(other.matrix.table, engine.matrix.table)
    assert torch.equal(other.adaptive.hits, engine.adaptive.hits) and other.adaptive.cost.measured
    snap = engine.snapshot()
    engine.start_session()
    assert engine.matrix.rows_filled == 0 and engine.clock.tick == 0 and engine.adaptive.cost.measured
    assert torch.equal(engine.adaptive.hits, type(engine.adaptive)(engine.device).hits)
    engine.forget(to=snap)
    assert torch.equal(engine.matrix.table, snap["matrix"].table) and engine.clock.tick == 0
    parked = engine.on_model(None)
    assert parked.model is None and engine.model is not None and parked.matrix is engine.matrix
    list(parked.on_model(engine.model).generate(PROMPTS[1], DecodeConfig(max_new_tokens=4)))
    assert engine.clock.tick > 0  # the parked engine's clock is the engine's own


def test_a_causal_model_whose_config_says_not_a_decoder_loads_and_a_bidirectional_one_is_refused(embedded, tmp_path):
    """GPT-NeoX (Pythia) configs carry is_decoder=False; the check looks at what the model does, not at the flag."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tr_core.models import ModelLoadError, load_model

    neox = tiny_model_of("gpt_neox")
    assert neox.config.is_decoder is False
    neox.save_pretrained(tmp_path / "neox")
    embedded[1].save_pretrained(tmp_path / "neox")
    model, _ = load_model(str(tmp_path / "neox"), device="cpu")
    assert model.config.model_type == "gpt_neox"
    torch.manual_seed(0)
    bert = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "bert", vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, is_decoder=False))
    bert.save_pretrained(tmp_path / "bert")
    embedded[1].save_pretrained(tmp_path / "bert")
    with pytest.raises(ModelLoadError, match="not a decoder-only causal LM"):
        load_model(str(tmp_path / "bert"), device="cpu")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_causality_check_holds_in_16_bit(dtype):
    """Half-precision rounding must neither make a causal model look bidirectional nor hide a bidirectional one."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from tr_core.models import is_causal

    assert is_causal(tiny_model_of("gpt_neox").to(dtype))
    torch.manual_seed(0)
    bert = AutoModelForCausalLM.from_config(AutoConfig.for_model(
        "bert", vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, is_decoder=False)).to(dtype)
    assert not is_causal(bert)


def test_a_model_folder_with_its_own_python_is_refused_without_asking_or_running_it(embedded, tmp_path, monkeypatch):
    """transformers would stop to ask on the console whether to run a repository's code (a server would hang, a
    script would wait); the loader refuses at once and never runs it."""
    import builtins
    import json

    from tr_core.models import ModelLoadError, load_model

    asked = []
    monkeypatch.setattr(builtins, "input", lambda *a: asked.append(a) or "n")
    marker = tmp_path / "ran"
    (tmp_path / "modeling_custom.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    (tmp_path / "configuration_custom.py").write_text(f"open({str(marker)!r}, 'w').write('x')\n")
    embedded[1].save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "custom_tr_test", "architectures": ["CustomModel"],
        "auto_map": {"AutoConfig": "configuration_custom.CustomConfig",
                     "AutoModelForCausalLM": "modeling_custom.CustomModel"}}))
    with pytest.raises(ModelLoadError, match="custom code|trust_remote_code"):
        load_model(str(tmp_path), device="cpu")
    assert asked == [] and not marker.exists()


def test_a_mistyped_relative_path_is_named_at_once_and_hub_ids_pass(tmp_path, monkeypatch):
    from tr_core.models import ModelLoadError, resolve_source

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    for typo in ("models/smol", "a/b/c", "models\\smol"):
        with pytest.raises(ModelLoadError, match="no such folder"):
            resolve_source(typo)
    assert resolve_source("HuggingFaceTB/SmolLM2-135M-Instruct") == ("HuggingFaceTB/SmolLM2-135M-Instruct", {})
    assert resolve_source("gpt2") == ("gpt2", {})


def test_a_model_with_a_short_position_table_is_tuned_probed_and_decoded_exactly():
    """The start-up timings (kernel tuning: up to 64 tokens; the cost probe: up to 81) must fit a short context
    rather than index past the position table."""
    from tr_core.kernels import plan_of

    model = tiny_model_of("gpt2", max_position_embeddings=48)  # a learned position table of 48 entries
    engine = Engine(model, TinyTokenizer(TINY_VOCAB), tune_kernels=True)
    prompt = list(range(2, 14))
    cfg = DecodeConfig(max_new_tokens=24, template="hybrid")
    plain = list(engine.generate(prompt, cfg.with_(plain=True)))[-1]
    assert list(engine.generate(prompt, cfg))[-1].tokens == plain.tokens and len(plain.tokens) > 10
    assert plan_of(model) is not None and 12 <= plan_of(model).limit < 48


def _forwards(engine: Engine, prompt: list[int], **kw) -> tuple[list[int], list[int], list]:
    """An answer's tokens, the token count of every model forward it ran, and its step events."""
    sizes: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda module, args, kwargs: sizes.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    try:
        events = list(engine.generate(prompt, DecodeConfig(**kw)))
    finally:
        hook.remove()
    return events[-1].tokens, sizes, events[:-1]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_prompts_forward_verifies_a_first_step_that_drafts_nothing(arch):
    """Plain decoding and the cost-sized trees (whose first step drafts nothing) run one forward of the whole prompt
    and no separate one for its last token: n plain tokens take n forwards, as transformers' `generate`. A tree that
    drafts on its first step still prefills all but the last token and forwards the tree. The tokens are those of a
    separate first forward, and the first step's cost is not taken as a one-token forward's."""
    model = tiny_model(arch)
    on, off = Engine(model, TinyTokenizer(TINY_VOCAB)), Engine(model, TinyTokenizer(TINY_VOCAB))
    off.first_step_from_prompt = False
    prompt = PROMPTS[1]
    for engine in (on, off):  # one-off work first: kernel tuning and the cost probe run forwards of their own
        for template in ("adaptive", "hybrid"):
            list(engine.generate(PROMPTS[0], DecodeConfig(max_new_tokens=2, template=template)))
    tokens, sizes, steps = _forwards(on, prompt, max_new_tokens=8, plain=True, stop_token_ids=())
    assert sizes == [len(prompt)] + [1] * 7 and len(steps) == 8 and steps[0].timings["forward"] < 1.0
    old_tokens, old_sizes, _ = _forwards(off, prompt, max_new_tokens=8, plain=True, stop_token_ids=())
    assert old_sizes == [len(prompt) - 1] + [1] * 8 and old_tokens == tokens
    for template in ("adaptive", "hybrid"):
        got, sizes, steps = _forwards(on, prompt, max_new_tokens=8, template=template, stop_token_ids=())
        assert got == tokens and sizes[0] == len(prompt) and len(sizes) == len(steps)
        assert len(steps[0].tokens) == 1
    got, sizes, steps = _forwards(on, prompt, max_new_tokens=8, template="2.2.2", stop_token_ids=())
    assert got == tokens and sizes[:2] == [len(prompt) - 1, len(steps[0].tokens)] and len(steps[0].tokens) > 1
    assert len(sizes) == len(steps) + 1
    drafter = on.adaptive
    seen = dict(drafter.cost.seen)
    list(on.generate(prompt, DecodeConfig(max_new_tokens=1, template="adaptive")))  # one step: the prompt's
    assert drafter.cost.seen == seen  # nothing learned about a one-token forward's cost from it
