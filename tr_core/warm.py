"""A warm start: what a fresh engine needs to draft well from its first answer, learned beforehand (issue 40).

A new session starts with an empty adjacency matrix: the paper's tree then drafts from empty rows, and the
cost-sized trees start from priors. A warm start is what a few hundred generated answers leave behind:

- the adjacency matrix's written rows (candidate ids and their stored probabilities),
- the cost-sized drafters' calibration (acceptance counts per key) and trust per size class (their size policy),
- the answers themselves (their token ids): the hybrid tree also copies runs from them (`HybridDrafter.library`),
  as it copies runs from the conversation.

Not the forward-cost curve (it describes a machine) and not the hybrid's context index (it holds conversations).

It is learned by decoding a corpus the project ships (tr_core/warm_start/corpus.jsonl: generic instructions written
for it, none taken from the benchmark's question sets), greedy, through the engine; never from a visitor's
conversation, whose text a matrix row could leak to the next visitor. The embedded model's file is shipped
(scripts/build_warm_start.py builds it); any other model learns one once from a bounded part of the corpus and keeps
it in the cache folder (models.cache_dir() / "warm-start"). The library starts cold unless asked (`warm_start`); the
command line's default is `--warm-start auto`.

Files are safetensors (tensors only, nothing unpickled) whose metadata holds a JSON manifest: the model's
fingerprint (vocabulary size, k, a hash of the tokenizer's vocabulary and the model's shape), the corpus hash, the
date, the answers and tokens decoded and the rows filled. A file for another model is refused with the reason.
"""
from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

FORMAT = "token-recycling-warm-start/1"
ASSETS = Path(__file__).resolve().parent / "warm_start"  # package data: shipped with the wheel too
CORPUS = ASSETS / "corpus.jsonl"
SHIPPED = ASSETS / "smollm2-135m-instruct.safetensors"  # the embedded model's warm start
EMBEDDED_NAMES = ("", "embedded", "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct")
LEARN_PROMPTS = 48  # another model learns from this many corpus prompts (spread over its categories) ...
LEARN_TOKENS = 64  # ... of at most this many tokens each: about a minute for a 135M model on 2 CPU cores
# ... and the context-free rows of the lowest ids (a BPE vocabulary's first merges: its commonest tokens); the shipped
# file has every id's (scripts/build_warm_start.py)
LEARN_CONTEXT_FREE = 16384
CONTEXT_FREE_REQUEST = "Hello."  # the conversation a context-free row's token opens the answer to
COUNT_CAP = 32.0  # calibration trials kept per key: the shipped rates start informed but still follow the session
MAX_FILE_BYTES = 16 << 20  # a warm start of a 256k vocabulary with k = 8 is about 11 MB
MAX_LIBRARY_TOKENS = 1 << 19  # answer tokens a file may hold (the shipped file: about 30,000)
# The config fields that say which network this is (not where or in what precision it was loaded)
_SHAPE_FIELDS = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "intermediate_size", "max_position_embeddings", "rope_theta",
                 "tie_word_embeddings", "head_dim")
_DRAFTERS = ("adaptive", "hybrid")


class WarmStartError(ValueError):
    """A warm-start file that cannot be used here; the message says why."""


