"""Streaming text: whole characters, stop strings held back and cut."""

from __future__ import annotations

from localspec.common.textstream import TextAssembler


def byte_tokens(text: str) -> list[int]:
    return list(text.encode())


def assembler(stops: tuple[str, ...] = ()) -> TextAssembler:
    return TextAssembler(lambda t: bytes([t]), stops)


def test_multibyte_characters_are_emitted_only_when_complete() -> None:
    a = assembler()
    raw = byte_tokens("é!")
    assert a.push(raw[:1]) == ""
    assert a.push(raw[1:2]) == "é"
    assert a.push(raw[2:]) == "!"


def test_a_stop_string_cuts_the_text_and_sets_stopped() -> None:
    a = assembler(("STOP",))
    assert a.push(byte_tokens("hello ST")) == "hello "
    assert a.push(byte_tokens("OP and more")) == ""
    assert a.stopped and a.text == "hello "


def test_a_false_alarm_releases_the_held_text() -> None:
    a = assembler(("STOP",))
    assert a.push(byte_tokens("ST")) == ""
    assert a.push(byte_tokens("ar")) == "STar"
    assert not a.stopped


def test_flush_returns_what_was_held() -> None:
    a = assembler(("STOP",))
    a.push(byte_tokens("xS"))
    assert a.flush() == "S"
    assert a.text == "xS"


def test_a_character_split_across_steps_of_several_tokens_comes_out_once_whole() -> None:
    a = assembler()
    raw = byte_tokens("a€b")  # € is three bytes
    assert a.push(raw[:2]) == "a"
    assert a.push(raw[2:4]) == "€"
    assert a.push(()) == ""
    assert a.push(raw[4:]) == "b"
    assert a.text == "a€b"


def test_bytes_that_are_no_character_become_one_replacement_each_and_a_cut_one_is_dropped() -> None:
    a = assembler()
    assert a.push([0xFF, ord("x")]) == "\ufffdx"
    assert a.push([0xE2, 0x82]) == ""  # the first two bytes of €: held, then cut by the end
    assert a.flush() == ""
    assert a.text == "\ufffdx"
