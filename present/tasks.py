"""Per-task speedups from the project's own benchmark files (bench/results/*.json), beside the paper's ~2x.

    runs = task_runs(Path("bench/results"), machine="AMD EPYC")   # that machine's 2-thread dev + harder files
    fig = task_speedup_figure(task_speedups(runs))   # and caption_of(runs): whose figures they are

The figures are read from the result files as the benchmark wrote them; nothing here is typed in by hand. A task's
speedup over both files is plain decoding's seconds over the method's, summed over the task's answers (their tokens
are the same: every answer of every method equals plain decoding's).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .figure import Figure
from .style import ACCEPTED_COLOUR, REJECTED_TEXT, ROOT_COLOUR

METHODS = (("recycling[adaptive]", "Matrix only (the paper's drafting)", ROOT_COLOUR),
           ("recycling[hybrid]", "Matrix + context", ACCEPTED_COLOUR))
PAPER_SPEEDUP = 2.0  # the paper's headline: about 2x over plain decoding (7B to 70B models, on GPUs)
TASK_NAMES = {"multi-turn conversation": "conversation", "math_reasoning": "math", "qa": "questions",
              "rag": "RAG", "summarization": "summarization", "translation": "translation", "code": "code (MBPP)"}


def task_runs(folder: Path, machine: str = "", threads: int = 2) -> list[dict[str, Any]]:
    """The benchmark files of one machine at `threads` threads (development and harder questions): those whose
    machine name starts like `machine` (its first two words) when any do, else those of the newest machine.
    Unreadable files are skipped: the page shows what it can."""
    runs = []
    paths = sorted(p for kind in ("dev", "harder") for p in Path(folder).glob(f"*-{threads}t-{kind}.json"))
    for path in paths:
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(run, dict) and isinstance(run.get("methods"), dict) and run.get("concurrency") is None \
                and "vanilla" in run["methods"] and run.get("threads") == threads:
            runs.append(run)
    if not runs:
        return []
    key = _cpu_words(machine)
    mine = [r for r in runs if key and _cpu_words(str(r.get("machine", ""))) == key]
    if mine:
        return mine
    newest = max(runs, key=lambda r: str(r.get("date", "")))["machine"]
    return [r for r in runs if r.get("machine") == newest]


def _cpu_words(name: str) -> str:
    """A CPU's first two words, without marks and case: 'Intel(R) Xeon(R) Processor, 2 cores' -> 'intel xeon'."""
    return " ".join(re.sub(r"\((r|tm)\)|[^a-z0-9 ]", " ", name.lower()).split()[:2])


def task_speedups(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Task -> method -> speedup over plain decoding, over all the runs' answers of that task (METHODS only)."""
    seconds: dict[str, dict[str, float]] = {}
    for run in runs:
        for method, stats in run["methods"].items():
            for task, cat in (stats.get("per_category") or {}).items():
                if isinstance(cat, dict) and isinstance(cat.get("seconds"), (int, float)):
                    seconds.setdefault(task, {}).setdefault(method, 0.0)
                    seconds[task][method] += float(cat["seconds"])
    out = {}
    for task, by in seconds.items():
        plain = by.get("vanilla", 0.0)
        shown = {m: plain / by[m] for m, _, _ in METHODS if by.get(m, 0.0) > 0 and plain > 0}
        if shown:
            out[task] = shown
    return out


def caption_of(runs: list[dict[str, Any]]) -> str:
    """What the figures are: the model, machine, threads, answers per task and dates of the runs behind them."""
    if not runs:
        return ""
    answers = sum(int(c.get("answers", 0)) for r in runs for c in (r["methods"]["vanilla"].get("per_category") or {}).values())
    tasks = len({t for r in runs for t in (r["methods"]["vanilla"].get("per_category") or {})})
    dates = sorted({str(r.get("date", ""))[:10] for r in runs})
    return (f"{runs[0].get('model', 'the model')} on {runs[0].get('machine', 'an unnamed machine')}, "
            f"{runs[0].get('threads')} threads, {answers // max(tasks, 1)} answers a task, "
            f"{' and '.join(dates)}; the paper: about {PAPER_SPEEDUP:g}x for 7B-70B models on GPUs")


def task_speedup_figure(speedups: dict[str, dict[str, float]], height: int = 340) -> Figure:
    """Horizontal bars: each task's speedup per drafting, a line at 1 (plain decoding) and a dashed one at the
    paper's ~2x."""
    fig = Figure.empty(height)
    if not speedups:
        return fig.note("No benchmark results were found in bench/results")
    tasks = sorted(speedups, key=lambda t: speedups[t].get(METHODS[-1][0], 0.0))
    names = [TASK_NAMES.get(t, t) for t in tasks]
    for method, label, colour in METHODS:
        values = [speedups[t].get(method) for t in tasks]
        fig.add(type="bar", orientation="h", y=names, x=values, name=label, marker=dict(color=colour),
                text=[f"{v:.2f}×" if v is not None else "" for v in values], textposition="outside",
                hovertemplate=f"{label}<br>%{{y}}: %{{x:.2f}}× plain decoding<extra></extra>")
    top = max(max(v.values()) for v in speedups.values())
    fig.layout["shapes"] = [dict(type="line", x0=x, x1=x, yref="paper", y0=0, y1=1,
                                 line=dict(color=c, dash=d, width=2))
                            for x, c, d in ((1.0, REJECTED_TEXT, "solid"), (PAPER_SPEEDUP, "#b45309", "dash"))]
    fig.layout["annotations"] = [dict(text=f"the paper: ~{PAPER_SPEEDUP:g}×", x=PAPER_SPEEDUP, yref="paper", y=1.0,
                                      yanchor="bottom", showarrow=False, font=dict(size=14, color="#b45309"))]
    fig.layout["xaxis"] = dict(visible=True, range=[0, max(top, PAPER_SPEEDUP) * 1.18], ticksuffix="×",
                               title=dict(text="speedup over plain decoding, same tokens", font=dict(size=12)))
    fig.layout["yaxis"] = dict(visible=True, automargin=True)
    fig.layout["barmode"] = "group"
    fig.layout["legend"] = dict(orientation="h", yanchor="bottom", y=1.06, x=0.0, traceorder="reversed")
    fig.layout["margin"] = dict(l=10, r=10, t=50, b=50)
    return fig