@dataclass(frozen=True)
class WarmStartInfo:
    """What a `warm_start` call did, as plain data for the page, the command line and the benchmark."""

    # "shipped" (with the app), "cached" (learned earlier), "learned" (just now), "file" (a path given) or "none"
    source: str
    answers: int  # corpus answers the warm start was learned from (0: none)
    tokens: int  # tokens those answers decoded
    rows_filled: int  # adjacency-matrix rows it fills
    path: str  # the file it came from or was saved to ("" for none)
    note: str = ""  # for "none": why the engine starts cold
    context_free: int = 0  # of those rows, how many hold the model's context-free guess (no answer used the token)
    library: int = 0  # of those answers, how many the hybrid tree can copy runs from (0: a file without them)

    def describe(self) -> str:
        """One plain-English line for the page."""
        learned = f"{self.answers} generated answers ({self.rows_filled - self.context_free:,} rows"
        learned += (f"; {self.context_free:,} more rows hold the model's guess after the token alone)"
                    if self.context_free else ")")
        copies = "; the matrix + context (hybrid) tree also copies runs from those answers" if self.library else ""
        if self.source == "shipped":
            return f"Warm start: the matrix was pre-learned on {learned} shipped with the app{copies}"
        if self.source == "cached":
            return f"Warm start: learned once for this model on {learned}, kept in {self.path}{copies}"
        if self.source == "file":
            return f"Warm start: from {self.path}, learned on {learned}{copies}"
        if self.source == "learned":
            return (f"Warm start: learned just now for this model on {learned}, kept in {self.path} for next "
                    f"time{copies}")
        return f"Cold start: the matrix starts empty{f' ({self.note})' if self.note else ''}"


@dataclass
class WarmState:
    """A warm start in memory: the matrix's written rows, the drafters' learned state, the manifest."""

    rows: torch.Tensor  # [R] long, the written rows (ascending)
    table: torch.Tensor  # [R, k] int32, their candidate ids
    probs: torch.Tensor  # [R, k] uint8, their stored probabilities (1/255 steps)
    learned: dict[str, dict]  # per drafter ("adaptive", "hybrid"): AdaptiveDrafter.learned()
    manifest: dict[str, Any]  # plain data, see the module docstring
    library: list[list[int]] | None = None  # the answers' token ids, for the hybrid to copy from (None: none kept)


def is_embedded(model_name: str | None) -> bool:
    """Whether a model name means the embedded SmolLM2-135M-Instruct (the model whose warm start is shipped)."""
    return model_name is None or str(model_name).strip() in EMBEDDED_NAMES


