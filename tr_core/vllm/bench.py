"""Benchmark Token Recycling inside vLLM against plain vLLM and vLLM's own speculative methods, on unseen questions.
Each method runs in its own process and vLLM engine, paused (SIGSTOP) while another runs; each cell (a round at
one concurrency) asks `--per-task` unseen questions of each task (the protocol: docs/vllm.md#results). E.g.
`python -m tr_core.vllm.bench --questions bench/data/spec_bench_dev.jsonl --questions bench/data/mbpp_dev.jsonl`."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

METHODS = {
    "plain": None,
    "ngram": {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "suffix": {"method": "suffix"},
    "token-recycling": {"method": "custom_class", "model": "tr_core.vllm.TokenRecyclingProposer"},
    "studio": None,  # the library's Engine, one request at a time (--studio)
}
DONE = "[[bench: cell done]]"  # a worker's line on stdout after each command


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tr_core.vllm.bench", description=__doc__.split("\n")[0])
    p.add_argument("--model", help="a model folder or hub id (default: the embedded model, converted once)")
    p.add_argument("--questions", action="append", required=True, help="a .jsonl question file (repeatable)")
    p.add_argument("--per-task", type=int, default=2, help="questions per task in each cell (default 2)")
    p.add_argument("--skip-per-task", type=int, default=0,
                   help="leave out the first N questions of each task (e.g. those a setting was tuned on)")
    p.add_argument("--max-tokens", type=int, default=96)
    p.add_argument("--draft", type=int, default=6, help="num_speculative_tokens of every speculative method")
    p.add_argument("--methods", nargs="+", default=["plain", "ngram", "token-recycling"],
                   choices=[m for m in METHODS if m != "studio"])
    p.add_argument("--concurrency", nargs="+", type=int, default=[1, 8])
    p.add_argument("--rounds", type=int, default=2, help="rounds, each with unseen questions at every concurrency")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--studio", action="store_true", help="also time the library's engine, one question at a time")
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--worker", choices=list(METHODS), help=argparse.SUPPRESS)  # internal: one method's process
    return p.parse_args(argv)


def cell_prompts(args: argparse.Namespace) -> dict[str, list[list[dict[str, str]]]]:
    """{"round/concurrency": the cell's chat messages}: `per_task` questions of each task, none in two cells."""
    from tr_core.bench.questions import load_questions, select_questions

    cells = [f"{r}/{c}" for r in range(args.rounds) for c in args.concurrency]
    per_file = []
    for path in args.questions:
        wanted = args.per_task * len(cells) + args.skip_per_task
        chosen = select_questions(load_questions(path), per_task=wanted)
        tasks = len({q.task for q in chosen})
        if len(chosen) < wanted * tasks:
            raise SystemExit(f"{path} has too few questions per task for {len(cells)} cells of {args.per_task}"
                             + (f" after {args.skip_per_task}" if args.skip_per_task else ""))
        # the questions come round-robin over tasks: skip the first N of each, then each cell's slice spans them all
        per_file.append((chosen[args.skip_per_task * tasks:], args.per_task * tasks))
    return {cell: [[{"role": "user", "content": q.turns[0]}]
                   for chosen, n in per_file for q in chosen[i * n:(i + 1) * n]] for i, cell in enumerate(cells)}


# -- one method's process --------------------------------------------------------------------------------------------
def vllm_answerer(name: str, args: argparse.Namespace, model: str) -> Callable[[list, int], dict[str, Any]]:
    """The method's vLLM engine (float32, eager, the same limits for all) as a function answering a cell's prompts,
    `concurrency` at a time, greedily: seconds, answers (token ids) and the speculative counters' deltas."""
    from vllm import LLM, SamplingParams

    spec = METHODS[name] and {**METHODS[name], "num_speculative_tokens": args.draft}
    llm = LLM(model=model, dtype=args.dtype, max_model_len=2048, seed=0, enforce_eager=True,
              speculative_config=spec, disable_log_stats=False)
    params = SamplingParams(temperature=0, max_tokens=args.max_tokens)

    def run(prompts: list, concurrency: int) -> dict[str, Any]:
        before, answers, start = spec_counters(llm), [], time.perf_counter()
        for i in range(0, len(prompts), concurrency):
            outputs = llm.chat(prompts[i: i + concurrency], params, use_tqdm=False)
            answers += [list(o.outputs[0].token_ids) for o in outputs]
        seconds, after = time.perf_counter() - start, spec_counters(llm)
        return {"seconds": seconds, "answers": answers, **{k: after[k] - before[k] for k in after}}

    return run


def spec_counters(llm: Any) -> dict[str, float]:
    """vLLM's cumulative speculative-decoding counters of this engine (zeros without speculation)."""
    names = {"vllm:spec_decode_num_drafts": "drafts", "vllm:spec_decode_num_draft_tokens": "drafted",
             "vllm:spec_decode_num_accepted_tokens": "accepted"}
    counts = dict.fromkeys(names.values(), 0.0)
    counts.update({names[metric.name]: float(metric.value) for metric in llm.get_metrics() if metric.name in names})
    return counts


def studio_answerer(name: str | None, model_dir: str, max_tokens: int) -> Callable[[list, int], dict[str, Any]]:
    """The library's Engine (the CPU's default tree, the warm start) as a function answering a cell's prompts one at
    a time, with the same figures as vllm_answerer's."""
    import torch

    from tr_core import DecodeConfig, Engine, StepEvent, SummaryEvent
    from tr_core.models import load_model
    from tr_core.tree import default_template
    from tr_core.warm import warm_start

    engine = Engine(*load_model(model_dir, dtype=torch.float32))
    warm_start(engine, name)  # None: the embedded model's shipped warm start
    cfg = DecodeConfig(max_new_tokens=max_tokens, template=default_template(torch.device("cpu")))

    def run(prompts: list, concurrency: int = 1) -> dict[str, Any]:
        answers, steps, drafted, start = [], 0, 0, time.perf_counter()
        for messages in prompts:
            for event in engine.generate(engine.encode_chat(messages), cfg):
                if isinstance(event, StepEvent):
                    steps, drafted = steps + 1, drafted + len(event.tokens) - 1
                elif isinstance(event, SummaryEvent):
                    answers.append(list(event.tokens))
        seconds = time.perf_counter() - start
        return {"seconds": seconds, "answers": answers, "drafted": float(drafted),
                "accepted": float(sum(map(len, answers)) - steps)}  # each step emits its accepted drafts + 1

    run([[{"role": "user", "content": "Say hello."}]])  # its one-time timing of the matrix products
    return run


def worker(args: argparse.Namespace) -> int:
    """One method's process: build its engine, print DONE, then run each cell ordered on stdin ({"cell", "out"})."""
    from tr_core.models import resolve_source

    model, cells = resolve_source(args.model)[0], cell_prompts(args)
    if args.worker == "studio":
        run = studio_answerer(args.model, model, args.max_tokens)
    else:
        run = vllm_answerer(args.worker, args, model)
    print(DONE, flush=True)
    for line in sys.stdin:
        order = json.loads(line)
        if order.get("quit"):
            break
        result = run(cells[order["cell"]], int(order["cell"].split("/")[1]))  # studio: only "round/1" cells
        Path(order["out"]).write_text(json.dumps(result))
        print(DONE, flush=True)
    return 0


# -- the conductor ---------------------------------------------------------------------------------------------------
class Worker:
    """A method's process, paused (its whole process group) whenever it is not running a cell."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "tr_core.vllm.bench", *argv, "--worker", name],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.wait_done()
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def wait_done(self) -> None:
        for line in self.proc.stdout:  # vLLM may print on stdout too: skip to the marker
            if line.strip() == DONE:
                return
        raise SystemExit(f"the {self.name} worker ended early (exit {self.proc.wait()})")

    def order(self, **order: Any) -> None:
        os.killpg(self.proc.pid, signal.SIGCONT)
        self.proc.stdin.write(json.dumps(order) + "\n")
        self.proc.stdin.flush()

    def run(self, cell: str, out: Path) -> dict[str, Any]:
        try:
            self.order(cell=cell, out=str(out))
            self.wait_done()
        finally:
            os.killpg(self.proc.pid, signal.SIGSTOP)
        return json.loads(out.read_text())

    def close(self) -> None:
        try:
            self.order(quit=True)
            self.proc.stdin.close()
            self.proc.wait(timeout=120)
        except (OSError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)


def measure(args: argparse.Namespace, argv: list[str]) -> dict[str, dict[str, Any]]:
    """Every method on every cell: {method: {cell: result}}, the methods rotating within each round."""
    names = [*args.methods, *(["studio"] if args.studio else [])]
    workers: dict[str, Worker] = {}
    results: dict[str, dict[str, Any]] = {name: {} for name in names}
    try:
        for name in names:  # one at a time: building an engine is heavy
            print(f"[bench] building the {name} engine", file=sys.stderr, flush=True)
            workers[name] = Worker(name, argv)
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                order = names[r % len(names):] + names[: r % len(names)]
                for c in args.concurrency:
                    for name in order:
                        if name == "studio" and c != 1:
                            continue  # the library's engine answers one request at a time
                        cell = f"{r}/{c}"
                        results[name][cell] = workers[name].run(cell, Path(tmp) / f"{name}-{r}-{c}.json")
                        print(f"[bench] round {r + 1} {name} x{c}: {results[name][cell]['seconds']:.1f}s",
                              file=sys.stderr, flush=True)
    finally:
        for w in workers.values():
            w.close()
    return results


def summarise(name: str, concurrency: int, cells: dict[str, Any], plain: dict[str, Any] | None) -> dict[str, Any]:
    """The figures of one (method, concurrency) over its cells (every round)."""
    mine = {cell: out for cell, out in cells.items() if int(cell.split("/")[1]) == concurrency}
    tokens = sum(len(a) for out in mine.values() for a in out["answers"])
    seconds = sum(out["seconds"] for out in mine.values())
    accepted = sum(out["accepted"] for out in mine.values())
    same = None if plain is None else sum(a == b for cell, out in mine.items()
                                          for a, b in zip(out["answers"], plain[cell]["answers"]))
    steps = tokens - accepted  # a step emits its accepted draft tokens and one more
    return {"method": name, "concurrency": concurrency, "tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "per_round": [len(sum(out["answers"], [])) / out["seconds"] for out in mine.values()],
            "drafted": sum(out["drafted"] for out in mine.values()), "accepted": accepted,
            "tokens_per_step": tokens / max(steps, 1), "identical": same,
            "answers": sum(len(out["answers"]) for out in mine.values())}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | concurrency | tok/s | per round | tokens/step | drafted | accepted | identical |",
             "|---|---:|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        same = "" if r.get("identical") is None else f"{r['identical']}/{r['answers']}"
        rounds = ", ".join(f"{v:.1f}" for v in r["per_round"])
        lines.append(f"| {r['method']} | {r['concurrency']} | {r['tok_s']:.1f} | {rounds} "
                     f"| {r['tokens_per_step']:.2f} | {int(r['drafted'])} | {int(r['accepted'])} | {same} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    if args.worker:
        return worker(args)
    cells = cell_prompts(args)  # refuse too few questions before building anything
    results = measure(args, argv)
    rows = [summarise(name, c, done, results.get("plain") if name != "plain" else None)
            for c in args.concurrency for name, done in results.items() if name != "studio" or c == 1]
    print(table(rows))
    if args.out:
        import vllm

        from tr_core.machine import cpu_name
        from tr_core.models import resolve_source

        meta = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "model": resolve_source(args.model)[0],
                "questions_per_cell": len(next(iter(cells.values()))), "max_tokens": args.max_tokens,
                "skip_per_task": args.skip_per_task, "draft": args.draft, "rounds": args.rounds, "dtype": args.dtype,
                "min_reach": os.environ.get("TR_VLLM_MIN_REACH", "default"),
                "machine": f"{cpu_name()}, {os.cpu_count()} cores, vLLM {vllm.__version__}"}
        Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
