"""How one token reads on screen when it is only part of a character: decoded alone it is U+FFFD and its
vocabulary string mojibake ('ä½'), so it is shown as its bytes in hexadecimal, `‹e4bd›`."""
from __future__ import annotations

import re
from functools import lru_cache

BYTES_OPEN, BYTES_CLOSE = "‹", "›"  # around the bytes of a split character, in hexadecimal
SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback tokens


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, char -> byte: printable Latin-1 as itself, others chr(256 + n) (' ' is 'Ġ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + n): b for n, b in enumerate(others)}}


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a SentencePiece byte token or byte-level BPE string stands for; None for anything else."""
    if match := SP_BYTE.fullmatch(piece):
        return bytes([int(match.group(1), 16)])
    alphabet = byte_level_alphabet()
    return bytes(alphabet[c] for c in piece) if piece and all(c in alphabet for c in piece) else None


def readable(raw: bytes) -> str:
    """UTF-8 bytes as text: whole characters as themselves, runs of partial ones as `‹e4bd›`."""
    out = []
    while raw:
        try:
            out.append(raw.decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            out.append(raw[:err.start].decode("utf-8") + BYTES_OPEN + raw[err.start:err.end].hex() + BYTES_CLOSE)
            raw = raw[err.end:]
    return "".join(out).replace(BYTES_CLOSE + BYTES_OPEN, "")


def partial_token_text(piece: str) -> str:
    """A token that decodes alone to U+FFFD, as readable text (the vocabulary string itself if no byte string)."""
    raw = piece_bytes(piece)
    return piece if raw is None else readable(raw)
