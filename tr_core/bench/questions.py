"""Question files, Spec-Bench style: one JSON object per line with `question_id`, `category` and `turns` (the user
messages). Results are grouped by Spec-Bench's six tasks (MT-bench's eight categories form "multi-turn
conversation") plus "code" for MBPP."""
from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

MT_BENCH_CATEGORIES = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                 "humanities"})
MULTI_TURN = "multi-turn conversation"
# the order of tables and reports
TASK_ORDER = (MULTI_TURN, "translation", "summarization", "qa", "math_reasoning", "rag", "code")


class QuestionFileError(ValueError):
    """A question file that cannot be used; the message names the file and, where known, the line."""

    def __init__(self, path: str | Path, message: str, line: int | None = None) -> None:
        self.path = str(path)
        self.line = line
        where = f"{self.path}:{line}" if line is not None else self.path
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Question:
    question_id: int | str  # as written in the file
    category: str  # e.g. "writing", "translation", "code"
    turns: tuple[str, ...]  # user messages, answered in order
    source: str  # the file it came from
    line: int  # 1-based

    @property
    def task(self) -> str:
        return task_of(self.category)

    @property
    def key(self) -> str:
        """A unique name across files: `file-stem/question_id`."""
        return f"{Path(self.source).stem}/{self.question_id}"


def task_of(category: str) -> str:
    """A category's Spec-Bench task, in lower case."""
    name = category.strip().lower()
    return MULTI_TURN if name in MT_BENCH_CATEGORIES else name


def task_sort_key(task: str) -> tuple[int, str]:
    """The known tasks in `TASK_ORDER`, any others after them, alphabetically."""
    return (TASK_ORDER.index(task), "") if task in TASK_ORDER else (len(TASK_ORDER), task)


def parse_question_line(text: str, path: str | Path, line: int) -> Question:
    """One JSON line as a Question; raises QuestionFileError naming `path:line`."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise QuestionFileError(path, f"not valid JSON ({exc.msg} at column {exc.colno})", line) from None
    if not isinstance(data, dict):
        raise QuestionFileError(path, f"expected a JSON object, got {type(data).__name__}", line)
    for name in ("question_id", "category", "turns"):
        if name not in data:
            raise QuestionFileError(path, f"missing '{name}'", line)
    qid = data["question_id"]
    if isinstance(qid, bool) or not isinstance(qid, (int, str)):
        raise QuestionFileError(path, f"'question_id' must be an int or a string, got {qid!r}", line)
    category = data["category"]
    if not isinstance(category, str) or not category.strip():
        raise QuestionFileError(path, f"'category' must be a non-empty string, got {category!r}", line)
    turns = data["turns"]
    if not isinstance(turns, list) or not turns:
        raise QuestionFileError(path, "'turns' must be a non-empty list of strings", line)
    for i, turn in enumerate(turns):
        if not isinstance(turn, str) or not turn.strip():
            raise QuestionFileError(path, f"'turns'[{i}] must be a non-empty string", line)
    return Question(qid, category, tuple(turns), str(path), line)


def load_questions(path: str | Path) -> list[Question]:
    """Read a question file (JSON lines; blank lines skipped); raises QuestionFileError on any problem."""
    path = Path(path)
    if not path.exists():
        raise QuestionFileError(path, "no such file")
    if not path.is_file():
        raise QuestionFileError(path, "not a file")
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte-order mark (Windows editors) is not part of line 1
    except (OSError, UnicodeDecodeError) as exc:
        raise QuestionFileError(path, f"cannot read: {exc}") from None
    questions: list[Question] = []
    seen: dict[object, int] = {}
    # JSON lines end at "\n" only (splitlines() would also cut at U+2028 and others that JSON strings may hold raw)
    for number, raw in enumerate(text.replace("\r\n", "\n").split("\n"), start=1):
        if not raw.strip():
            continue
        question = parse_question_line(raw, path, number)
        if (first := seen.setdefault(question.question_id, number)) != number:
            raise QuestionFileError(path, f"duplicate question_id {question.question_id!r} (first on line {first})",
                                    number)
        questions.append(question)
    if not questions:
        raise QuestionFileError(path, "no questions in file")
    return questions


def select_questions(questions: list[Question], per_task: int | None = None,
                     limit: int | None = None) -> list[Question]:
    """The first `per_task` of each task, then the first `limit`: round-robin over a task's categories (writing,
    roleplay, ... rather than four writing questions), then over tasks, so that `limit` still spans the tasks."""
    if per_task is not None and per_task < 1:
        raise ValueError(f"per_task must be >= 1, got {per_task}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    chosen = list(questions)
    if per_task is not None:
        by_task = group_by(chosen, lambda q: q.task)
        chosen = round_robin([interleave_categories(by_task[t]) for t in sorted(by_task, key=task_sort_key)], per_task)
    if limit is not None:
        chosen = chosen[:limit]
    return chosen


def group_by(items: Iterable[T], key: Callable[[T], Hashable]) -> dict[Hashable, list[T]]:
    """Items grouped by `key`, in order of first appearance."""
    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return groups


def round_robin(groups: Iterable[list[T]], per_group: int | None = None) -> list[T]:
    """One item of each group in turn (first items, then second items, ...), at most `per_group` of each."""
    lists = [g[:per_group] if per_group is not None else g for g in groups]
    return [lst[i] for i in range(max(map(len, lists), default=0)) for lst in lists if i < len(lst)]


def interleave_categories(questions: Iterable[Question]) -> list[Question]:
    """Round-robin over categories, in file order."""
    return round_robin(group_by(questions, lambda q: q.category).values())
