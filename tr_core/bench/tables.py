"""Markdown tables of benchmark results: one run's (what `python -m tr_core bench` prints), and the results grid of a
folder of runs (the README's Results tables), read from the JSON files alone.

    python -m tr_core.bench.tables bench/results            # the grid: every <machine>-<T>t-<set>.json, by machine,
                                                            # the forward cost of every profile-<machine>-<T>t.json,
                                                            # a table per <machine>-<T>t-concurrency<N>.json
    python -m tr_core.bench.tables bench/results/xeon-2t-dev.json   # one run: its header, overall and by task
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from .questions import task_sort_key

RUN_NAME = re.compile(r"^(?P<machine>[a-z]+)-(?P<threads>\d+)t-(?P<set>[a-z]+)$")  # epyc-2t-dev
PROFILE_NAME = re.compile(r"^profile-(?P<machine>[a-z]+)-(?P<threads>\d+)t$")  # profile-epyc-2t
CONCURRENCY_NAME = re.compile(r"^(?P<machine>[a-z]+)-(?P<threads>\d+)t-concurrency(?P<rows>\d+)$")  # -concurrency8
QUESTION_SETS = {"dev": "development", "harder": "harder"}
LABELS = {  # the rows of the grid; other methods show their own name
    "recycling[adaptive]": "Token Recycling, `adaptive` (the page's Matrix only)",
    "recycling[hybrid]": "Token Recycling, `hybrid` (the page's Matrix + context; the CPU default)",
    "hf": "transformers `generate`",
    "pld": "prompt lookup decoding (transformers)",
}
AT_ONCE_LABELS = {"vanilla": "plain decoding (the engine)", "hf": "transformers `generate`, left-padded"}
NOISY = ("⚠ noisy: a speedup above what the mean accepted tokens per step allow (more than 1.1 x mean accepted): "
         "the machine's load changed during the run; rerun on a quiet machine.")


def _fmt(x: float | None, spec: str, suffix: str = "") -> str:
    return "n/a" if x is None else f"{x:{spec}}{suffix}"


def _speedup(stats: dict[str, Any]) -> str:
    return _fmt(stats["speedup"], ".2f", "x") + (" ⚠ noisy" if stats.get("plausible") is False else "")


def _cell(stats: dict[str, Any]) -> str:
    """The speedup (mean accepted tokens per step)."""
    return f"{_speedup(stats)} ({_fmt(stats['mean_accepted'], '.2f')})"


def _noisy(methods: list[dict[str, Any]]) -> bool:
    return any(c.get("plausible") is False for m in methods for c in [m, *m.get("per_category", {}).values()])


def format_tables(result: dict[str, Any]) -> str:
    """One run: overall per method, then speedup (mean accepted tokens per step) per task and method."""
    if result.get("concurrency"):
        return concurrency_table(result)
    methods = result["methods"]
    lines = ["| method | mean accepted | tokens/s | speedup | identical to vanilla |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for name, m in methods.items():
        lines.append(f"| {name} | {_fmt(m['mean_accepted'], '.2f')} | {_fmt(m['tokens_per_s'], '.1f')} | "
                     f"{_speedup(m)} | {m['identical']}/{m['compared']} |")
    tasks = sorted({t for m in methods.values() for t in m["per_category"]}, key=task_sort_key)
    lines += ["", "Speedup over vanilla (mean accepted tokens per step) by task:", "",
              "| method | " + " | ".join(tasks) + " | overall |",
              "| --- | " + " | ".join("---:" for _ in tasks) + " | ---: |"]
    for name, m in methods.items():
        cells = [m["per_category"].get(t) for t in tasks] + [m]
        lines.append(f"| {name} | " + " | ".join("" if c is None else _cell(c) for c in cells) + " |")
    return "\n".join(lines + (["", NOISY] if _noisy(list(methods.values())) else []))


def format_header(result: dict[str, Any]) -> str:
    """One paragraph saying what was run where."""
    if result.get("concurrency"):
        learned = (f"first turns, {result['concurrency']} at once ({result['groups']} groups), every answer from the "
                   "session's start")
    else:
        learned = f"matrix {'fresh per question' if result.get('fresh_matrix') else 'kept across questions'}"
    return (f"model {result['model']} · {result['device']} ({result.get('machine', '')}) · {result['dtype']} · "
            f"torch {result['torch']} · transformers {result['transformers']} · {result['date']}\n"
            f"{result['questions']} questions ({result['answers']} answers"
            f"{', %d turns skipped: too long for the model' % len(result['skipped']) if result.get('skipped') else ''})"
            f" · max_new_tokens {result['max_new_tokens']} · temperature {result['temperature']}"
            f" · template {result['template']} · {learned} · torch threads {result.get('threads', '?')}"
            f"{' · fastest of %d repeats per answer' % result['repeats'] if result.get('repeats', 1) > 1 else ''}\n"
            f"command: {result.get('command', '')}" + "".join(f"\nnote: {n}" for n in result.get("notes", [])))


def concurrency_table(result: dict[str, Any]) -> str:
    """A `--concurrency N` run: per method, tokens/s one after another and N at once, their ratios, and the answers
    identical at once and alone."""
    n, methods = result["concurrency"], result["methods"]
    lines = [f"| method | one after another, tokens/s | {n} at once, tokens/s | at once / one after another | "
             "at once / plain decoding at once | answers identical at once and alone |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, m in methods.items():
        alone, batched = m.get("alone") or {}, m["batched"]
        same = f"{batched['identical']}/{batched['compared']}" + ("" if alone else " (to plain decoding's)")
        lines.append(f"| {AT_ONCE_LABELS.get(name) or LABELS.get(name, f'`{name}`')} | "
                     f"{_fmt(alone.get('tokens_per_s'), '.1f')} | {_fmt(batched['tokens_per_s'], '.1f')} | "
                     f"{_fmt(m['batched_over_alone'], '.2f', 'x')} | "
                     f"{_fmt(m['batched_over_plain_batched'], '.2f', 'x')} | {same} |")
    verdict = ("every engine answer identical batched and alone" if result["identical_batched_and_alone"] else
               "⚠ some engine answers differ batched and alone")
    return "\n".join(lines + ["", verdict + "."])


def concurrency_tables(runs: dict[str, dict[str, Any]]) -> str:
    """Each concurrency run as its own table, under a line saying where."""
    out = []
    for name, r in sorted(runs.items()):
        where = CONCURRENCY_NAME.match(name)
        load = r.get("load_average", {}).get("before") or ["?"]
        out.append(f"**{r.get('machine', where['machine'])}, {_threads(where['threads'])}: {r['concurrency']} prompts "
                   f"at once** ({r['answers']} first turns, {r['max_new_tokens']} new tokens, load average {load[0]} "
                   f"before the run, {r['date']})\n\n" + concurrency_table(r))
    return "\n\n".join(out)


def _threads(n: str) -> str:
    return f"{n} thread" + ("" if n == "1" else "s")


def results_grid(runs: dict[str, dict[str, Any]]) -> str:
    """One table per machine, a column per run: plain decoding's tokens/s, each method's speedup (mean accepted tokens
    per step), the answers identical to plain decoding's."""
    named = {n: RUN_NAME.match(n).groupdict() for n in runs}
    out = []
    for machine in sorted({m["machine"] for m in named.values()}):
        names = sorted((n for n in runs if named[n]["machine"] == machine),
                       key=lambda n: (named[n]["set"], int(named[n]["threads"])))
        results = [runs[n] for n in names]
        heads = [f"{QUESTION_SETS.get(named[n]['set'], named[n]['set'])}, {_threads(named[n]['threads'])}"
                 for n in names]
        lines = [f"**{results[0].get('machine', machine)}**", "",
                 "| method | " + " | ".join(heads) + " |", "| --- |" + " ---: |" * len(names),
                 "| plain decoding, tokens/s | "
                 + " | ".join(_fmt(r["methods"].get("vanilla", {}).get("tokens_per_s"), ".1f") for r in results) + " |"]
        for method in dict.fromkeys(m for r in results for m in r["methods"] if m != "vanilla"):
            cells = [_cell(r["methods"][method]) if method in r["methods"] else "" for r in results]
            lines.append(f"| {LABELS.get(method, f'`{method}`')} | " + " | ".join(cells) + " |")
        others = [[m for name, m in r["methods"].items() if name != "vanilla"] for r in results]
        lines.append("| answers identical to plain decoding's | " + " | ".join(
            f"{sum(m['identical'] for m in ms)}/{sum(m['compared'] for m in ms)}" for ms in others) + " |")
        out.append("\n".join(lines + (["", NOISY] if _noisy([m for ms in others for m in ms]) else [])))
    return "\n\n".join(out)


