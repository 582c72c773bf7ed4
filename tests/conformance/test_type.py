"""type: the exact text arrives in a real terminal (xterm running ``cat > FILE``)."""

from __future__ import annotations

import threading

import pytest

from .harness import TargetError, poll

TEXTS = {
    "ascii": "The quick brown fox jumps over the lazy dog 0123456789",
    "shifted": "Hello, World! ~`@#%^*()_+{}|:?",
    "markup_and_shell": "<a href=\"x\">&amp;</a> 'q' $HOME $(id) `id` \\n ; | >",
    "unicode": "café – naïve 日本語 😀 Ωμέγα ß",
    "leading_dash": "-n not an option",
    "leading_double_dash": "--help --version",
    "tab": "a\tb\tc",
}


@pytest.mark.parametrize("name", list(TEXTS))
def test_text_arrives_exactly(target, sink, name):
    text = TEXTS[name]
    assert sink.type_and_read(target, text, text) == text + "\n"


def test_crlf_is_one_return_and_lf_is_return(target, sink):
    got = sink.type_and_read(target, "one\r\ntwo\nthree\rfour", "one\ntwo\nthree\nfour")
    assert got == "one\ntwo\nthree\nfour\n"


def test_two_thousand_characters(target, sink):
    line = "".join(chr(0x21 + (i * 7) % 94) for i in range(199)) + "é"
    text = line * 10
    assert len(text) == 2000
    assert sink.type_and_read(target, text, text, timeout=60) == text + "\n"


def test_more_unmapped_characters_than_spare_keycodes(target, sink):
    # 60 distinct characters that no default keymap holds: spare keycodes must be reused safely.
    text = "".join(chr(0x4E00 + i * 3) for i in range(60))
    assert sink.type_and_read(target, text, text, timeout=60) == text + "\n"


def test_characters_bound_before_and_more_new_ones_than_keycodes_left(target, sink):
    # Characters an earlier text bound keep their keycodes while a text uses them again, so the new
    # ones must fit the keycodes left: such a text is typed in chunks, never refused.
    first = "".join(chr(0x5000 + i * 5) for i in range(30))
    assert sink.type_and_read(target, first, first, timeout=60) == first + "\n"
    second = first[:12] + "".join(chr(0x6000 + i * 5) for i in range(40)) + first[:12]
    assert sink.type_and_read(target, second, second, timeout=60) == second + "\n"


def test_control_characters_other_than_newline_and_tab_are_refused(target, sink):
    with pytest.raises(TargetError) as err:
        target.run([{"type": "type", "text": "bell\x07"}])
    assert err.value.code == "invalid_action"


def test_concurrent_requests_never_interleave(target, sink):
    texts = ["a" * 150, "b" * 150, "c" * 150]
    before = len(sink.content())
    sink.focus(target)
    errors: list[BaseException] = []

    def go(t: str) -> None:
        try:
            target.run([{"type": "type", "text": t}])
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(t,)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    # The terminal hands a line to ``cat`` at Return: end it, then read what arrived.
    got = sink.type_and_read(target, "", "x" * 450)
    got = sink.content()[before:].rstrip("\n")
    assert sorted(got) == sorted("".join(texts))
    # Each request's characters are contiguous: exactly 3 runs.
    runs = 1 + sum(1 for i in range(1, len(got)) if got[i] != got[i - 1])
    assert runs == 3, got


def test_text_arrives_exactly_with_caps_lock_on(target, sink):
    # A model may press CAPSLOCK; `type` and `keypress` must still deliver the exact text and keys named,
    # and leave the lock as it was (the next CAPSLOCK turns it off).
    target.run([{"type": "keypress", "keys": ["CAPSLOCK"]}])
    try:
        text = "aB1 é日 Zz"
        assert sink.type_and_read(target, text, text) == text + "\n"
        before = len(sink.content())
        target.run([{"type": "keypress", "keys": ["a"]}, {"type": "keypress", "keys": ["A"]},
                    {"type": "keypress", "keys": ["Return"]}])
        assert poll(lambda: sink.content()[before:] or None, 10, what="the key press") == "aA\n"
    finally:
        target.run([{"type": "keypress", "keys": ["CAPSLOCK"]}])
