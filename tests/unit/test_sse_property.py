"""The SSE decoder under any read boundaries and any bytes (issue 21, item 4): property-based.

A server's stream reaches the client cut at arbitrary points (TCP segments, chunked framing,
proxies); the events must not depend on where. Random bytes (a broken or hostile server) may end
a request, but only by the decoder's one named error, never by a crash.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_locust.core.sse import EventTooLarge, SseDecoder

CHEAP = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# One line of text: no line ends inside (the payload is split into lines by the protocol itself).
line_text = st.text(alphabet=st.sampled_from('ab {}":,\\[]01é'), max_size=30).map(lambda s: s.encode())
line_end = st.sampled_from([b"\n", b"\r\n"])


@st.composite
def events(draw):
    """One event as (its bytes, its expected payload or None): data lines among comment and field
    lines, each ending \\n or \\r\\n, closed by a blank line."""
    lines, data = [], []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["data", "data", "comment", "field"]))
        text = draw(line_text)
        if kind == "data":
            space = draw(st.sampled_from([b"", b" "]))
            lines.append(b"data:" + space + text)
            data.append((space + text).lstrip(b" "))  # the decoder drops the spaces after "data:"
        elif kind == "comment":
            lines.append(b":" + text)
        else:
            lines.append(b"event: " + text.replace(b"data", b"x"))
    raw = b"".join(line + draw(line_end) for line in lines) + draw(line_end)
    return raw, (b"\n".join(data) if data else None)


def splits(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


def decode(pieces: list[bytes], limit: int = 0) -> tuple[list[bytes], bytes]:
    decoder = SseDecoder(limit)
    out = []
    for piece in pieces:
        out.extend(decoder.feed(piece))
    return out, decoder.pending


@CHEAP
@given(st.lists(events(), max_size=8), st.lists(st.integers(0, 2000), max_size=40))
def test_any_split_of_a_valid_stream_decodes_to_the_same_events(stream, cuts):
    whole = b"".join(raw for raw, _ in stream)
    expected = [payload for _, payload in stream if payload is not None]
    got, pending = decode(splits(whole, cuts))
    assert got == expected
    assert pending == b""


@CHEAP
@given(st.lists(st.binary(max_size=64), max_size=20), st.lists(st.integers(0, 1300), max_size=20),
       st.sampled_from([0, 16, 200]))
def test_random_bytes_never_crash_and_do_not_depend_on_the_reads(pieces, cuts, limit):
    whole = b"".join(pieces)
    try:
        expected = decode([whole], limit)
    except EventTooLarge:
        expected = EventTooLarge
    try:
        got = decode(splits(whole, cuts), limit)
    except EventTooLarge:
        got = EventTooLarge
    assert got == expected
    if got is not EventTooLarge:
        assert all(isinstance(p, bytes) for p in got[0])


def test_an_event_past_the_limit_is_refused_by_name_before_it_ends():
    decoder = SseDecoder(max_event_bytes=1000)
    decoder.feed(b"data: " + b"x" * 500)
    with pytest.raises(EventTooLarge, match=r"event over --max-event-bytes \(1000 bytes\)"):
        for _ in range(10):
            decoder.feed(b"x" * 100)  # never ends: refused once it is over, not held forever


def test_a_whole_event_over_the_limit_in_one_read_is_refused_too():
    with pytest.raises(EventTooLarge):
        SseDecoder(max_event_bytes=100).feed(b"data: " + b"x" * 200 + b"\n\n")
    assert SseDecoder(max_event_bytes=100).feed(b"data: ok\n\n" * 50) == [b"ok"] * 50, "the limit is per event"


def test_an_unfinished_event_is_searched_only_in_its_new_bytes():
    """Linear decoding: after each read the search resumes where the last one stopped (re-splitting
    the whole buffer per read took 26.7 s for a 40 MB event); the event is still found whole."""
    decoder = SseDecoder(max_event_bytes=0)
    decoder.feed(b"data: ")
    for _ in range(256):
        decoder.feed(b"y" * 4096)
        assert decoder._scan == len(decoder._buffer) - 1, "the next search starts at the new bytes"
    assert decoder.feed(b"\n\n") == [b"y" * 4096 * 256]


def stamped(pieces: list[bytes], limit: int = 0) -> list[bytes]:
    from vllm_locust.core.sse import stamped_payloads

    return [payload for _, payload in stamped_payloads(pieces, clock=lambda: 0.0, max_event_bytes=limit)]


@CHEAP
@given(st.lists(st.one_of(events().map(lambda e: e[0]), st.binary(max_size=40),
                          st.sampled_from([b"data: x\n\n", b"data:x\n\n", b"data:\n\n", b"data: x\r\n\n", b"data: a",
                                           b"\n\n", b"data: x\n\n\n", b"data: " + b"y" * 30 + b"\n\n", b"\r"])),
                max_size=12), st.sampled_from([0, 16, 200]))
def test_stamped_payloads_fast_path_returns_what_the_decoder_does(pieces, limit):
    """``stamped_payloads`` skips the decoder for a read that is one whole one-line event (issue
    25): for any reads it must yield the decoder's payloads, and refuse what the decoder refuses."""
    try:
        expected = decode(pieces, limit)[0]
    except EventTooLarge:
        expected = EventTooLarge
    try:
        got = stamped(pieces, limit)
    except EventTooLarge:
        got = EventTooLarge
    assert got == expected


def test_stamped_payloads_fast_path_cases():
    assert stamped([b"data: a\n\n", b"data:b\n\n", b"data: c", b"\n\n", b"data: d\n\n"]) == [b"a", b"b", b"c", b"d"]
    assert stamped([b"data: a\r", b"\n\r\n", b"data: b\n\n"]) == [b"a", b"b"]
    assert stamped([b"data: a\n\n\r", b"data: b\n\n"]) == decode([b"data: a\n\n\r", b"data: b\n\n"])[0] == [b"a"], \
        "a held-back \\r starts the next read: that read is the decoder's"
    with pytest.raises(EventTooLarge):
        stamped([b"data: " + b"x" * 20 + b"\n\n"], limit=16)


def test_a_read_ending_in_three_line_ends_keeps_the_third_as_the_whole_stream_does():
    """Found by the property above (CI): a read ending ``\\n\\n\\n`` took the one-read fast path and
    dropped the third ``\\n``, which the same bytes in one read keep pending."""
    whole = b"\x00\x00\x00\x00\x00\n\n\n\x00"
    assert decode([whole]) == decode([whole[:8], whole[8:]]) == ([], b"\n\x00")