def cost_table(profiles: dict[str, dict[str, Any]]) -> str:
    """The forward cost t(N)/t(1) of every profile, one row each; t(1) as the median and the fastest of the repeats
    (how steady the machine was)."""
    sizes = sorted({int(n) for p in profiles.values() for n in p["curve"] if n != "1"})
    lines = ["| machine, threads | t(1) ms, median (fastest) | " + " | ".join(f"N = {n}" for n in sizes) + " |",
             "| --- | ---: |" + " ---: |" * len(sizes)]
    for name, p in sorted(profiles.items()):
        one, match = p["curve"]["1"], PROFILE_NAME.match(name)
        cells = [_fmt(p["curve"].get(str(n), {}).get("ratio"), ".2f") for n in sizes]
        lines.append(f"| {p.get('machine', match['machine'])}, {_threads(match['threads'])} | "
                     f"{one['ms']:.1f} ({one['min_ms']:.1f}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def folder_tables(folder: Path) -> str:
    """The results grid, the forward-cost table and the concurrency tables of the files in `folder`."""
    def read(pattern: re.Pattern) -> dict[str, dict[str, Any]]:
        return {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("*.json"))
                if pattern.match(p.stem)}

    runs, profiles, at_once = read(RUN_NAME), read(PROFILE_NAME), read(CONCURRENCY_NAME)
    parts = ([results_grid(runs)] if runs else []) + ([cost_table(profiles)] if profiles else []) + (
        [concurrency_tables(at_once)] if at_once else [])
    return "\n\n".join(parts) or (f"{folder}: no <machine>-<T>t-<set>.json, <machine>-<T>t-concurrency<N>.json or "
                                    "profile-<machine>-<T>t.json file")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0].startswith("-"):
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    path = Path(args[0])
    try:
        if path.is_dir():
            print(folder_tables(path))
        else:
            result = json.loads(path.read_text(encoding="utf-8"))
            print(format_header(result) + "\n\n" + format_tables(result))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(f"error: {path}: not a `python -m tr_core bench --json` file or a folder of them ({exc!r})",
              file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
