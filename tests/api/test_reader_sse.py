"""The Reader's Server-Sent Events parser (``fleetlog.reader._changes``) against a plain one.

The service writes each record as one ``data:`` line ending in ``\\n``, and hands them to the socket
in whatever pieces; a proxy between may re-chunk the stream, end lines with ``\\r\\n``, add comments,
or (as the SSE standard allows) split the data over several lines.  The fast parser decodes the
line where it lies; here it must give what the standard's reading of the same text gives, on
generated streams and every chunking of them, one byte at a time included.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
from typing import Any

import aiohttp
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetlog.reader import Change, _changes

values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@st.composite
def records(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"offset": draw(st.integers(0, 2**62)),
                            "timestamp_ms": draw(st.integers(0, 2**50))}
    if draw(st.booleans()):
        body["event"] = {"type": draw(st.sampled_from(["DecisionBatch", "JobSubmitted"])),
                         "x": draw(values)}
    else:
        body["error"] = draw(st.text(max_size=30))
    return body


def render(body: dict[str, Any], crlf: bool, split: bool, comment: bool) -> bytes:
    """One event as a server or a proxy might write it."""
    end = b"\r\n" if crlf else b"\n"
    text = msgspec.json.format(msgspec.json.encode(body), indent=1) if split else msgspec.json.encode(body)
    lines = [b": keepalive"] if comment else []
    kind = body["event"]["type"] if "event" in body else "undecodable"
    lines += [b"id: %d" % body["offset"], b"event: " + kind.encode()]
    lines += [b"data:" + (b" " if i % 2 else b"") + line for i, line in enumerate(text.split(b"\n"))]
    return end.join(lines) + end + end


def plain(stream: bytes) -> list[Change]:
    """The SSE standard's reading (lines end in LF or CRLF; a blank line dispatches; data lines
    are joined with LF; one leading space of a value is dropped), then the JSON decoded."""
    out, kind, data = [], "", list[bytes]()
    for line in stream.replace(b"\r\n", b"\n").split(b"\n"):
        if not line:
            if data:
                body = msgspec.json.decode(b"\n".join(data))
                out.append(Change(body["offset"], body["timestamp_ms"], kind, body.get("event"),
                                  body.get("error")))
            kind, data = "", []
            continue
        name, _, value = line.partition(b":")
        value = value[1:] if value.startswith(b" ") else value
        if name == b"event":
            kind = value.decode()
        elif name == b"data":
            data.append(value)
    return out


async def fast(stream: bytes, cuts: list[int]) -> list[Change]:
    reader = aiohttp.StreamReader(aiohttp.base_protocol.BaseProtocol(asyncio.get_running_loop()),
                                  limit=1 << 16)
    edges = sorted({0, len(stream), *(c % (len(stream) + 1) for c in cuts)})
    for a, b in itertools.pairwise(edges):
        reader.feed_data(stream[a:b])
    reader.feed_eof()
    return [c async for c in _changes(reader)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(records(), st.booleans(), st.booleans(), st.booleans()), max_size=6),
       st.lists(st.integers(0, 1 << 20), max_size=40), st.booleans())
def test_the_reader_reads_what_the_standard_reads(events: list[tuple[dict[str, Any], bool, bool, bool]],
                                                   cuts: list[int], bytewise: bool) -> None:
    stream = b"retry: 1000\n\n" + b"".join(render(*e) for e in events)
    if bytewise:
        cuts = list(range(len(stream)))
    got = asyncio.run(fast(stream, cuts))
    assert got == plain(stream)
    assert [c.offset for c in got] == [e[0]["offset"] for e in events]


def test_a_decode_leaves_the_collector_as_it_found_it() -> None:
    record = {"offset": 1, "timestamp_ms": 2, "event": {"type": "X", "n": [1] * 1000}}
    stream = render(record, False, False, False)
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            assert [c.offset for c in asyncio.run(fast(stream, [7, 100]))] == [1]
            assert gc.isenabled() is enabled
    finally:
        gc.enable()
