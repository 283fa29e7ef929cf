"""The context index: every token the conversation has seen, searchable for what followed the current suffix (runs
an answer copies from its prompt, an earlier turn or itself). Per n-gram length a hash chain, as LZ77 compressors
keep: an append is O(max_n), a lookup walks at most `chain` links per length; past `max_tokens` the older half goes."""
from __future__ import annotations

import bisect
from dataclasses import dataclass

MAX_TOKENS = 32_768  # stated memory limit of the index, in tokens (the oldest half is evicted past it)
MAX_N = 4  # longest n-gram indexed; matches are then extended backwards up to MAX_MATCH
MAX_MATCH = 16  # longest match length measured (a longer match scores like this one)
# Where a token came from (a segment's code; present/reasons.py words it): an unlabelled stream, this conversation's
# prompt and answer, a Library's answers (the warm start's, tr_core.warm); an earlier conversation's (same session)
CONTEXT, PROMPT, ANSWER, LIBRARY = "context", "prompt", "answer", "warm_start"
EARLIER_PROMPT, EARLIER_ANSWER = "earlier_prompt", "earlier_answer"
PLACES = (CONTEXT, PROMPT, ANSWER, EARLIER_PROMPT, EARLIER_ANSWER, LIBRARY)


@dataclass
class Segment:
    """A run of the stream with one origin."""
    where: str  # one of PLACES
    start: int  # global position of its first kept token (positions count every token ever added)
    length: int = 0  # tokens kept
    skipped: int = 0  # tokens of its start that were evicted (offsets still count them)


@dataclass(frozen=True)
class Match:
    """A continuation found in the context: the tokens that followed an earlier occurrence of the current suffix."""
    tokens: tuple[int, ...]  # the continuation (up to the asked length)
    match_len: int  # how many tokens of the current context matched there (<= MAX_MATCH)
    position: int  # global position of the continuation's first token
    where: str  # its segment's code (PLACES)
    offset: int  # the continuation's first token within its segment (0-based)
    contested: bool = False  # earlier occurrences of the matched n-gram were followed by different tokens

    def origin(self, used: int) -> dict[str, int | str]:
        """Where the continuation's `used`-th token was copied from (StepEvent.origins): its segment's code, the
        offsets there of the run's first token and of this one, and the match's length."""
        return {"where": self.where, "first": self.offset, "last": self.offset + max(used, 1) - 1,
                "match": self.match_len}


