"""Build the embedded model's warm start (tr_core/warm.py) from the project's own corpus.

    python scripts/build_warm_start.py                      # all of tr_core/warm_start/corpus.jsonl, 128 tokens each
    python scripts/build_warm_start.py --limit 4 --out /tmp/w.safetensors   # a quick check

Decodes every corpus prompt greedily through the engine (alternating the hybrid and the adaptive tree, so both
learn their calibration and trust; both fill the one matrix), averages each row over the answers, fills the rows
no answer wrote with the model's guess after the token alone, answers one prompt in four again from such a matrix to
calibrate the drafters (tr_core/warm.py, `learn`), then saves the
matrix's written rows and the drafters' learned state as safetensors with a manifest, and the manifest as JSON
beside it. Never reads the benchmark's question sets: the warm start is judged on them.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tr_core import warm  # noqa: E402


def context_free_count(text: str) -> int | None:
    """--context-free: "all" (None: every id) or a number of lowest ids >= 0."""
    if text == "all":
        return None
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"give 'all' or a number of ids >= 0, not {text!r}")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """Parse the options, decode the corpus, write the warm start; returns the exit code."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", default=str(warm.CORPUS), help="JSON lines {category, prompt} (default: %(default)s)")
    p.add_argument("--out", default=str(warm.SHIPPED), help="the warm-start file (default: %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=128, help="tokens per corpus answer (default: 128)")
    p.add_argument("--limit", type=int, default=None, help="use only the first N prompts (a quick check)")
    p.add_argument("--spread", type=int, default=None, metavar="N",
                   help="use N prompts spread evenly over the corpus (every category; a slow machine)")
    p.add_argument("--context-free", default=None, type=context_free_count, metavar="N",
                   help="rows no answer writes: the model's guess after the token alone, for every id (all), the N "
                        "lowest ids, or none (0) (default: all)")
    p.add_argument("--model", default=None, help="model (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda when present)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--linear", choices=("auto", "stock"), default="auto",
                   help="CPU linear layers: auto times the products once per model (as the CLI); stock skips that")
    p.add_argument("--library-only", action="store_true",
                   help="keep --out's matrix and calibration; decode the corpus answers again (greedy, "
                        "--max-new-tokens each) and store them as the hybrid's library (about 20 min on 2 CPU cores)")
    p.add_argument("--answers", default=None, metavar="JSON",
                   help="with --library-only: the corpus answers decoded already, a JSON list of [prompt ids, "
                        "answer ids] per prompt in corpus order (as warm.decode_answers gives them)")
    args = p.parse_args(argv)
    import torch
    from tqdm.auto import tqdm

    from tr_core.engine import Engine
    from tr_core.models import load_model

    if args.threads:
        torch.set_num_threads(args.threads)
    prompts = warm.read_corpus(args.corpus)[: args.limit]
    if args.spread:
        prompts = warm.spread(prompts, args.spread)
    model, tokenizer = load_model(args.model, device=args.device)
    engine = Engine(model, tokenizer, tune_kernels=args.linear == "auto")

    if args.library_only:
        return add_library(engine, prompts, args)

    def tick(done: int, total: int) -> None:
        bar.total = total  # the corpus's answers, then the calibration answers (warm.learn)
        bar.update(done - bar.n)

    with tqdm(total=len(prompts), desc="warm start (answers, context-free forwards, calibration answers)") as bar:
        state = warm.learn(engine, prompts, args.max_new_tokens, tick,
                           context_free=args.context_free)
    state.manifest.update(model=args.model or "SmolLM2-135M-Instruct (embedded)", corpus=Path(args.corpus).name,
                          corpus_sha256=warm.file_sha256(args.corpus), corpus_prompts=len(prompts),
                          device=str(engine.device), dtype=str(engine.dtype).replace("torch.", ""),
                          torch=torch.__version__)
    out = Path(args.out)
    warm.save(state, out)
    out.with_suffix(".json").write_text(json.dumps(state.manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    m = state.manifest
    print(f"wrote {out} ({out.stat().st_size:,} bytes): {m['answers']} answers, {m['tokens']:,} tokens in "
          f"{m['steps']:,} steps, {m['rows_filled']:,} rows ({m['rows_context_free']:,} context-free)", file=sys.stderr)
    return 0


def add_library(engine, prompts: list[str], args: argparse.Namespace) -> int:
    """--library-only: the file at --out with the corpus answers as the hybrid's library; returns the exit code."""
    from tqdm.auto import tqdm

    out = Path(args.out)
    state = warm.read(out, engine)
    if args.answers:
        answers = [answer for _, answer in json.loads(Path(args.answers).read_text(encoding="utf-8"))]
    else:
        with tqdm(total=len(prompts), desc="corpus answers for the library") as bar:
            decoded, _ = warm.decode_answers(engine, prompts, args.max_new_tokens, lambda i: bar.update(i - bar.n))
        answers = [answer for _, answer in decoded.values()]
    if len(answers) != state.manifest["answers"]:
        print(f"warning: {len(answers)} answers, but the file was learned on {state.manifest['answers']}",
              file=sys.stderr)
    warm.save(warm.with_library(state, answers), out)
    out.with_suffix(".json").write_text(json.dumps(state.manifest, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"wrote {out} ({out.stat().st_size:,} bytes): library of {state.manifest['library_answers']} answers, "
          f"{state.manifest['library_tokens']:,} tokens", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
