"""How a token that is part of a character reads (tr_core.token_text): its bytes, never mojibake or U+FFFD."""
from __future__ import annotations

from tr_core.token_text import byte_level_alphabet, partial_token_text, piece_bytes, readable


def test_the_byte_level_alphabet_covers_every_byte_once():
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256)) and len(alphabet) == 256
    assert alphabet["Ġ"] == ord(" ") and alphabet["Ċ"] == ord("\n") and alphabet["a"] == ord("a")


def test_a_vocabulary_string_reads_as_the_bytes_it_stands_for():
    assert piece_bytes("ä½") == "你".encode()[:2] and piece_bytes("ĠðŁĺ") == b" " + "😀".encode()[:3]
    assert piece_bytes("<0xE4>") == b"\xe4" and piece_bytes("<0x0A>") == b"\n"  # SentencePiece byte fallback
    assert piece_bytes("▁word") is None and piece_bytes("") is None  # not a byte string: shown as it is
    assert partial_token_text("ä½") == "‹e4bd›" and partial_token_text("ĠðŁĺ") == " ‹f09f98›"
    assert partial_token_text("<0xE4>") == "‹e4›" and partial_token_text("▁word") == "▁word"


def test_whole_characters_stay_text_and_each_broken_run_becomes_one_bracket():
    assert readable("naïve 你".encode()) == "naïve 你"
    assert readable(b"ab\xe4\xbd\xa0cd\xf0") == "ab你cd‹f0›"
    assert readable(b"\xbd\xa0x\x80") == "‹bda0›x‹80›"  # continuation bytes without a lead byte
    assert readable(b"") == ""
