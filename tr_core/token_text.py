"""How one token reads on screen when it is only part of a character.

A byte-level BPE tokenizer (GPT-2, Llama 3, Qwen, SmolLM) splits a Chinese character or an emoji into tokens of
one to three UTF-8 bytes; SentencePiece tokenizers fall back to `<0xE4>` byte tokens. Decoded alone such a token
is U+FFFD, and its vocabulary string is the byte-level alphabet ('ä½' for the bytes e4 bd), which reads as
mojibake. Shown as its bytes in hexadecimal instead, `‹e4bd›`, a label says what the token is (the brackets
cannot be mistaken for a token's own text, as a backslash escape could in code).
"""
from __future__ import annotations

import re
from functools import lru_cache

BYTES_OPEN, BYTES_CLOSE = "‹", "›"  # around the bytes of a split character, in hexadecimal
SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback tokens


@lru_cache(maxsize=1)
def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable Latin-1 stands for itself, every other byte for
    chr(256 + n) (so a space is 'Ġ' and a new line 'Ċ')."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def piece_bytes(piece: str) -> bytes | None:
    """The bytes a vocabulary string stands for: SentencePiece byte tokens and byte-level BPE strings; None for
    anything else."""
    if SP_BYTE.fullmatch(piece):
        return bytes([int(SP_BYTE.fullmatch(piece).group(1), 16)])
    alphabet = byte_level_alphabet()
    if piece and all(c in alphabet for c in piece):
        return bytes(alphabet[c] for c in piece)
    return None


def readable(raw: bytes) -> str:
    """UTF-8 bytes as text: whole characters as themselves, every run of bytes that is no whole character as
    `‹e4bd›`."""
    out = []
    while raw:
        try:
            out.append(raw.decode("utf-8"))
            break
        except UnicodeDecodeError as err:
            out.append(raw[:err.start].decode("utf-8") + BYTES_OPEN + raw[err.start:err.end].hex()
                       + BYTES_CLOSE)
            raw = raw[err.end:]
    return "".join(out).replace(BYTES_CLOSE + BYTES_OPEN, "")


def partial_token_text(piece: str) -> str:
    """A token that decodes to U+FFFD on its own, as text: the characters it holds whole, and the bytes of the
    ones it holds in part as `‹e4bd›` (the vocabulary string itself when it is no byte string)."""
    raw = piece_bytes(piece)
    return piece if raw is None else readable(raw)