class ContextIndex:
    """Token stream + n-gram hash chains; plain Python data a test can inspect."""

    def __init__(self, max_tokens: int = MAX_TOKENS, max_n: int = MAX_N, chain: int = 8) -> None:
        if max_tokens < 16 or max_n < 1 or chain < 1:
            raise ValueError("need max_tokens >= 16, max_n >= 1, chain >= 1")
        self.max_tokens, self.max_n, self.chain = max_tokens, max_n, chain
        self.clear()

    def clear(self) -> None:
        self.base = 0  # global position of stream[0] (grows as old tokens are evicted)
        self.stream: list[int] = []
        self.head: list[dict[tuple[int, ...], int]] = [{} for _ in range(self.max_n + 1)]  # [n][gram] -> end pos
        self.prev: list[list[int]] = [[] for _ in range(self.max_n + 1)]  # [n][i - base] -> previous end pos or -1
        self.segments: list[Segment] = []

    def __len__(self) -> int:
        return len(self.stream)

    def start_segment(self, where: str) -> None:
        """Following tokens come from `where` (empty segments are dropped)."""
        if self.segments and self.segments[-1].length == 0:
            self.segments.pop()
        self.segments.append(Segment(where, self.base + len(self.stream)))

    def relabel(self, old: str, new: str) -> None:
        """Recode every segment from `old` (e.g. ANSWER -> EARLIER_ANSWER when a new answer begins)."""
        for seg in self.segments:
            if seg.where == old:
                seg.where = new

    def extend(self, tokens: list[int]) -> None:
        """Append tokens to the current segment: O(max_n) each."""
        if not self.segments:
            self.start_segment(CONTEXT)
        for token in tokens:
            self._append(int(token))
        self.segments[-1].length += len(tokens)
        if len(self.stream) > self.max_tokens:
            self._evict()

    def _append(self, token: int) -> None:
        self.stream.append(token)
        end = len(self.stream)  # local index of the new token + 1
        pos = self.base + end - 1
        for n in range(1, self.max_n + 1):
            if end < n:
                self.prev[n].append(-1)
                continue
            gram = tuple(self.stream[end - n : end])
            self.prev[n].append(self.head[n].get(gram, -1))
            self.head[n][gram] = pos

    def _evict(self) -> None:
        """Keep the newest half of the stream and re-index it."""
        keep = self.stream[len(self.stream) // 2 :]
        new_base = self.base + len(self.stream) - len(keep)
        segments = [s for s in self.segments if s.start + s.length > new_base]
        self.base, self.stream = new_base, []
        self.head = [{} for _ in range(self.max_n + 1)]
        self.prev = [[] for _ in range(self.max_n + 1)]
        for token in keep:
            self._append(token)
        if segments and segments[0].start < new_base:
            old, cut = segments[0], new_base - segments[0].start
            segments[0] = Segment(old.where, new_base, old.length - cut, old.skipped + cut)
        self.segments = segments

    def lookup(self, max_matches: int = 3, max_len: int = 16) -> list[Match]:
        """Continuations of the stream's own suffix, best first (longest matched n-gram, then most recent), one per
        distinct first token; `contested` when the n-gram was followed by different tokens before (a common word)."""
        return self._search(self.stream, max_matches, max_len, set(), 1)

    def _search(self, suffix: list[int], max_matches: int, max_len: int, skip: set[int], min_n: int) -> list[Match]:
        """`lookup` of `suffix`'s continuations, matched on at least `min_n` tokens, none starting with a `skip`."""
        found: list[Match] = []
        for n in range(min(self.max_n, len(suffix)), min_n - 1, -1):
            ends = [(local, self._room(local)) for local in self._occurrences(tuple(suffix[len(suffix) - n:]))]
            ends = [(local, room) for local, room in ends if room > 0]
            contested = len({self.stream[local + 1] for local, _ in ends}) > 1
            for local, room in ends:
                first = self.stream[local + 1]
                if len(found) < max_matches and first not in skip:
                    skip = skip | {first}
                    found.append(self._match(local, n, min(max_len, room), contested, suffix))
            if len(found) >= max_matches:
                break
        return found

    def _room(self, local: int) -> int:
        """The most tokens a continuation of an n-gram ending at `local` may take."""
        return len(self.stream) - (local + 1)

    def _occurrences(self, gram: tuple[int, ...]) -> list[int]:
        """Local indices where `gram` ended before the stream's end, newest first, at most `chain` of them."""
        n, size = len(gram), len(self.stream)
        pos, links, ends = self.head[n].get(gram, -1), 0, []
        while pos >= self.base and links < self.chain:
            local = pos - self.base
            if local + 1 < size:
                ends.append(local)
            pos, links = self.prev[n][local], links + 1
        return ends

    def _match(self, local: int, n: int, max_len: int, contested: bool, suffix: list[int]) -> Match:
        """The match ending at `local` (its last n tokens agree with `suffix`'s), extended backwards."""
        size, length = len(suffix), n
        while length < MAX_MATCH and local - length >= 0 and size - 1 - length >= 0 \
                and self.stream[local - length] == suffix[size - 1 - length]:
            length += 1
        start, pos = local + 1, self.base + local + 1
        seg = next((seg for seg in reversed(self.segments) if seg.start <= pos), None)  # offsets count evicted tokens
        where, offset = (seg.where, pos - seg.start + seg.skipped) if seg else (CONTEXT, pos)
        return Match(tuple(self.stream[start : start + max_len]), length, pos, where, offset, contested)

    def snapshot(self) -> dict:
        """Plain data for tests and display: the stream, its segments and the index sizes."""
        return {"base": self.base, "stream": list(self.stream),
                "segments": [(s.where, s.start, s.length, s.skipped) for s in self.segments],
                "grams": [len(h) for h in self.head[1:]]}


class Library(ContextIndex):
    """A fixed set of answers to copy runs from (the warm start's, tr_core.warm), each a LIBRARY segment; a
    continuation never runs past its answer's end. Never changed once built, so drafter copies share it."""

    def __init__(self, answers: list[list[int]]) -> None:
        super().__init__(max_tokens=max(sum(map(len, answers)), 16))
        self.ends: list[int] = []  # local index one past each answer's last token
        for answer in answers:
            if answer:
                self.start_segment(LIBRARY)
                self.extend(list(answer))
                self.ends.append(len(self.stream))
        self.answers = len(self.ends)

    def __deepcopy__(self, memo: dict) -> "Library":
        return self

    def continuations(self, suffix: list[int], max_matches: int, max_len: int, skip: set[int],
                      min_n: int = 2) -> list[Match]:
        """Continuations of `suffix` (the conversation's last tokens) in the library, as `lookup`'s, matched on at
        least `min_n` tokens (a 1-token match in other answers is right too rarely), none starting with a token in
        `skip` (found already), each cut at its answer's end."""
        return self._search(suffix, max_matches, max_len, skip, min_n)

    def _room(self, local: int) -> int:
        return self.ends[bisect.bisect_right(self.ends, local)] - (local + 1)
