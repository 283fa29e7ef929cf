"""Plain-data events yielded by the engine, for the UI, the benchmark and the tests: ints, floats, strings, None and
lists/dicts of those (no tensors), so an event round-trips through JSON (`to_dict`, `event_from_dict`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

EVENT_DIGITS = 4  # probabilities in events are rounded to 4 digits (the matrix itself stores 1/255 steps)


@dataclass
class StepEvent:
    """One decoding step: draft tree -> one forward -> verify -> commit KV -> update the adjacency matrix."""

    step: int  # 0-based index of this step in the answer
    position: int  # absolute position of the root token (= committed context length before the step)
    tokens: list[int]  # token id at every tree node; node 0 is the root (the last committed token)
    parents: list[int]  # parent node index of every node (-1 for the root)
    depths: list[int]  # depth of every node (0 for the root)
    ranks: list[int]  # candidate rank of every node in its parent's matrix row (-1 for the root)
    accepted: list[int]  # node indices of the accepted path, root first
    emitted: list[int]  # token ids emitted by this step: accepted draft tokens, then the bonus token
    bonus: int | None  # the bonus token (the model's own choice after the accepted path); None if cut by a stop
    timings: dict[str, float]  # milliseconds: draft, forward, verify, commit, update, total
    matrix_rows: list[int] = field(default_factory=list)  # rows of the adjacency matrix rewritten by this step
    matrix_values: list[list[int]] = field(default_factory=list)  # their new candidate tokens, [len(rows), k]
    matrix_probs: list[list[float]] = field(default_factory=list)  # their probabilities as stored (1/255 steps)
    node_probs: list[float] | None = None  # estimated probability of reaching each node (adaptive trees), else None
    template: str = ""  # the draft tree template used for this step
    sources: list[str] | None = None  # per node, "root", "matrix", "context" or "both"; None: all from the matrix
    # per copied node, {"where": tr_core.context.PLACES, "first"/"last": offsets there of its run's first token and
    # of it, "match": tokens matched}; None for the other nodes (None as `sources` is)
    origins: list[dict[str, Any] | None] | None = None
    answer: int = 0  # which answer of the engine this is (0 = its first): the reference for `written`
    # per node (DecodeConfig.provenance, else None): [answer, step] whose logits wrote it into its parent's row (step
    # -1: that answer's prompt seeding; [-1, -1]: the root, a copy, or unknown)
    written: list[list[int]] | None = None
    candidate_probs: list[float] | None = None  # per node, the probability the candidate had when written
    # With DecodeConfig.provenance (else empty), the rows the draft read (its matrix nodes' parents' tokens, in
    # parent order, each once) and the rows rewritten but not read, each as it was before this step
    rows_read: list[int] = field(default_factory=list)  # the rows read, [R]
    rows_read_values: list[list[int]] = field(default_factory=list)  # their candidate tokens, [R, k]
    rows_read_probs: list[list[float]] = field(default_factory=list)  # their stored probabilities, [R, k]
    rows_before: list[int] = field(default_factory=list)  # [W], none of them in rows_read, all in matrix_rows
    rows_before_values: list[list[int]] = field(default_factory=list)  # [W, k]
    rows_before_probs: list[list[float]] = field(default_factory=list)  # [W, k]
    choices: list[int] = field(default_factory=list)  # the model's own choice after every node, [N]; [] if unknown
    # Why a drafter that could draft verified the root alone: {"why": "first step" | "empty row" | "cost", "drafts",
    # "gain" (expected accepted drafts), "cost_ratio" (over a one-token step) of the best tree, "context"}; else None
    no_draft: dict[str, Any] | None = None
    # The tree it would have drafted, NOT verified: {"tokens", "parents" (root -1), "expected" (per node, estimated
    # probability of acceptance; root 1)}; None when there was none
    unverified: dict[str, list] | None = None
    kind: str = "step"

    to_dict = asdict  # the event as a JSON-ready dict

    def rows_before_step(self) -> list[tuple[int, list[int], list[float] | None, bool]]:
        """(row, candidates, stored probabilities or None, read by the draft) of every row the event knows as it was
        before the step: the rows read, then those written unread."""
        known = ((self.rows_read, self.rows_read_values, self.rows_read_probs, True),
                 (self.rows_before, self.rows_before_values, self.rows_before_probs, False))
        return [(row, list(values[j]) if j < len(values) else [], probs[j] if j < len(probs) else None, read)
                for rows, values, probs, read in known for j, row in enumerate(rows)]


@dataclass
class SummaryEvent:
    """The end of one answer: what was produced, how fast, and why it stopped."""

    tokens: list[int]  # every emitted token id, in order
    prompt_tokens: int  # length of the prompt in tokens
    new_tokens: int  # len(tokens)
    steps: int  # decoding steps (model forwards after the prompt's; the first step may reuse that one)
    mean_accepted: float  # new_tokens / steps: tokens per step, bonus included (1.0 for plain decoding)
    tokens_per_s: float  # new_tokens / decode_s
    prefill_s: float  # seconds spent on the prompt's forward (and the first step's draft)
    decode_s: float  # seconds spent in decoding steps
    wall_s: float  # prefill_s + decode_s
    stop_reason: str  # "eos", "length" or "stopped" (the consumer closed the generator early)
    method: str  # "recycling" or "plain"
    template: str  # the draft tree template ("" for plain decoding)
    matrix_rows_filled: int  # rows of the adjacency matrix that hold candidates
    matrix_mb: float  # memory of the adjacency matrix in MB
    overhead_ms: float = 0.0  # mean engine time per step outside the model forward (draft+verify+commit+update)
    forward_ms: float = 0.0  # mean model forward time per step
    kind: str = "summary"

    to_dict = asdict  # the event as a JSON-ready dict


Event = StepEvent | SummaryEvent


def event_from_dict(data: dict[str, Any]) -> Event:
    """Rebuild an event from `to_dict()` output; raises ValueError on an unknown kind or missing fields."""
    kind = data.get("kind")
    cls = {"step": StepEvent, "summary": SummaryEvent}.get(kind)
    if cls is None:
        raise ValueError(f"unknown event kind {kind!r}")
    names = {f.name for f in fields(cls)}
    try:
        return cls(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        raise ValueError(f"malformed {kind} event: {exc}") from exc
