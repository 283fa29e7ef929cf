"""End to end on the embedded real model (SmolLM2-135M-Instruct, fp32, CPU): lossless on development prompts."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_questions

from tr_core import DecodeConfig, Engine
from tr_core.tree import SIZED_BY_COST, default_template

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def engine(embedded):
    model, tokenizer = embedded
    return Engine(model, tokenizer)


def prompts(n: int) -> list[str]:
    spec = load_questions("spec_bench_dev.jsonl", (2 * n) // 3)
    mbpp = load_questions("mbpp_dev.jsonl", n - len(spec))
    return [q["turns"][0] for q in spec + mbpp]


def test_greedy_recycling_equals_plain_on_30_dev_prompts(engine):
    engine.matrix.reset()
    stats = []
    for i, text in enumerate(prompts(30)):
        ids = engine.encode_chat([{"role": "user", "content": text}])[-400:]
        plain = list(engine.generate(ids, DecodeConfig(max_new_tokens=40, plain=True)))[-1]
        template = ("2.2.2", "adaptive", "adaptive-fixed", "hybrid", "hybrid-fixed")[i % 5]
        tr = list(engine.generate(ids, DecodeConfig(max_new_tokens=40, template=template)))[-1]
        assert tr.tokens == plain.tokens, f"prompt {i} ({template}) diverged: {text[:80]!r}"
        if template not in SIZED_BY_COST:  # hardware-aware trees may rightly choose plain steps on a slow machine
            stats.append(tr.mean_accepted)
    assert sum(stats) / len(stats) > 1.3, "the matrix must learn: mean accepted tokens per step stayed near 1"


def test_seeded_sampling_equals_plain_on_the_real_model(engine):
    for i, text in enumerate(prompts(4)):
        ids = engine.encode_chat([{"role": "user", "content": text}])[-300:]
        kw = dict(max_new_tokens=32, temperature=0.8, top_p=0.95, seed=i)
        plain = list(engine.generate(ids, DecodeConfig(plain=True, **kw)))[-1]
        tr = list(engine.generate(ids, DecodeConfig(template="2.2.2", **kw)))[-1]
        assert tr.tokens == plain.tokens


def test_chat_template_and_stop_tokens(engine):
    ids = engine.encode_chat([{"role": "user", "content": "Say hello."}])
    text = engine.tokenizer.decode(ids)
    assert "<|im_start|>user" in text and text.rstrip().endswith("assistant")
    assert engine.tokenizer.convert_tokens_to_ids("<|im_end|>") in engine.stop_token_ids
    assert engine.vocab_size == 49152 and engine.matrix.size_mb < 2.25


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tr_core", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_cli_answers_a_chat_prompt_as_json():
    plain = cli("generate", "--prompt", "What is 2 + 3? Answer briefly.", "--max-new-tokens", "24", "--json", "--plain")
    assert plain.returncode == 0, plain.stderr
    tr = cli("generate", "--prompt", "What is 2 + 3? Answer briefly.", "--max-new-tokens", "24", "--json")
    assert tr.returncode == 0, tr.stderr
    a, b = json.loads(plain.stdout), json.loads(tr.stdout)
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) > 0
    assert "5" in b["text"]
    assert a["steps"] == len(a["tokens"]) and b["steps"] <= a["steps"] and b["mean_accepted"] >= 1.0
    assert b["template"] == default_template("cpu") == "hybrid"  # the CPU default (the benchmark's winner there)
    assert b["tokens_per_s"] > 0
    assert b["prompt_tokens"] > 5 and b["prefill_s"] > 0 and b["wall_s"] == pytest.approx(b["prefill_s"] + b["decode_s"])


@pytest.mark.parametrize("args, message", [
    (["generate", "--prompt", "hi", "--template", "nope"], "unknown template"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "must be >= 1"),
    (["generate", "--prompt", "hi", "--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["generate", "--prompt", "   "], "empty"),
    (["generate", "--prompt", "hi", "--model", "/no/such/model.gguf"], "not found"),
    (["generate", "--prompt", "hi", "--model", "/no/such/folder"], "no such folder or .gguf file"),
    (["generate", "--prompt", "hi", "--model", "./README.md"], "not a .gguf file"),
    (["generate", "--prompt", "hi", "--device", "tpu"], "unknown device 'tpu'"),
    (["generate", "--prompt", "hi", "--save-matrix", "/no/such/folder/m.pt"], "--save-matrix: folder /no/such/folder does not exist"),
    (["generate", "--prompt", "hi", "--trace", "tests"], "--trace: tests is a folder"),
    (["profile", "--json", "/no/such/folder/p.json"], "--json: folder /no/such/folder does not exist"),
    (["generate", "--prompt", "hi", "--template", "small-16", "--topk-candidates", "3"], "--topk-candidates >= 4, got 3"),
    (["generate", "--prompt", "hi", "--temperature", "1e-9"], "--temperature must be 0 (greedy) or from 1e-06 up"),
])
def test_cli_bad_arguments_fail_clearly(args, message):
    result = cli(*args)
    assert result.returncode != 0
    assert message in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cli_asking_for_cuda_without_it_says_so():
    result = cli("generate", "--prompt", "hi", "--device", "cuda")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "CUDA is not available here" in result.stderr


def test_a_token_holding_part_of_a_character_shows_its_bytes(engine):
    from present.style import symbol_note, visible_token

    ids = engine.tokenizer("你好 😀 naïve", add_special_tokens=False)["input_ids"]
    shown = [engine.token_text(i) for i in ids]
    assert "\ufffd" not in "".join(shown) and "ä½" not in shown  # no replacement characters, no byte-level mojibake
    assert "‹e4bd›" in shown and " ‹f09f98›" in shown and "ïve" in shown, shown  # 你 = e4 bd a0; 😀 = f0 9f 98 80
    rebuilt = bytes.fromhex("".join(t.strip(" ‹›") for t in shown if t.strip().startswith("‹")))
    assert "你".encode() in rebuilt and "😀".encode() in rebuilt  # the bytes shown are the text's own
    assert "‹e4› = a byte of a split character" in symbol_note([visible_token(t) for t in shown])
