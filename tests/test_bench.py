"""Tests of the benchmark: question files, method parsing, per-task aggregation, reports, the JSON contract
on a tiny random model, and the forward-cost profiler."""
from __future__ import annotations

import argparse
import hashlib
import json
import re
from pathlib import Path

import pytest

from tr_core.bench import answers, bench, profile, results, tables
from tr_core.bench.questions import (
    MULTI_TURN,
    group_by,
    QuestionFileError,
    load_questions,
    select_questions,
    task_of,
)
from tr_core.cli import bench as bench_command
from tr_core.cli import profile as profile_command

DATA = Path(__file__).resolve().parents[1] / "bench" / "data"  # the development question sets, in the repository
DEV_FILES = ["harder.jsonl", "mbpp_dev.jsonl", "spec_bench_dev.jsonl"]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tr_core")
    sub = p.add_subparsers(dest="command", required=True)
    bench_command.register(sub)
    profile_command.register(sub)
    return p


def _write(tmp_path: Path, name: str, lines: list[str]) -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


GOOD = [
    '{"question_id": 1, "category": "writing", "turns": ["Write a haiku.", "Now another."]}',
    "",
    '{"question_id": 2, "category": "translation", "turns": ["Translate: hallo"]}',
    '{"question_id": 3, "category": "code", "turns": ["def f():"]}',
]


# ----------------------------------------------------------------------------- question files


def test_good_file_parses_with_lines_and_tasks(tmp_path):
    qs = load_questions(_write(tmp_path, "q.jsonl", GOOD))
    assert [q.question_id for q in qs] == [1, 2, 3]
    assert [q.line for q in qs] == [1, 3, 4]  # the blank line is skipped but counted
    assert qs[0].turns == ("Write a haiku.", "Now another.")
    assert [q.task for q in qs] == [MULTI_TURN, "translation", "code"]
    assert qs[1].key == "q/2"


def test_a_byte_order_mark_and_raw_unicode_line_separators_inside_strings_are_read(tmp_path):
    """Files saved by Windows editors start with a BOM; JSON strings may hold U+2028, U+2029 and U+0085 raw (only
    "\\n" ends a JSON line)."""
    path = tmp_path / "q.jsonl"
    path.write_text('\ufeff{"question_id": 1, "category": "qa", "turns": ["one\u2028two\u0085three\u2029four"]}\r\n'
                    '{"question_id": 2, "category": "qa", "turns": ["ok"]}\n', encoding="utf-8")
    qs = load_questions(path)
    assert [q.question_id for q in qs] == [1, 2] and [q.line for q in qs] == [1, 2]
    assert qs[0].turns == ("one\u2028two\u0085three\u2029four",)


