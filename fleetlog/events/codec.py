"""Encode and decode envelopes as msgpack (the default) or JSON.

A log record says which format its value is in through the ``content-type``
header; a record without the header is msgpack, unless its value starts with ``{``
(JSON from a producer that cannot set headers: no msgpack envelope starts with that
byte, msgpack maps start with 0x80-0x8f, 0xde or 0xdf).  Decoding takes the fast path
(one msgspec call) and, only when that fails, a slower diagnosis that names
what was wrong with a typed :class:`BadEventError`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

import msgspec

from fleetlog.events.model import (
    EVENT_TYPE_NAMES,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    Envelope,
    Event,
)

Format = Literal["msgpack", "json"]
CONTENT_TYPE_HEADER: Final = "content-type"
MSGPACK: Final = b"application/msgpack"
JSON: Final = b"application/json"
CONTENT_TYPES: Final[dict[Format, bytes]] = {"msgpack": MSGPACK, "json": JSON}
MAX_EVENT_BYTES: Final = 4 << 20
"""Largest encoded envelope accepted (4 MiB, under Kafka's default 1 MiB x 4 batch limits)."""


class BadEventError(ValueError):
    """Input that cannot become an event. ``reason`` is a stable code for dead letters."""

    reason: str = "bad_event"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UndecodableError(BadEventError):
    reason = "undecodable"


class UnknownContentTypeError(BadEventError):
    reason = "unknown_content_type"


class EventTooLargeError(BadEventError):
    reason = "too_large"


class UnsupportedSchemaVersionError(BadEventError):
    reason = "unsupported_schema_version"


class UnknownEventTypeError(BadEventError):
    reason = "unknown_event_type"


class InvalidEventError(BadEventError):
    reason = "invalid_event"


class _Head(msgspec.Struct):
    """Just enough of an envelope to diagnose it: the rest is kept raw."""

    schema_version: int
    event: msgspec.Raw
    producer_id: Any = None
    key: Any = None


class _Tag(msgspec.Struct):
    type: str


_MSGPACK_ENCODER: Final = msgspec.msgpack.Encoder()
_JSON_ENCODER: Final = msgspec.json.Encoder()
_MSGPACK_DECODER: Final = msgspec.msgpack.Decoder(Envelope)
_JSON_DECODER: Final = msgspec.json.Decoder(Envelope)
_HEAD_DECODERS: Final[dict[str, msgspec.msgpack.Decoder[_Head] | msgspec.json.Decoder[_Head]]] = {
    "msgpack": msgspec.msgpack.Decoder(_Head),
    "json": msgspec.json.Decoder(_Head),
}
_TAG_DECODERS: Final[dict[str, msgspec.msgpack.Decoder[_Tag] | msgspec.json.Decoder[_Tag]]] = {
    "msgpack": msgspec.msgpack.Decoder(_Tag),
    "json": msgspec.json.Decoder(_Tag),
}


def envelope(event: Event, producer_id: str, key: str | None = None) -> Envelope:
    """Wrap ``event`` in an envelope of the current schema version."""
    return Envelope(schema_version=SCHEMA_VERSION, producer_id=producer_id, event=event, key=key)


def encode(env: Envelope, fmt: Format = "msgpack") -> bytes:
    """The bytes of ``env`` in format ``fmt``."""
    return _MSGPACK_ENCODER.encode(env) if fmt == "msgpack" else _JSON_ENCODER.encode(env)


def format_of(content_type: bytes | None, data: bytes = b"") -> Format:
    """The format named by a ``content-type`` header value.  Without the header (``None``) it is
    msgpack, or JSON when ``data`` starts with ``{`` (after JSON whitespace), which can never begin
    a msgpack envelope: there, ``{`` would be the integer 123."""
    if content_type is None:
        return "json" if data[:64].lstrip(b" \t\r\n")[:1] == b"{" else "msgpack"
    if content_type == MSGPACK:
        return "msgpack"
    if content_type == JSON or content_type.split(b";")[0].strip() == JSON:
        return "json"
    shown = content_type[:64].decode("utf-8", "replace")
    raise UnknownContentTypeError(f"content-type {shown!r} is neither {MSGPACK.decode()} nor {JSON.decode()}")


def decode(data: bytes, content_type: bytes | None = None) -> Envelope:
    """Decode one envelope; raise a :class:`BadEventError` subclass saying what is wrong."""
    fmt = format_of(content_type, data)
    if len(data) > MAX_EVENT_BYTES:
        raise EventTooLargeError(f"event is {len(data)} bytes; the limit is {MAX_EVENT_BYTES}")
    try:
        env = (_MSGPACK_DECODER if fmt == "msgpack" else _JSON_DECODER).decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise diagnose(data, fmt, exc) from exc
    if env.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        raise _unsupported(env.schema_version)
    return env


def decode_many(values: Iterable[tuple[bytes, bytes | None]]) -> list[Envelope | BadEventError]:
    """Decode (value, content-type) pairs; a bad one yields its error in place.

    The hot path of every consumer: msgpack values without a content-type take one
    msgspec call each, with no Python-level checks but the schema version.  Anything
    else (JSON, a failure to diagnose) goes through :func:`decode`.
    """
    out: list[Envelope | BadEventError] = []
    append = out.append
    fast = _MSGPACK_DECODER.decode
    for data, content_type in values:
        if content_type is None and len(data) <= MAX_EVENT_BYTES:
            try:
                env = fast(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
            else:
                if env.schema_version == SCHEMA_VERSION:
                    append(env)
                    continue
        try:
            append(decode(data, content_type))
        except BadEventError as exc:
            append(exc)
    return out


def encode_many(envs: Sequence[Envelope], fmt: Format = "msgpack") -> list[bytes]:
    """Encode a batch of envelopes."""
    enc = _MSGPACK_ENCODER.encode if fmt == "msgpack" else _JSON_ENCODER.encode
    return [enc(e) for e in envs]


def _unsupported(version: int) -> UnsupportedSchemaVersionError:
    known = ", ".join(str(v) for v in sorted(SUPPORTED_SCHEMA_VERSIONS))
    return UnsupportedSchemaVersionError(
        f"schema_version {version} is not supported (this build reads {known})"
    )


def diagnose(data: bytes, fmt: Format, exc: Exception) -> BadEventError:
    """Turn a failed fast-path decode into the most specific error we can name."""
    try:
        head = _HEAD_DECODERS[fmt].decode(data)
    except msgspec.ValidationError as head_exc:
        return InvalidEventError(f"not an event envelope: {head_exc}")
    except msgspec.DecodeError as head_exc:
        return UndecodableError(f"not valid {fmt}: {head_exc}")
    if head.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        return _unsupported(head.schema_version)
    try:
        tag = _TAG_DECODERS[fmt].decode(head.event).type
    except (msgspec.DecodeError, msgspec.ValidationError) as tag_exc:
        return InvalidEventError(f"event has no string `type` field: {tag_exc}")
    if tag not in EVENT_TYPE_NAMES:
        return UnknownEventTypeError(
            f"unknown event type {tag[:100]!r}; known: {', '.join(EVENT_TYPE_NAMES)}"
        )
    return InvalidEventError(f"invalid {tag}: {exc}")