def model_fingerprint(engine) -> str:
    """sha256 of what makes a matrix fit a model: the tokenizer's vocabulary, the network's shape fields, k."""
    config = engine.model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    shape = {name: getattr(config, name, None) for name in _SHAPE_FIELDS}
    vocab = sorted(engine.tokenizer.get_vocab().items(), key=lambda item: item[1])
    text = json.dumps({"vocab": vocab, "shape": shape, "rows": engine.vocab_size, "k": engine.matrix.k},
                      sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_corpus(path: str | Path = CORPUS) -> list[str]:
    """The corpus's prompts, in file order: JSON lines {"category", "prompt"}; raises WarmStartError if malformed."""
    prompts = []
    for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            prompt = json.loads(line)["prompt"]
        except (ValueError, KeyError, TypeError) as exc:
            raise WarmStartError(f"{path}:{number}: not a JSON object with a prompt") from exc
        if not isinstance(prompt, str) or not prompt.strip() or len(prompt) > 4000:
            raise WarmStartError(f"{path}:{number}: a prompt is a non-empty string of at most 4000 characters")
        prompts.append(prompt)
    if not prompts:
        raise WarmStartError(f"{path}: no prompts")
    return prompts


def spread(prompts: list[str], n: int) -> list[str]:
    """n prompts taken evenly over the list (the corpus is grouped by category: each gets its share)."""
    if n >= len(prompts):
        return list(prompts)
    return [prompts[i * len(prompts) // n] for i in range(n)]


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# -- learning -------------------------------------------------------------------------------------------------------
CALIBRATE_EVERY = 4  # one corpus prompt in this many is decoded again, from the warm matrix, to calibrate the drafters


def learn(engine, prompts: list[str], max_new_tokens: int,
          progress: Callable[[int, int], None] | None = None,
          context_free: int | None = LEARN_CONTEXT_FREE) -> WarmState:
    """What a fresh engine should start from, learned from `prompts` (three passes; leaves the engine cold again,
    its forward costs measured):

    1. decode every prompt greedily from an empty engine, alternating the hybrid and the adaptive tree (each
       learns its calibration and trust; both fill the one matrix);
    2. replace every row that precedes an answer token by the model's average top-k after that token over the
       answers (`average_rows`; one forward per answer, no decoding);
    3. calibrate the drafters to such a matrix: one prompt in CALIBRATE_EVERY is answered again, each answer
       starting from the rows averaged over the OTHER prompts' answers (as a visitor's first answer starts from
       rows learned on other questions), after the older-row calibration of pass 1 is dropped.
    Rows no answer wrote hold the model's context-free guess (`context_free_rows`) for the `context_free` lowest ids
    (None: every id; 0: none), under the averaged rows in pass 3 and in the matrix kept, which is averaged over all
    the answers. progress(done, total) counts pass 1's answers, the context-free rows' forwards, pass 3's answers."""
    engine.forget()
    held = set(range(0, len(prompts), CALIBRATE_EVERY)) if len(prompts) >= 2 * CALIBRATE_EVERY else set()
    vocab, k = engine.vocab_size, engine.matrix.k
    guessed = lowest_ids(engine, context_free)
    forwards = -(-len(guessed) // context_free_batch(vocab))
    total = len(prompts) + forwards + len(held)
    tick = (lambda i: progress(i, total)) if progress is not None else (lambda i: None)
    answers, steps = decode_answers(engine, prompts, max_new_tokens, tick)
    tops = dict(zip(answers, answer_tops(engine.model, list(answers.values()), vocab, k)))  # one forward each
    set_rows(engine.matrix, *context_free_rows(engine, guessed, lambda i: tick(len(prompts) + i)))
    if held:
        set_rows(engine.matrix, *average_tops([t for i, t in tops.items() if i not in held], vocab, k))
        calibrate(engine, [prompts[i] for i in sorted(held)], max_new_tokens,
                  lambda i: tick(len(prompts) + forwards + i))
    averaged = average_tops(list(tops.values()), vocab, k)
    set_rows(engine.matrix, *averaged)
    state = capture(engine, {"answers": len(answers), "tokens": sum(len(a) for _, a in answers.values()),
                             "steps": steps, "max_new_tokens": max_new_tokens,
                             "calibration_answers": len(held),
                             "rows_context_free": len(set(guessed) - set(averaged[0].tolist()))})
    engine.forget()
    return with_library(state, [answer for _, answer in answers.values()])


def with_library(state: WarmState, answers: list[list[int]]) -> WarmState:
    """The warm state with `answers` (token ids) as the hybrid's library, counted in its manifest."""
    state.library = [list(a) for a in answers if a]
    state.manifest.update(library_answers=len(state.library), library_tokens=sum(map(len, state.library)))
    return state


def decode_answers(engine, prompts: list[str], max_new_tokens: int, tick: Callable[[int], None]
                   ) -> tuple[dict[int, tuple[list[int], list[int]]], int]:
    """Pass 1 of `learn`: {prompt index: (prompt ids, answer ids)} and the steps taken, alternating the trees."""
    answers, steps = {}, 0
    for i, prompt in enumerate(prompts):
        answer, answer_steps = _decode(engine, prompt, max_new_tokens, "hybrid" if i % 2 == 0 else "adaptive")
        if answer is not None:
            answers[i], steps = answer, steps + answer_steps
        tick(i + 1)
    return answers, steps


def lowest_ids(engine, n: int | None) -> list[int]:
    """The n lowest token ids (None: all) of those the tokenizer names (ids past its length are never emitted)."""
    try:
        named = min(engine.vocab_size, len(engine.tokenizer))
    except TypeError:  # a tokenizer without a length
        named = engine.vocab_size
    return list(range(named if n is None else min(named, n)))


def context_free_batch(vocab_size: int) -> int:
    """Tokens per forward of `context_free_rows`: 256, fewer for vocabularies whose logits would pass 128 MB."""
    return max(16, min(256, (32 << 20) // max(vocab_size, 1)))


@torch.no_grad()
def context_free_rows(engine, tokens: list[int], tick: Callable[[int], None] = lambda i: None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each token's row as the model's top-k after it when it opens an answer to CONTEXT_FREE_REQUEST: a guess
    for the rows no corpus answer wrote (without one, a warm session drafts nothing after such a token; a word's
    first piece is mostly followed by its usual second). (rows [R] long, candidates [R, k] int32, probabilities
    [R, k] uint8), in the order of `tokens`.

    The request's prompt is run into a cache once; then each forward takes `context_free_batch` tokens at the same
    position, each seeing the prompt and itself (a tree of siblings), and is cut back off the cache. tick(i) after
    the i-th forward."""
    from .kv_cache import TreeKVCache

    runner, k, vocab = engine.runner, engine.matrix.k, engine.vocab_size
    prompt = engine.encode_chat([{"role": "user", "content": CONTEXT_FREE_REQUEST}])
    cache = TreeKVCache()
    runner.prefill(prompt, cache)
    past, size = len(prompt), context_free_batch(vocab)
    tables, probs = [], []
    for i, start in enumerate(range(0, len(tokens), size)):
        chunk = torch.tensor(tokens[start:start + size], dtype=torch.long, device=runner.device)
        n = chunk.numel()
        depths = torch.zeros(n, dtype=torch.long, device=runner.device)
        alone = torch.eye(n, dtype=torch.bool, device=runner.device)
        logits = runner.forward(chunk[None], (past + depths)[None], runner.mask(alone, depths, past), cache)
        cache.truncate(past)
        top_p, top_ids = torch.softmax(logits[:, :vocab].float(), dim=-1).topk(k, dim=-1)
        tables.append(top_ids.to(torch.int32).cpu())
        probs.append((top_p * 255).round().clamp(0, 255).to(torch.uint8).cpu())
        tick(i + 1)
    if not tables:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, k, dtype=torch.int32), torch.zeros(0, k, dtype=torch.uint8)
    return torch.tensor(tokens, dtype=torch.long), torch.cat(tables), torch.cat(probs)


def set_rows(matrix, rows: torch.Tensor, table: torch.Tensor, probs: torch.Tensor) -> None:
    """Write whole rows into the matrix (rows [R] long, candidates [R, k] int32, probabilities [R, k] uint8)."""
    on = rows.to(matrix.device)
    matrix.table[on], matrix.probs[on] = table.to(matrix.device), probs.to(matrix.device)
    matrix.filled[on] = True


def calibrate(engine, prompts: list[str], max_new_tokens: int, tick: Callable[[int], None]) -> None:
    """Pass 3 of `learn`: answer `prompts`, each from the matrix as it is now (restored before every answer; the
    context index emptied), so that the drafters learn how often candidates of such rows are accepted. The
    older-row calibration learned in pass 1 (rows last written by another answer) is dropped first."""
    for name in _DRAFTERS:
        getattr(engine, name).drop_older_row_calibration()
    start = engine.matrix.clone()
    start.stamps.fill_(-1)  # every row written before the answers: rated as older rows, as in a warm session
    for i, prompt in enumerate(prompts):
        engine.forget()
        engine.matrix.copy_from(start)
        _decode(engine, prompt, max_new_tokens, "hybrid" if i % 2 == 0 else "adaptive")
        tick(i + 1)
    engine.forget()
    engine.matrix.copy_from(start)


def _decode(engine, prompt: str, max_new_tokens: int,
            template: str) -> tuple[tuple[list[int], list[int]] | None, int]:
    """((prompt ids, answer ids), steps) of one greedy answer; (None, 0) when the prompt leaves no room."""
    from .config import DecodeConfig
    from .events import SummaryEvent

    ids = engine.encode_chat([{"role": "user", "content": prompt}])
    if len(ids) + max_new_tokens >= engine.context_limit:
        return None, 0
    for event in engine.generate(ids, DecodeConfig(max_new_tokens=max_new_tokens, template=template)):
        if isinstance(event, SummaryEvent):
            return (ids, list(event.tokens)), event.steps
    return None, 0


def average_rows(model, answers: list[tuple[list[int], list[int]]], vocab_size: int,
                 k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each token's row as the model's average top-k after it over `answers` [(prompt ids, answer ids)]:
    (rows [R] long, candidates [R, k] int32, probabilities [R, k] uint8), rows ascending.

    The paper's matrix keeps the candidates LAST seen after a token: right for the conversation at hand, but for a
    warm start that last place is an accident of the corpus's order. Averaged over every place the token precedes
    an answer token (the answers fed back whole: one forward each, no decoding), a row holds what most often
    follows it. A candidate's score is its summed probability; its stored probability the mean over the places."""
    return average_tops(answer_tops(model, answers, vocab_size, k), vocab_size, k)


@torch.no_grad()
def answer_tops(model, answers: list[tuple[list[int], list[int]]], vocab_size: int,
                k: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per answer: (the tokens that precede its answer tokens [L] long, the model's top-k after each [L, k] long and
    their probabilities [L, k] float64), on the CPU; one forward per answer. An answer with nothing gives empties."""
    device = next(model.parameters()).device
    out = []
    for prompt, answer in answers:
        ids, start = list(prompt) + list(answer), len(prompt) - 1
        if start < 0 or not answer:
            out.append((torch.zeros(0, dtype=torch.long), torch.zeros(0, k, dtype=torch.long),
                        torch.zeros(0, k, dtype=torch.float64)))
            continue
        logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, start:, :vocab_size]
        probs, cands = torch.softmax(logits.float(), dim=-1).topk(k, dim=-1)  # [L, k]
        out.append((torch.tensor(ids[start:], dtype=torch.long), cands.cpu(), probs.cpu().double()))
    return out


def average_tops(tops: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], vocab_size: int,
                 k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`average_rows` from the answers' `answer_tops`: each row's k candidates of highest summed probability."""
    if not any(rows.numel() for rows, _, _ in tops):
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, k, dtype=torch.int32), torch.zeros(0, k, dtype=torch.uint8)
    seen = torch.zeros(vocab_size, dtype=torch.float64)
    for rows, _, _ in tops:
        seen.index_add_(0, rows, torch.ones(rows.numel(), dtype=torch.float64))
    keys = torch.cat([(rows[:, None] * vocab_size + cands).view(-1) for rows, cands, _ in tops])
    pairs, where = torch.unique(keys, return_inverse=True)  # ascending: by row, then candidate
    score = torch.zeros(pairs.numel(), dtype=torch.float64).index_add_(0, where, torch.cat([p.view(-1) for *_, p in tops]))
    row = pairs // vocab_size
    order = torch.argsort(-score, stable=True)
    order = order[torch.argsort(row[order], stable=True)]  # by row, best candidate first
    row, cand, score = row[order], (pairs % vocab_size)[order], score[order]
    starts = torch.searchsorted(row, row, right=False)  # each entry's row's first index
    keep = torch.arange(row.numel()) - starts < k  # every row has >= k candidates: each place gave k distinct ones
    rows = row[keep].view(-1, k)[:, 0]
    probs = (score[keep] / seen[row[keep]]).view(-1, k)
    return rows, cand[keep].view(-1, k).to(torch.int32), (probs * 255).round().clamp(0, 255).to(torch.uint8)


def capped(hits: torch.Tensor, trials: torch.Tensor, cap: float = COUNT_CAP) -> tuple[torch.Tensor, torch.Tensor]:
    """Counts [keys] scaled down to at most `cap` trials per key, each key's rate kept."""
    scale = torch.clamp(cap / trials.clamp(min=1e-9), max=1.0)
    return hits * scale, trials * scale


def capture(engine, manifest: dict[str, Any]) -> WarmState:
    """The engine's learned state as a WarmState (its manifest: `manifest` plus the model and matrix facts)."""
    matrix = engine.matrix
    rows = matrix.filled.nonzero().view(-1).cpu()
    learned = {}
    for name in _DRAFTERS:
        state = getattr(engine, name).learned()
        hits, trials = capped(state["hits"], state["trials"])
        learned[name] = {"hits": hits, "trials": trials, "trust": state["trust"]}
    info = {"format": FORMAT, "fingerprint": model_fingerprint(engine), "vocab_size": matrix.vocab_size,
            "k": matrix.k, "rows_filled": int(rows.numel()),
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "trust": {name: learned[name]["trust"] for name in _DRAFTERS}, **manifest}
    return WarmState(rows=rows, table=matrix.table[rows.to(matrix.device)].cpu().to(torch.int32),
                     probs=matrix.probs[rows.to(matrix.device)].cpu(), learned=learned, manifest=info)


def apply(engine, state: WarmState) -> None:
    """Replace what the engine learned by the warm state: the matrix (rows stamped -1: written before any answer,
    so the drafters rate them as older rows), the drafters' calibration and trust; the context index emptied."""
    for name in _DRAFTERS:  # checked first: a misfit changes nothing
        try:
            type(getattr(engine, name))(engine.device).take_learned(state.learned[name])
        except ValueError as exc:
            raise WarmStartError(f"the warm start's {name} state does not fit: {exc}") from exc
    engine.forget()
    set_rows(engine.matrix, state.rows, state.table, state.probs)
    for name in _DRAFTERS:
        getattr(engine, name).take_learned(state.learned[name])
    if state.library:
        engine.hybrid.library = shared_library(tuple(map(tuple, state.library)))


@functools.lru_cache(maxsize=4)
def shared_library(answers: tuple[tuple[int, ...], ...]):
    """The hybrid's library of these answers, built once (a few hundred ms and MB for the shipped file's) and shared
    by every engine that starts from them: a library never changes."""
    from .context import Library

    return Library([list(a) for a in answers])


def fresh_session(engine) -> None:
    """The engine as a new session finds it: matrix and context index empty, the drafters' starting calibration and
    trust; the forward-cost curve measured on this machine kept (a new session on the same machine)."""
    from .adaptive import AdaptiveDrafter
    from .hybrid import HybridDrafter

    engine.forget()
    for name, kind in (("adaptive", AdaptiveDrafter), ("hybrid", HybridDrafter)):
        old, new = getattr(engine, name), kind(engine.device)
        new.cost, new.on_host = old.cost, old.on_host
        new._refresh()  # on a GPU the rates' lookup table follows on_host
        setattr(engine, name, new)
    engine.warm = None


# -- files ----------------------------------------------------------------------------------------------------------
def save(state: WarmState, path: str | Path) -> None:
    """Write a warm start as safetensors with its manifest in the metadata (atomically)."""
    from safetensors.torch import save_file

    tensors = {"matrix.rows": state.rows.to(torch.int32), "matrix.table": state.table.contiguous(),
               "matrix.probs": state.probs.contiguous()}
    for name in _DRAFTERS:
        tensors[f"{name}.hits"] = state.learned[name]["hits"].double().contiguous()
        tensors[f"{name}.trials"] = state.learned[name]["trials"].double().contiguous()
    if state.library:  # the answers end to end, and each one's length
        tensors["library.tokens"] = torch.tensor([t for a in state.library for t in a], dtype=torch.int32)
        tensors["library.lengths"] = torch.tensor([len(a) for a in state.library], dtype=torch.int32)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata={"manifest": json.dumps(state.manifest, sort_keys=True)})
    tmp.replace(path)


def load(path: str | Path, engine) -> WarmState:
    """Read a warm-start file for `engine`'s model; raises WarmStartError with the reason when it does not fit."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    if not path.is_file():
        raise WarmStartError(f"warm-start file not found: {path}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise WarmStartError(f"{path} is {path.stat().st_size:,} bytes, more than a warm start can be")
    try:
        with safe_open(str(path), framework="pt") as f:
            manifest = json.loads((f.metadata() or {}).get("manifest", "null"))
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise WarmStartError(f"{path} is not a warm-start file ({type(exc).__name__})") from exc
    check_manifest(manifest, engine, path)
    library = check_library(tensors, engine.vocab_size, path)
    return WarmState(*check_tensors(tensors, engine, path), manifest=manifest, library=library)


def check_manifest(manifest: Any, engine, path: Path) -> None:
    """Refuse a manifest of another format or model."""
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise WarmStartError(f"{path} is not a warm-start file (format {FORMAT!r} expected)")
    if manifest.get("vocab_size") != engine.vocab_size or manifest.get("k") != engine.matrix.k:
        raise WarmStartError(f"{path} was learned for vocabulary {manifest.get('vocab_size')} with k = "
                             f"{manifest.get('k')}, but this model has vocabulary {engine.vocab_size} with k = "
                             f"{engine.matrix.k}")
    if manifest.get("fingerprint") != model_fingerprint(engine):
        raise WarmStartError(f"{path} was learned for another model (its tokenizer or network shape differ from "
                             f"this one's: fingerprint {str(manifest.get('fingerprint'))[:12]}...)")
    for name in ("answers", "tokens", "rows_filled", "rows_context_free"):
        if name == "rows_context_free" and name not in manifest:
            continue  # files from before context-free rows
        if not isinstance(manifest.get(name), int) or manifest[name] < 0:
            raise WarmStartError(f"{path}: manifest field {name} must be an integer >= 0")
    if manifest.get("rows_context_free", 0) > manifest["rows_filled"]:
        raise WarmStartError(f"{path}: manifest counts more context-free rows than rows")
    trust = manifest.get("trust")
    if not isinstance(trust, dict) or set(trust) != set(_DRAFTERS):
        raise WarmStartError(f"{path}: manifest field trust must hold {', '.join(_DRAFTERS)}")


def check_library(tensors: dict[str, torch.Tensor], vocab: int, path: Path) -> list[list[int]] | None:
    """The answers of a file's library.tokens / library.lengths (taken out of `tensors`; None for a file without
    them), every id and length checked."""
    if "library.tokens" not in tensors and "library.lengths" not in tensors:
        return None
    tokens, lengths = tensors.pop("library.tokens", None), tensors.pop("library.lengths", None)
    if tokens is None or lengths is None or tokens.dtype != torch.int32 or lengths.dtype != torch.int32 \
            or tokens.dim() != 1 or lengths.dim() != 1:
        raise WarmStartError(f"{path}: library.tokens and library.lengths must both be int32 vectors")
    if tokens.numel() > MAX_LIBRARY_TOKENS or (lengths.numel() and int(lengths.min()) < 1) \
            or int(lengths.sum()) != tokens.numel():
        raise WarmStartError(f"{path}: the library's lengths must be >= 1 and add up to its tokens (at most "
                             f"{MAX_LIBRARY_TOKENS:,})")
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab):
        raise WarmStartError(f"{path}: library token ids outside the vocabulary [0, {vocab})")
    flat = tokens.tolist()
    ends = lengths.cumsum(0).tolist()
    return [flat[end - n:end] for end, n in zip(ends, lengths.tolist())]


def check_tensors(tensors: dict[str, torch.Tensor], engine,
                  path: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, dict]]:
    """(rows, table, probs, learned counts) of a file's tensors, every shape, type and id checked."""
    names = {"matrix.rows", "matrix.table", "matrix.probs", *(f"{d}.{c}" for d in _DRAFTERS for c in ("hits", "trials"))}
    if set(tensors) != names:
        raise WarmStartError(f"{path}: tensors {sorted(names)} expected, found {sorted(tensors)}")
    rows, table, probs = tensors["matrix.rows"], tensors["matrix.table"], tensors["matrix.probs"]
    vocab, k = engine.vocab_size, engine.matrix.k
    if rows.dtype != torch.int32 or table.dtype != torch.int32 or probs.dtype != torch.uint8:
        raise WarmStartError(f"{path}: rows and candidate ids must be int32, probabilities uint8")
    if rows.dim() != 1 or table.shape != (rows.numel(), k) or probs.shape != (rows.numel(), k):
        raise WarmStartError(f"{path}: the matrix tensors' shapes do not agree (rows [R], candidates [R, {k}])")
    if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= vocab or int(table.min()) < 0
                         or int(table.max()) >= vocab or rows.unique().numel() != rows.numel()):
        raise WarmStartError(f"{path}: row or candidate ids outside the vocabulary [0, {vocab}), or repeated rows")
    learned = {d: {"hits": tensors[f"{d}.hits"], "trials": tensors[f"{d}.trials"]} for d in _DRAFTERS}
    for counts in learned.values():
        if any(t.dtype != torch.float64 or t.dim() != 1 or not bool(torch.isfinite(t).all())
               for t in counts.values()):
            raise WarmStartError(f"{path}: calibration counts must be finite float64 vectors")
    return rows.long(), table, probs, learned


def read(path: str | Path, engine) -> WarmState:
    """`load`, with the trust of the manifest joined to the drafters' counts."""
    state = load(path, engine)
    for name in _DRAFTERS:
        state.learned[name]["trust"] = state.manifest["trust"][name]
    return state


# -- the one call -----------------------------------------------------------------------------------------------------
def cached_path(model_name: str, fingerprint: str) -> Path:
    """Where another model's learned warm start is kept: the cache folder's warm-start/ (beside converted models)."""
    from .models import cache_dir

    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(str(model_name)).name or "model").strip("-.")[:60] or "model"
    return cache_dir() / "warm-start" / f"{slug}-{fingerprint[:16]}.safetensors"


def warm_start(engine, model_name: str | None, *, learn: bool = True,
               progress: Callable[[int, int], None] | None = None) -> WarmStartInfo:
    """Start `engine` warm: the shipped file for the embedded model, else the one cached for this model, else (when
    `learn`) learn one now from the corpus, cache it and apply it. Returns what was done (`engine.warm` too).

    progress(done, total) is called after each corpus answer while learning. A file that does not fit is refused
    (WarmStartError) for the shipped one; a cached one that does not fit is learned again."""
    if is_embedded(model_name) and SHIPPED.is_file():
        return _applied(engine, read(SHIPPED, engine), "shipped", SHIPPED)
    fingerprint = model_fingerprint(engine)
    path = cached_path(model_name or "embedded", fingerprint)
    if path.is_file():
        try:
            return _applied(engine, read(path, engine), "cached", path)
        except (WarmStartError, ValueError):
            pass  # a stale or damaged cache file: learned again below when allowed
    if not learn or not CORPUS.is_file():
        note = "no warm start learned for this model yet" if learn is False else f"the corpus {CORPUS} is missing"
        info = WarmStartInfo("none", 0, 0, 0, "", note=note)
        engine.warm = info
        return info
    return _learn_and_cache(engine, path, progress)


def warm_from_file(engine, path: str | Path) -> WarmStartInfo:
    """Apply the warm-start file `path` (WarmStartError when it does not fit this model)."""
    return _applied(engine, read(path, engine), "file", Path(path))


def _learn_and_cache(engine, path: Path, progress: Callable[[int, int], None] | None) -> WarmStartInfo:
    """Learn from LEARN_PROMPTS corpus prompts spread over its categories; cache the file; apply it."""
    prompts = read_corpus(CORPUS)
    state = learn(engine, spread(prompts, LEARN_PROMPTS), LEARN_TOKENS, progress)
    state.manifest.update(corpus_sha256=file_sha256(CORPUS), corpus_prompts=len(prompts))
    try:
        save(state, path)
    except OSError as exc:  # a read-only cache still gets this session warm
        apply(engine, state)
        info = WarmStartInfo("learned", state.manifest["answers"], state.manifest["tokens"],
                             state.manifest["rows_filled"], "", note=f"not cached: {exc}",
                             context_free=int(state.manifest.get("rows_context_free", 0)))
        engine.warm = info
        return info
    return _applied(engine, state, "learned", path)


def _applied(engine, state: WarmState, source: str, path: Path) -> WarmStartInfo:
    apply(engine, state)
    m = state.manifest
    info = WarmStartInfo(source, m["answers"], m["tokens"], m["rows_filled"], str(path),
                         context_free=int(m.get("rows_context_free", 0)), library=len(state.library or []))
    engine.warm = info
    return info