def test_two_questions_of_the_same_name_are_both_located(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one = _write(tmp_path / "a", "q.jsonl", GOOD)
    two = _write(tmp_path / "b", "q.jsonl", GOOD)
    with pytest.raises(bench.BenchInputError, match=rf"both named 'q/1' \({one}:1 and {two}:1\)"):
        bench.load_all_questions([str(one), str(two)], None, None)
    mixed = _write(tmp_path, "m.jsonl", ['{"question_id": 1, "category": "qa", "turns": ["a"]}',
                                         '{"question_id": "1", "category": "qa", "turns": ["b"]}'])
    with pytest.raises(bench.BenchInputError, match=rf"{mixed}:1 and {mixed}:2\).*number and text"):
        bench.load_all_questions([str(mixed)], None, None)


def test_missing_file_names_the_file(tmp_path):
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(QuestionFileError, match=r"nope\.jsonl: no such file"):
        load_questions(missing)


@pytest.mark.parametrize(
    "bad, message",
    [
        ('{"question_id": 9, "category": "qa", "turns": ["a"]', "not valid JSON"),
        ('{"question_id": 9, "category": "qa"}', "missing 'turns'"),
        ('{"question_id": 9, "turns": ["a"]}', "missing 'category'"),
        ('{"question_id": 9, "category": "qa", "turns": []}', "'turns' must be a non-empty list"),
        ('{"question_id": 9, "category": "qa", "turns": ["ok", 3]}', r"'turns'\[1\]"),
        ('[1, 2]', "expected a JSON object"),
        ('{"question_id": 1, "category": "qa", "turns": ["dup"]}', "duplicate question_id 1"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path, bad, message):
    path = _write(tmp_path, "bad.jsonl", [GOOD[0], bad])
    with pytest.raises(QuestionFileError, match=message) as info:
        load_questions(path)
    assert str(info.value).startswith(f"{path}:2: ")
    assert info.value.line == 2


def test_empty_file_is_an_error(tmp_path):
    with pytest.raises(QuestionFileError, match="no questions"):
        load_questions(_write(tmp_path, "empty.jsonl", ["", "  "]))


def test_task_mapping():
    for cat in ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"):
        assert task_of(cat) == MULTI_TURN
    for cat in ("translation", "summarization", "qa", "math_reasoning", "rag", "code"):
        assert task_of(cat) == cat
    assert task_of("Translation ") == "translation" and task_of("Writing") == MULTI_TURN


def test_select_per_task_is_round_robin_and_deterministic(tmp_path):
    lines = [json.dumps({"question_id": i, "category": c, "turns": ["x"]})
             for i, c in enumerate(["qa", "qa", "qa", "writing", "stem", "rag"])]
    qs = load_questions(_write(tmp_path, "q.jsonl", lines))
    picked = select_questions(qs, per_task=2)
    # task order: multi-turn first, then qa, then rag; two each where available
    assert [q.question_id for q in picked] == [3, 0, 5, 4, 1]
    lines = [json.dumps({"question_id": i, "category": c, "turns": ["x"]})
             for i, c in enumerate(["writing", "writing", "writing", "roleplay", "roleplay", "math"])]
    mt = load_questions(_write(tmp_path, "mt.jsonl", lines))
    # within a task: round-robin over its categories, in file order
    assert [q.question_id for q in select_questions(mt, per_task=4)] == [0, 3, 5, 1]
    assert [q.question_id for q in select_questions(qs, per_task=2, limit=3)] == [3, 0, 5]
    assert select_questions(qs, per_task=2) == picked


def test_development_files_are_the_ones_their_readme_describes():
    # no skip when a file is missing: a clone without them must fail here, not quietly run fewer tests
    rows = re.findall(r"^\| (\w+\.jsonl) \| (\d+) \| ([0-9a-f]{64}) \|$", (DATA / "README.md").read_text(), re.M)
    assert sorted(name for name, _, _ in rows) == sorted(p.name for p in DATA.glob("*.jsonl")) == DEV_FILES
    for name, lines, digest in rows:
        data = (DATA / name).read_bytes()
        assert (data.count(b"\n"), hashlib.sha256(data).hexdigest()) == (int(lines), digest), name


def test_development_files_parse_and_cover_all_tasks():
    spec, mbpp = load_questions(DATA / "spec_bench_dev.jsonl"), load_questions(DATA / "mbpp_dev.jsonl")
    assert (len(spec), len(mbpp)) == (240, 205)
    assert all(q.question_id % 2 == 0 for q in spec + mbpp)  # the odd ids are held out (bench/data/README.md)
    picked = select_questions(spec + mbpp, per_task=4)
    assert len(picked) == 28
    assert {q.task for q in picked} == {MULTI_TURN, "translation", "summarization", "qa", "math_reasoning", "rag", "code"}


def test_the_harder_questions_are_the_third_and_fourth_of_each_task_unchanged():
    dev = {}
    for name in ("spec_bench_dev.jsonl", "mbpp_dev.jsonl"):
        lines = [line for line in (DATA / name).read_text(encoding="utf-8").splitlines() if line.strip()]
        for task, group in group_by(zip(load_questions(DATA / name), lines), lambda pair: pair[0].task).items():
            dev[task] = [line for _, line in group]
    harder = (DATA / "harder.jsonl").read_text(encoding="utf-8").splitlines()
    assert harder == [line for task in dev for line in dev[task][2:4]]


# ----------------------------------------------------------------------------- methods and input validation


def test_method_names_single_and_several_templates():
    specs = bench.parse_methods("recycling,hf,pld", "2.2.2")
    assert [s.name for s in specs] == ["vanilla", "recycling", "hf", "pld"]  # vanilla added, first
    assert specs[1].template == "2.2.2"
    specs = bench.parse_methods("hf,vanilla,recycling", "2.2.2,adaptive")
    assert [s.name for s in specs] == ["vanilla", "hf", "recycling[2.2.2]", "recycling[adaptive]"]
    assert [s.template for s in specs if s.kind == "recycling"] == ["2.2.2", "adaptive"]
    specs = bench.parse_methods("vanilla,recycling[chain-4]", "2.2.2")
    assert specs[1] == bench.MethodSpec("recycling[chain-4]", "recycling", "chain-4")


@pytest.mark.parametrize(
    "methods, template, message",
    [
        ("vanilla,medusa", "2.2.2", "unknown method 'medusa'"),
        ("vanilla,recycling", "2.9.9", "unknown template '2.9.9'"),
        ("recycling[nope]", "2.2.2", "unknown template 'nope'"),
        ("hf,hf", "2.2.2", "listed twice: hf"),
        (" , ", "2.2.2", "at least one method"),
    ],
)
def test_bad_methods_and_templates(methods, template, message):
    with pytest.raises(bench.BenchInputError, match=message):
        bench.parse_methods(methods, template)


def test_bad_input_exits_before_loading_a_model(tmp_path, capsys, monkeypatch):
    import tr_core.models

    def boom(*a, **k):  # any model load here is a failure of the validation order
        raise AssertionError("model loaded before input validation")

    monkeypatch.setattr(tr_core.models, "load_model", boom)
    bad = _write(tmp_path, "bad.jsonl", [GOOD[0], '{"question_id": 5, "category": "qa"}'])
    args = _parser().parse_args(["bench", "--questions", str(bad)])
    assert args.func(args) == 2
    assert f"{bad}:2: missing 'turns'" in capsys.readouterr().err
    good = _write(tmp_path, "good.jsonl", GOOD)
    for extra, message in [(["--methods", "vanilla,foo"], "unknown method 'foo'"),
                           (["--template", "zzz"], "unknown template 'zzz'"),
                           (["--max-new-tokens", "0"], "--max-new-tokens"),
                           (["--repeats", "0"], "--repeats must be >= 1"),
                           (["--json", str(tmp_path / "no" / "x.json")], "does not exist"),
                           (["--concurrency", "0"], "--concurrency must be >= 1"),
                           (["--concurrency", "4", "--fresh-sessions"], "leave out --fresh-matrix"),
                           (["--template", "2.2.2", "--topk-candidates", "4"], "--template 2.2.2 drafts candidates up to rank 7, so it needs "
                                                        "--topk-candidates >= 8, got 4")]:
        args = _parser().parse_args(["bench", "--questions", str(good), *extra])
        assert args.func(args) == 2
        assert message in capsys.readouterr().err


def test_without_template_the_bench_runs_the_tree_the_app_uses_on_the_device(tmp_path):
    good = _write(tmp_path, "good.jsonl", GOOD)
    args = _parser().parse_args(["bench", "--questions", str(good), "--device", "cpu"])
    _, specs = bench_command.validate_args(args)
    assert [s.template for s in specs if s.kind == "recycling"] == ["hybrid"] and args.template == "hybrid"
    args = _parser().parse_args(["bench", "--questions", str(good), "--device", "cuda"])
    assert [s.template for s in bench_command.validate_args(args)[1] if s.kind == "recycling"] == ["2.2.2"]


def test_cut_at_stop():
    assert answers.cut_at_stop([5, 6, 2, 7], {2}, 10) == ([5, 6, 2], [5, 6])
    assert answers.cut_at_stop([5, 6, 7, 8], {2}, 3) == ([5, 6, 7], [5, 6, 7])
    assert answers.cut_at_stop([2], {2, 3}, 3) == ([2], [])


# ----------------------------------------------------------------------------- aggregation


def _rec(method, q, task, turn, tokens, seconds, steps, answer, accepted=(), nodes=0):
    return bench.TurnRecord(method=method, question=q, category=task, task=task, turn=turn, prompt_tokens=10,
                            tokens=tokens, seconds=seconds, steps=steps, answer_ids=list(answer),
                            accepted_lengths=list(accepted), tree_nodes=nodes)


def _records():
    return [
        _rec("vanilla", "a/1", "qa", 0, 10, 2.0, 10, [1, 2, 3]),
        _rec("vanilla", "a/2", "rag", 0, 20, 4.0, 20, [4, 5]),
        _rec("vanilla", "a/2", "rag", 1, 6, 1.0, 6, [6]),
        _rec("recycling", "a/1", "qa", 0, 10, 1.0, 4, [1, 2, 3], accepted=[3, 3, 3, 1], nodes=4 * 81),
        _rec("recycling", "a/2", "rag", 0, 20, 1.0, 5, [4, 5], accepted=[4] * 5, nodes=5 * 81),
        _rec("recycling", "a/2", "rag", 1, 6, 1.0, 3, [6, 9], accepted=[2, 2, 2], nodes=3 * 81),
        _rec("hf", "a/1", "qa", 0, 10, 2.5, None, [1, 2, 3]),
        _rec("hf", "a/2", "rag", 0, 20, 5.0, None, [4, 5]),
        _rec("hf", "a/2", "rag", 1, 6, 1.5, None, [6]),
    ]


def test_aggregate_totals_speedup_identical():
    agg = results.aggregate(_records(), ["vanilla", "recycling", "hf"])
    v, r, h = agg["vanilla"], agg["recycling"], agg["hf"]
    assert v["speedup"] == pytest.approx(1.0) and v["mean_accepted"] == pytest.approx(1.0)
    assert (v["identical"], v["compared"]) == (3, 3)
    assert r["tokens"] == 36 and r["steps"] == 12
    assert r["mean_accepted"] == pytest.approx(36 / 12)
    assert r["speedup"] == pytest.approx(7.0 / 3.0)
    assert r["tokens_per_s"] == pytest.approx(36 / 3.0)
    assert (r["identical"], r["compared"]) == (2, 3)  # the second turn of a/2 differs
    assert r["mean_tree_nodes"] == pytest.approx(81)
    assert r["accepted_histogram"] == {"1": 1, "2": 3, "3": 3, "4": 5}
    assert h["mean_accepted"] is None and h["steps"] is None  # unknown forwards -> n/a, not 0
    assert h["speedup"] == pytest.approx(7.0 / 9.0)


def test_aggregate_per_task():
    agg = results.aggregate(_records(), ["vanilla", "recycling"])
    per = agg["recycling"]["per_category"]
    assert list(per) == ["qa", "rag"]  # Spec-Bench task order
    assert per["qa"]["speedup"] == pytest.approx(2.0)
    assert per["qa"]["mean_accepted"] == pytest.approx(10 / 4)
    assert per["rag"]["speedup"] == pytest.approx(5.0 / 2.0)
    assert per["rag"]["mean_accepted"] == pytest.approx(26 / 8)
    assert per["rag"]["tokens_per_s"] == pytest.approx(13.0)
    assert (per["rag"]["identical"], per["rag"]["compared"]) == (1, 2)
    assert per["qa"]["plausible"] is True and per["rag"]["plausible"] is True  # 2.0x <= 2.5, 2.5x <= 3.25


def test_implausible_speedups_are_flagged_noisy_in_the_tables():
    agg = results.aggregate(_records(), ["vanilla", "recycling", "hf"])
    agg["recycling"]["per_category"]["qa"].update(speedup=2.9, plausible=results._plausible(2.9, 2.5))
    assert agg["recycling"]["per_category"]["qa"]["plausible"] is False  # 2.9 > 1.1 x 2.5
    assert agg["hf"]["plausible"] is None  # no step count: cannot be checked
    text = tables.format_tables({"methods": agg})
    assert "2.90x ⚠ noisy" in text and "load changed" in text
    agg["recycling"]["per_category"]["qa"].update(speedup=2.0, plausible=True)
    assert "noisy" not in tables.format_tables({"methods": agg})


def test_tables_of_one_run(tmp_path):
    specs = bench.parse_methods("recycling,hf", "2.2.2")
    qs = load_questions(_write(tmp_path, "a.jsonl", [
        '{"question_id": 1, "category": "qa", "turns": ["x"]}',
        '{"question_id": 2, "category": "rag", "turns": ["x", "y"]}']))
    meta = {"model": "m", "device": "cpu", "machine": "test", "dtype": "float32", "torch": "t", "transformers": "t",
            "date": "d", "max_new_tokens": 8, "temperature": 0.0, "template": "2.2.2", "command": "c"}
    result = results.build_result(_records(), specs, qs, meta)
    text = tables.format_tables(result)
    assert "| recycling | 3.00 | 12.0 | 2.33x | 2/3 |" in text
    assert "| hf | n/a |" in text
    assert "2.00x (2.50)" in text  # recycling on qa: speedup (mean accepted)
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**result, "questions": 2, "answers": 3}))
    assert tables.main([str(path)]) == 0  # the same tables again from the JSON file
    assert tables.main([str(tmp_path / "none.json")]) == 2 and tables.main([]) == 2


