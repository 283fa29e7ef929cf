"""The adjacency matrix (paper Sec. 3.1): row t holds the top-k next-token candidates last seen after token t."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import torch

from .reduce import log_normalizer, top_rows

_FORMAT = "token-recycling-adjacency-matrix/1"


class AdjacencyMatrix:
    """[V, k] candidate tokens with their probabilities; starts empty, learns online, persists across turns."""
    TENSORS = ("table", "probs", "filled", "stamps")  # everything it has learned

    def __init__(self, vocab_size: int, k: int = 8, device: torch.device | str = "cpu"):
        if vocab_size < 2 or k < 1:
            raise ValueError(f"need vocab_size >= 2 and k >= 1, got {vocab_size}, {k}")
        if k > vocab_size:
            raise ValueError(f"k = {k} candidates per row cannot exceed the vocabulary ({vocab_size})")
        self.vocab_size, self.k, self.device = vocab_size, k, torch.device(device)
        self.table = torch.zeros(vocab_size, k, dtype=torch.int32, device=self.device)  # [V, k] candidate ids
        # [V, k] each candidate's probability when written, in 1/255 steps (uint8: a quarter of fp32's memory)
        self.probs = torch.zeros(vocab_size, k, dtype=torch.uint8, device=self.device)
        self.filled = torch.zeros(vocab_size, dtype=torch.bool, device=self.device)  # [V] row written at least once
        # [V] when each row was last written, on Engine.clock; -1 = never, or before a load (provenance for teaching)
        self.stamps = torch.full((vocab_size,), -1, dtype=torch.int32, device=self.device)

    def update(self, tokens: torch.Tensor, logits: torch.Tensor, top: tuple[torch.Tensor, torch.Tensor] | None = None,
               consume: bool = False, stamp: int = -1,
               path: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Overwrite each tree token's row with the top-k of its node's logits [N, V] (Sec. 3.3); tokens [N]. `top`:
        (values, ids) [N, k] if known; consume=True: logits are scratch. A repeated token takes its deepest node's row
        on the accepted path (`path` [N] bool), else its first node's. Returns (first nodes [N] bool, ids, probs)."""
        if logits.shape[-1] < self.vocab_size:
            raise ValueError(f"logits have {logits.shape[-1]} entries but the matrix has {self.vocab_size} rows")
        logits = logits[..., : self.vocab_size]
        top_logits, top_ids = top if top is not None else top_rows(logits, self.k)[1:]  # [N, k]
        top_logits = top_logits.float()
        scratch = consume or logits.dtype != torch.float32  # .float() of other dtypes is a fresh copy anyway
        top_probs = (top_logits - log_normalizer(logits.float(), top_logits[:, :1], overwrite=scratch)).exp()
        if tokens.shape[0] == 1:  # one node (a plain or zero-draft step): nothing to deduplicate
            is_first = torch.ones(1, dtype=torch.bool, device=tokens.device)
        else:
            same = tokens[:, None] == tokens[None, :]  # [N, N]
            if path is None:
                first = same.int().argmax(dim=1)  # index of the first node with the same token
            else:  # the same token's deepest node on the accepted path, else its first node
                n = tokens.shape[0]
                index = torch.arange(n, device=tokens.device)  # a path's nodes come in depth order
                order = torch.where(path.bool(), n - 1 - index, n + index)
                first = index[torch.where(same, order[None, :], 2 * n).argmin(dim=1)]
            top_ids, top_probs = top_ids[first], top_probs[first]
            is_first = first == torch.arange(tokens.shape[0], device=tokens.device)
        self.table[tokens] = top_ids.to(torch.int32)
        self.probs[tokens] = (top_probs * 255).round_().to(torch.uint8)
        self.filled[tokens] = True
        self.stamps[tokens] = stamp
        return is_first, top_ids, top_probs

    def seed_from_text(self, ids: list[int], prob: float = 0.5, stamp: int = -1) -> int:
        """Put each token's successor in `ids` first in its row (last occurrence wins); returns rows changed."""
        succ: dict[int, int] = {}
        for a, b in zip(ids, ids[1:]):
            if 0 <= a < self.vocab_size and 0 <= b < self.vocab_size:
                succ[a] = b
        if not succ:
            return 0
        rows = torch.tensor(list(succ), dtype=torch.long, device=self.device)
        new = torch.tensor(list(succ.values()), dtype=torch.int32, device=self.device)
        old_ids, old_probs = self.table[rows], self.probs[rows]  # [R, k]
        keep = old_ids != new[:, None]
        keep &= self.filled[rows][:, None]
        # stable order: kept old candidates after the seeded one, dropped ones last
        order = torch.argsort((~keep).int(), dim=1, stable=True)
        shifted_ids = torch.gather(old_ids, 1, order)
        shifted_probs = torch.gather((old_probs.float() * keep * (1 - prob)).round_(), 1, order)
        self.table[rows] = torch.cat([new[:, None], shifted_ids[:, : self.k - 1]], dim=1)
        self.probs[rows] = torch.cat([torch.full_like(new[:, None], round(prob * 255)).to(torch.uint8),
                                      shifted_probs[:, : self.k - 1].to(torch.uint8)], dim=1)
        self.filled[rows] = True
        self.stamps[rows] = stamp
        return len(succ)

    def origins(self, tokens: torch.Tensor, parents: torch.Tensor,
                ranks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Before this step's update: each node's parent-row stamp [N] int32 and candidate probability [N] float.
        Ranks past the row (context copies) read column k - 1; callers ignore it."""
        rows = tokens[parents]
        return self.stamps[rows], self.probs[rows, ranks.clamp(0, self.k - 1)].float() / 255

    @property
    def rows_filled(self) -> int:
        """How many rows hold learned candidates (one host sync)."""
        return int(self.filled.sum())

    @property
    def size_mb(self) -> float:
        """Memory of all the matrix's tensors in MB."""
        return sum(t.numel() * t.element_size() for t in map(self.__getattribute__, self.TENSORS)) / 1e6

    def get_probs(self) -> torch.Tensor:
        return self.probs.float() / 255

    def clone(self) -> "AdjacencyMatrix":
        """An independent copy (same rows, own memory)."""
        twin = AdjacencyMatrix.__new__(AdjacencyMatrix)
        twin.vocab_size, twin.k, twin.device = self.vocab_size, self.k, self.device
        for name in self.TENSORS:
            setattr(twin, name, getattr(self, name).clone())
        return twin

    def copy_from(self, other: "AdjacencyMatrix") -> None:
        """Take `other`'s rows (same vocabulary and k) into this matrix's own tensors."""
        for name in self.TENSORS:
            getattr(self, name).copy_(getattr(other, name))

    def reset(self) -> None:
        for name in self.TENSORS:
            getattr(self, name).fill_(-1 if name == "stamps" else 0)

    def save(self, path: str | os.PathLike) -> None:
        """Write the matrix atomically (torch format); OSError when it cannot, leaving no file behind."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        try:
            torch.save({"format": _FORMAT, "vocab_size": self.vocab_size, "k": self.k, "table": self.table.cpu(),
                        "probs": self.probs.cpu(), "filled": self.filled.cpu()}, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as exc:  # torch.save reports a missing folder as a RuntimeError
            tmp.unlink(missing_ok=True)
            raise exc if isinstance(exc, OSError) else OSError(f"cannot write {path}: {exc}") from exc

    def load(self, path: str | os.PathLike) -> None:
        """Read a matrix saved by `save`; a bad or mismatched file raises ValueError and changes nothing."""
        table, probs, filled = read_saved(path, self.vocab_size, self.k)
        self.table.copy_(table.to(self.device, torch.int32))
        self.probs.copy_(probs.to(self.device, self.probs.dtype))
        self.filled.copy_(filled.to(self.device, torch.bool))
        self.stamps.fill_(-1)  # the file's rows were written on another clock


def _check_archive(path: Path, vocab_size: int, k: int) -> None:
    """Refuse a non-zip file or a zip bomb before torch reads a byte of it."""
    try:
        with zipfile.ZipFile(path) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise ValueError(f"{path} is not a saved adjacency matrix (not a file written by torch.save)") from exc
    if unpacked > vocab_size * k * (8 + 1) + vocab_size + (1 << 20):  # int64 ids at most, plus 1 MiB of records
        raise ValueError(f"{path} unpacks to {unpacked:,} bytes, more than a matrix of this model can hold")


def read_saved(path: str | os.PathLike, vocab_size: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(table [V, k], probs [V, k], filled [V]) of a file from `AdjacencyMatrix.save`; ValueError for anything else."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"matrix file not found: {path}")
    _check_archive(path, vocab_size, k)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ValueError(f"{path} is not a saved adjacency matrix ({type(exc).__name__})") from exc
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ValueError(f"{path} is not a saved adjacency matrix (format {_FORMAT!r} expected)")
    if data.get("vocab_size") != vocab_size or data.get("k") != k:
        raise ValueError(f"{path} holds a matrix for vocabulary {data.get('vocab_size')} with k = {data.get('k')}, "
                         f"but this model needs vocabulary {vocab_size} with k = {k}")
    table, probs, filled = data.get("table"), data.get("probs"), data.get("filled")
    if not all(isinstance(t, torch.Tensor) for t in (table, probs, filled)):
        raise ValueError(f"{path}: the table, probs and filled tensors are missing")
    if table.shape != (vocab_size, k) or probs.shape != (vocab_size, k) or filled.shape != (vocab_size,):
        raise ValueError(f"{path}: tensors have the wrong shapes")
    integer = table.dtype in (torch.int32, torch.int64, torch.int16)
    if not integer or probs.dtype != torch.uint8 or filled.dtype != torch.bool:
        raise ValueError(f"{path}: tensors have the wrong types (integer ids, uint8 probabilities, bool rows expected)")
    if table.numel() and (int(table.min()) < 0 or int(table.max()) >= vocab_size):
        raise ValueError(f"{path}: candidate ids outside the vocabulary")
    return table, probs, filled