def _run_file(folder: Path, name: str, machine: str, speedup: float, identical: int = 3) -> None:
    methods = {"vanilla": {"tokens_per_s": 20.0, "speedup": 1.0, "mean_accepted": 1.0, "identical": 3, "compared": 3},
               "recycling[hybrid]": {"tokens_per_s": 30.0, "speedup": speedup, "mean_accepted": 2.5,
                                     "plausible": results._plausible(speedup, 2.5), "identical": identical,
                                     "compared": 3}}
    (folder / f"{name}.json").write_text(json.dumps({"machine": machine, "methods": methods}))


def test_the_results_grid_reads_a_folder_of_runs_and_profiles(tmp_path):
    _run_file(tmp_path, "zen-2t-harder", "Zen", 1.25)
    _run_file(tmp_path, "zen-1t-dev", "Zen", 1.5, identical=2)
    _run_file(tmp_path, "zen-2t-dev", "Zen", 2.9)  # above 1.1 x 2.5 tokens per step: noise
    _run_file(tmp_path, "zen-1t-dev-80-nodes", "Zen", 0.5)  # not a <machine>-<T>t-<set> name: left out
    curve = {"1": {"ms": 40.0, "min_ms": 38.0, "ratio": 1.0}, "4": {"ms": 50.0, "min_ms": 47.0, "ratio": 1.25}}
    (tmp_path / "profile-zen-2t.json").write_text(json.dumps({"machine": "Zen", "curve": curve}))
    text = tables.folder_tables(tmp_path)
    assert "| method | development, 1 thread | development, 2 threads | harder, 2 threads |" in text
    assert "| plain decoding, tokens/s | 20.0 | 20.0 | 20.0 |" in text
    assert ("| Token Recycling, `hybrid` (the page's Matrix + context; the CPU default) | 1.50x (2.50) | 2.90x ⚠ noisy (2.50) | "
            "1.25x (2.50) |") in text and "load changed" in text
    assert "| answers identical to plain decoding's | 2/3 | 3/3 | 3/3 |" in text and "0.50x" not in text
    assert "| Zen, 2 threads | 40.0 (38.0) | 1.25 |" in text
    assert tables.main([str(tmp_path)]) == 0


def test_the_readme_results_are_the_grid_of_bench_results():
    """The README's Results tables are the generated grid of bench/results, figure for figure."""
    root = Path(__file__).resolve().parents[1]
    grid = tables.results_grid({p.stem: json.loads(p.read_text()) for p in (root / "bench" / "results").glob("*.json")
                                if tables.RUN_NAME.match(p.stem)})
    rows = [line for line in grid.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 2 * 6
    readme, bench_readme = (root / "README.md").read_text(), (root / "bench" / "README.md").read_text()
    for row in rows:
        assert row in bench_readme, row
        if not row.startswith("| method"):
            assert row in readme, row


def test_the_readme_shows_the_concurrency_runs_of_bench_results():
    root = Path(__file__).resolve().parents[1]
    runs = {p.stem: json.loads(p.read_text()) for p in (root / "bench" / "results").glob("*.json")
            if tables.CONCURRENCY_NAME.match(p.stem)}
    rows = [line for line in tables.concurrency_tables(runs).splitlines() if line.startswith(("| ", "**"))]
    assert runs and rows
    bench_readme = (root / "bench" / "README.md").read_text()
    for row in rows:
        assert row in bench_readme, row


# ----------------------------------------------------------------------------- profile


def test_profile_curve_on_tiny_random_model():
    import torch

    model = profile.build_random_model("llama-tiny", "cpu", torch.float32)
    times = profile.measure_curve(model, [1, 4, 16], context=32, repeats=2, warmup=1)
    assert {n: len(v) for n, v in times.items()} == {1: 2, 4: 2, 16: 2}
    curve = profile.summarize(times)
    assert curve[1]["ratio"] == pytest.approx(1.0)
    assert all(c["ms"] > 0 for c in curve.values())


def test_profile_projection_and_interpolation():
    curve = {1: {"ratio": 1.0}, 64: {"ratio": 1.5}, 128: {"ratio": 2.5}}
    assert profile.interpolate({n: c["ratio"] for n, c in curve.items()}, 96) == pytest.approx(2.0)
    rows = profile.projections(curve, 3.0, {"recycling": {"mean_accepted": 2.0, "tree_nodes": 128}}, 64)
    assert rows[0]["projected_speedup"] == pytest.approx(2.0)
    assert rows[1]["projected_speedup"] == pytest.approx(0.8)


def test_profile_bad_input(tmp_path, capsys):
    for extra, message in [(["--sizes", "1,x"], "--sizes"), (["--mean-accepted", "0.5"], "--mean-accepted"),
                           (["--bench-json", str(tmp_path / "none.json")], "none.json: no such file")]:
        args = _parser().parse_args(["profile", "--config", "llama-tiny", *extra])
        assert args.func(args) == 2
        assert message in capsys.readouterr().err
    assert profile.parse_sizes("8,1,8,4") == [1, 4, 8]
    assert profile.parse_sizes("8") == [1, 8]


# ----------------------------------------------------------------------------- JSON contract on a tiny model


def _tiny_model_folder(folder: Path) -> Path:
    """A 2-layer random Llama with a character-level ChatML tokenizer, saved as a transformers folder."""
    import torch
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    chars = sorted(set(" \n\tabcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"()[]{}-_=+*/\\#<>|@%&$"))
    vocab = {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<|im_start|>",
                                   eos_token="<|im_end|>", pad_token="<unk>")
    fast.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=True)
    model = LlamaForCausalLM(config)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


THREE_QUESTIONS = [  # a two-turn conversation, a question and code: the tiny-model runs' question file
        '{"question_id": 1, "category": "writing", "turns": ["Write a poem about the sea.", "Shorter, please."]}',
        '{"question_id": 2, "category": "qa", "turns": ["What is the capital of France?"]}',
        '{"question_id": 3, "category": "code", "turns": ["def add(a, b):\\n    return a + b\\nprint(add(1, 2))"]}',
]


def test_json_contract_on_tiny_model(tmp_path):
    folder = _tiny_model_folder(tmp_path / "tiny")
    qfile = _write(tmp_path, "q.jsonl", THREE_QUESTIONS)
    out_json = tmp_path / "r.json"
    args = _parser().parse_args([
        "bench", "--questions", str(qfile), "--model", str(folder), "--device", "cpu", "--max-new-tokens", "24",
        "--methods", "vanilla,recycling,hf,pld", "--template", "2.2.2,adaptive,adaptive-fixed",
        "--no-progress", "--json", str(out_json)])
    assert args.func(args) == 0
    data = json.loads(out_json.read_text())
    for key in ("model", "device", "dtype", "torch", "transformers", "date", "max_new_tokens", "temperature",
                "template", "questions", "methods"):
        assert key in data, key
    assert data["questions"] == 3 and data["max_new_tokens"] == 24 and data["device"] == "cpu"
    assert "concurrency" not in data and "notes" not in data  # without --concurrency, the JSON of old
    assert data["sdpa_shared_kv_heads"] is True  # the tiny model's 4 query heads share 2 key/value heads, on a CPU
    assert list(data["methods"]) == ["vanilla", "recycling[2.2.2]", "recycling[adaptive]", "recycling[adaptive-fixed]",
                                     "hf", "pld"]
    assert data["template"] == "2.2.2,adaptive,adaptive-fixed"
    for name, m in data["methods"].items():
        for key in ("tokens", "seconds", "tokens_per_s", "steps", "mean_accepted", "speedup", "identical",
                    "compared", "per_category"):
            assert key in m, (name, key)
        assert m["compared"] == 4  # answers = turns: 2 + 1 + 1
        assert set(m["per_category"]) == {MULTI_TURN, "qa", "code"}
        for cat in m["per_category"].values():
            assert {"mean_accepted", "tokens_per_s", "speedup"} <= set(cat)
        assert m["tokens"] > 0 and m["seconds"] > 0 and m["steps"] > 0
    v = data["methods"]["vanilla"]
    assert v["speedup"] == pytest.approx(1.0) and v["mean_accepted"] == pytest.approx(1.0)
    assert data["methods"]["hf"]["mean_accepted"] == pytest.approx(1.0)  # one token per forward
    for name in ("recycling[2.2.2]", "recycling[adaptive]", "recycling[adaptive-fixed]"):  # lossless
        m = data["methods"][name]
        assert m["identical"] == m["compared"] == 4, name
        assert m["tokens"] == v["tokens"]
        assert m["mean_accepted"] >= 1.0 and m["mean_tree_nodes"] >= 1
    # the hardware-aware "adaptive" may choose plain steps on a slow machine; the fixed-budget trees never do
    for name in ("recycling[2.2.2]", "recycling[adaptive-fixed]"):
        assert data["methods"][name]["mean_accepted"] > 1.0, name
    # the paper's 81 nodes, less those under rows never written (an answer's cold first steps)
    assert 40 < data["methods"]["recycling[2.2.2]"]["mean_tree_nodes"] <= 81
    assert data["methods"]["recycling[adaptive-fixed]"]["mean_tree_nodes"] > 40
    assert len(data["records"]) == 4 * 6


def test_a_prompt_past_the_context_is_skipped_by_bench_and_refused_by_generate(tmp_path, capsys):
    from tr_core.cli import main

    folder = _tiny_model_folder(tmp_path / "tiny")  # context: 4096 tokens, one per character
    long_turn = "word " * 900
    qfile = _write(tmp_path, "q.jsonl", [
        json.dumps({"question_id": 1, "category": "qa", "turns": [long_turn, "And then?"]}),
        '{"question_id": 2, "category": "qa", "turns": ["What is the capital of France?"]}'])
    out = tmp_path / "r.json"
    assert main(["bench", "--questions", str(qfile), "--model", str(folder), "--device", "cpu", "--max-new-tokens",
                 "8", "--methods", "vanilla,recycling,pld", "--template", "2.2.2", "--no-progress",
                 "--json", str(out)]) == 0
    err = capsys.readouterr().err
    assert "bench: q/1 turn 1 skipped (and any later turns): its prompt has" in err
    assert "more than the model's context of 4096 tokens" in err and "Traceback" not in err
    data = json.loads(out.read_text())  # the other question's results are all there
    assert {r["question"] for r in data["records"]} == {"q/2"} and len(data["records"]) == 3
    assert data["answers"] == 1 and [(s["question"], s["turn"]) for s in data["skipped"]] == [("q/1", 1), ("q/1", 2)]
    assert "(1 answers, 2 turns skipped: too long for the model)" in tables.format_header(data)
    assert main(["generate", "--raw", "--prompt", long_turn, "--model", str(folder), "--device", "cpu",
                 "--max-new-tokens", "4"]) == 2
    assert "the prompt has 4500 tokens; this model's context holds 4096" in capsys.readouterr().err


def test_warm_up_uses_the_first_questions_that_fit_and_a_made_up_prompt_when_none_does():
    """An over-long first question is passed over, not left to warm nothing: one-off costs (kernel tuning, the cost
    probe) would otherwise land in the first timed answer."""
    from types import SimpleNamespace

    from tr_core.bench.questions import Question

    def fake_runner(limit):
        calls = []
        return calls, SimpleNamespace(
            args=SimpleNamespace(max_new_tokens=128),
            encode=lambda messages: [7] * len(messages[0]["content"]),
            overflow=lambda ids, n: "" if len(ids) + n <= limit else "too long",
            answer=lambda name, ids, max_new_tokens: calls.append((name, len(ids), max_new_tokens)),
            reset_matrices=lambda: calls.append("reset"))

    questions = [Question(i, "qa", (text,), "q.jsonl", i) for i, text in enumerate(["x" * 500, "y" * 20, "z" * 30])]
    specs = [SimpleNamespace(name="vanilla"), SimpleNamespace(name="recycling")]
    calls, runner = fake_runner(limit=100)
    bench.warm_up(runner, questions, specs, turns=1)
    assert calls == [("vanilla", 20, 32), ("recycling", 20, 32), "reset"]
    calls, runner = fake_runner(limit=70)  # no question fits; the made-up prompt does
    bench.warm_up(runner, questions[:1], specs, turns=1)
    assert [c[1] for c in calls[:-1]] == [len(bench.WARMUP_FALLBACK)] * 2


def test_repeats_keep_the_fastest_of_identical_decodings(tmp_path, monkeypatch):
    """`--repeats 3`: each turn is answered in three rounds of all methods, each method from the same learned state;
    the record keeps the fastest time and lists all three."""
    from tr_core.engine import Engine

    folder = _tiny_model_folder(tmp_path / "tiny")
    qfile = _write(tmp_path, "q.jsonl", [
        '{"question_id": 1, "category": "writing", "turns": ["Write a poem about the sea.", "Shorter, please."]}',
        '{"question_id": 3, "category": "code", "turns": ["def add(a, b):\\n    return a + b\\nprint(add(1, 2))"]}',
    ])
    restores = []
    original = Engine.restore
    monkeypatch.setattr(Engine, "restore",
                        lambda self, snap: (restores.append((id(self), snap["clock"])), original(self, snap)))
    out_json = tmp_path / "r.json"
    args = _parser().parse_args([
        "bench", "--questions", str(qfile), "--model", str(folder), "--device", "cpu", "--max-new-tokens", "16",
        "--methods", "vanilla,recycling,pld", "--template", "hybrid", "--repeats", "3", "--warmup", "0",
        "--no-progress", "--json", str(out_json)])
    assert args.func(args) == 0
    data = json.loads(out_json.read_text())
    assert data["repeats"] == 3
    assert len(data["records"]) == 3 * 3  # 3 answers (turns) x 3 methods, one record each
    for rec in data["records"]:
        assert len(rec["seconds_all"]) == 3 and rec["seconds"] == min(rec["seconds_all"])
    for name in ("recycling", "pld"):
        m = data["methods"][name]
        assert m["identical"] == m["compared"] == 3, name
    # two engines (vanilla, hybrid) x 3 answers x 2 restores; each round of an answer restarts from the clock it
    # began at, and the next answer from a later one
    assert len(restores) == 2 * 3 * 2
    for engine in {e for e, _ in restores}:
        clocks = [c for e, c in restores if e == engine]
        assert clocks[0::2] == clocks[1::2] and clocks[0::2] == sorted(set(clocks)) and len(set(clocks)) == 3


def test_the_frozen_cost_scripts_pld_replay_is_transformers_prompt_lookup():
    """scripts/frozen_cost_policy.py prices PLD by replaying its drafts; they must be the drafts transformers' own
    prompt lookup makes (the benchmark's `pld`), on sequences with many repeated n-grams and on ones with none."""
    import importlib.util

    import torch
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    path = Path(__file__).resolve().parents[1] / "scripts" / "frozen_cost_policy.py"
    spec = importlib.util.spec_from_file_location("frozen_cost_policy", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    hf = PromptLookupCandidateGenerator(num_output_tokens=script.PLD_TOKENS,
                                        max_matching_ngram_size=script.PLD_NGRAM, max_length=10_000)
    gen = torch.Generator().manual_seed(0)
    drafted = 0
    for trial in range(300):
        vocab = 3 + trial % 40  # small vocabularies repeat n-grams often; large ones rarely
        seq = torch.randint(0, vocab, (1 + trial % 60,), generator=gen).tolist()
        out, _ = hf.get_candidates(torch.tensor([seq]))
        assert script.pld_draft(seq) == out[0, len(seq):].tolist(), seq
        drafted += out.shape[1] > len(seq)
    assert 50 < drafted < 290  # both cases were met
    # the replay: a draft is accepted as far as the answer agrees, then one token more
    # after [5, 6, 7, 5] the 1-gram 5 drafts [6, 7, 5]: 6 and 7 agree, 9 is the bonus; after 9 nothing matches
    assert script.pld_forwards([5, 6, 7, 5], [6, 7, 9, 9]) == [1 + 3, 1]


# ----------------------------------------------------------------------------- --concurrency


def test_concurrency_on_a_tiny_model_end_to_end(tmp_path):
    """`--concurrency 3 --repeats 2` on four questions (groups of 3 and 1; a two-turn question answered on its first
    turn): every way's throughput and ratios, every engine answer the same batched and alone, pld left out with a note,
    and the tables of the file and of a folder holding it."""
    folder = _tiny_model_folder(tmp_path / "tiny")
    qfile = _write(tmp_path, "q.jsonl", [
        *THREE_QUESTIONS,
        '{"question_id": 4, "category": "qa", "turns": ["Name three colours of the rainbow, please."]}',
    ])
    out_json = tmp_path / "zen-2t-concurrency3.json"
    args = _parser().parse_args([
        "bench", "--questions", str(qfile), "--model", str(folder), "--device", "cpu", "--max-new-tokens", "20",
        "--methods", "vanilla,recycling,hf,pld", "--template", "2.2.2,adaptive", "--warm-start", "off",
        "--concurrency", "3", "--repeats", "2", "--no-progress", "--json", str(out_json)])
    assert args.func(args) == 0
    data = json.loads(out_json.read_text())
    assert (data["concurrency"], data["groups"], data["questions"], data["answers"]) == (3, 2, 4, 4)
    assert data["identical_batched_and_alone"] is True
    assert any(n.startswith("pld: not batched") for n in data["notes"]) and any("vLLM" in n for n in data["notes"])
    assert set(data["load_average"]) == {"before", "after"}
    methods = data["methods"]
    assert list(methods) == ["vanilla", "recycling[2.2.2]", "recycling[adaptive]", "hf"]
    tokens = methods["vanilla"]["alone"]["tokens"]
    for name in ("vanilla", "recycling[2.2.2]", "recycling[adaptive]"):
        m = methods[name]
        alone, batched = m["alone"], m["batched"]
        assert alone["identical"] == alone["compared"] == 4 and alone["identical_to"] == "vanilla alone"
        assert batched["identical"] == batched["compared"] == 4 and batched["identical_to"] == f"{name} alone"
        assert alone["tokens"] == batched["tokens"] == tokens and alone["seconds"] > 0 and batched["seconds"] > 0
        assert m["batched_over_alone"] == pytest.approx(batched["tokens_per_s"] / alone["tokens_per_s"])
        assert m["batched_over_plain_batched"] == pytest.approx(
            batched["tokens_per_s"] / methods["vanilla"]["batched"]["tokens_per_s"])
        assert m["batched_over_hf_batched"] == pytest.approx(
            batched["tokens_per_s"] / methods["hf"]["batched"]["tokens_per_s"])
    assert methods["recycling[2.2.2]"]["batched"]["mean_accepted"] > 1.0  # drafts are accepted in the batch too
    hf = methods["hf"]
    assert "alone" not in hf and hf["batched_over_alone"] is None and hf["batched"]["compared"] == 4
    assert hf["batched"]["identical_to"] == "vanilla alone" and hf["batched"]["tokens_per_s"] > 0
    assert len(data["records"]) == 2 * 7  # two groups x (3 engine methods x 2 ways + hf)
    assert sorted(len(r["questions"]) for r in data["records"])[::7] == [1, 3]
    for rec in data["records"]:  # two rounds of every way, each from the same state: the same ids, the faster kept
        assert rec["rounds_agree"] is True and len(rec["seconds_all"]) == 2 and rec["seconds"] == min(rec["seconds_all"])
    assert tables.main([str(out_json)]) == 0
    text = tables.folder_tables(tmp_path)
    assert "2 threads: 3 prompts at once** (4 first turns, 20 new tokens" in text
    assert "| method | one after another, tokens/s | 3 at once, tokens/s | at once / one after another |" in text
    assert "| plain decoding (the engine) |" in text and "| 1.00x | 4/4 |" in text
    assert "| 4/4 (to plain decoding's) |" in text and "every engine answer identical batched and alone" in text


def test_a_concurrency_run_says_when_an_answer_differs_batched_and_alone_and_when_the_machine_was_busy():
    from tr_core.bench import concurrency
    from tr_core.bench.questions import Question

    ways = concurrency.ways_of(bench.parse_methods("recycling,pld", "2.2.2"))
    assert [w.name for w in ways] == ["vanilla alone", "vanilla batched", "recycling alone", "recycling batched"]
    records = [{"group": 0, "method": w.spec.name, "batched": w.batched, "questions": ["q/1", "q/2"], "tokens": 8,
                "seconds": 2.0 if w.batched else 4.0, "steps": 4, "tree_nodes": 8, "answer_ids": [[5, 6], [7, 8]]}
               for w in ways]
    records[-1]["answer_ids"] = [[5, 6], [7, 9]]  # recycling batched: its second answer differs from its alone one
    questions = [Question(i, "qa", ("x",), "q.jsonl", i) for i in (1, 2, 3)]
    meta = {"model": "m", "device": "cpu", "machine": "test", "dtype": "float32", "torch": "t", "transformers": "t",
            "date": "d", "max_new_tokens": 8, "temperature": 0.0, "template": "2.2.2", "command": "c"}
    result = concurrency.build_result(records, ways, questions, meta, [], 2, {"before": [0.2]}, ["pld: left out"])
    assert result["identical_batched_and_alone"] is False
    assert (result["questions_selected"], result["questions"], result["question_keys"]) == (3, 2, ["q/1", "q/2"])
    m = result["methods"]["recycling"]
    assert (m["batched"]["identical"], m["batched"]["compared"]) == (1, 2) and m["batched_over_alone"] == 2.0
    assert result["notes"][0] == "pld: left out" and not any("busy" in n for n in result["notes"])
    assert "⚠ some engine answers differ batched and alone" in tables.format_tables(result)
    busy = concurrency.build_result(records, ways, questions, meta, [], 2, {"before": [2.4, 1.0, 1.0]}, [])
    assert "a busy machine: load average 2.40 before the run" in tables.format_header(busy)
