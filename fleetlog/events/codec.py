"""Encode and decode envelopes as msgpack (the default) or JSON.

A log record says which format its value is in through the ``content-type``
header; a record without the header is msgpack, unless its value starts with ``{``
(JSON from a producer that cannot set headers: no msgpack envelope starts with that
byte, msgpack maps start with 0x80-0x8f, 0xde or 0xdf).  Decoding takes the fast path
(one msgspec call) and, only when that fails, a slower diagnosis that names
what was wrong with a typed :class:`BadEventError`.

Decoding reads untrusted bytes, so :func:`decode` and :func:`decode_many` raise (or return)
nothing but :class:`BadEventError` subclasses, whatever the bytes: an exception of any other
type from the decoder (``RecursionError`` on deep nesting, ``MemoryError``, a bug) is caught and
named, so a reader parks the record instead of stopping.  JSON objects must not repeat a key.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final, Literal

import msgspec

from fleetlog.events.model import (
    EVENT_TYPE_NAMES,
    ID_TEXT,
    NOT_PRINTABLE,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    Envelope,
    Event,
    unprintable_id,
)

Format = Literal["msgpack", "json"]
CONTENT_TYPE_HEADER: Final = "content-type"
MSGPACK: Final = b"application/msgpack"
JSON: Final = b"application/json"
CONTENT_TYPES: Final[dict[Format, bytes]] = {"msgpack": MSGPACK, "json": JSON}
MAX_EVENT_BYTES: Final = 4 << 20
"""Largest encoded envelope accepted (4 MiB, under Kafka's default 1 MiB x 4 batch limits)."""
UTF8_BOM: Final = b"\xef\xbb\xbf"
_UTF8_CHARSETS: Final = frozenset({b"utf-8", b"utf8", b"us-ascii"})
_JSON_SPACE: Final = b" \t\r\n"
_MSGPACK_MAPS: Final = frozenset({*range(0x80, 0x90), 0xDE, 0xDF})


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


class TooDeepError(BadEventError):
    """Arrays or maps nested deeper than the decoder's recursion limit (no event nests beyond 6)."""

    reason = "too_deep"


class DuplicateKeyError(BadEventError):
    """A JSON object names a key twice: other validators may keep the first, msgspec the last."""

    reason = "duplicate_key"


class _Head(msgspec.Struct):
    """Just enough of an envelope to diagnose it: the rest is kept raw."""

    schema_version: int
    event: msgspec.Raw
    producer_id: Any = None
    key: Any = None


class _Tag(msgspec.Struct):
    type: str


_UNPRINTABLE: Final = re.compile(f"[{NOT_PRINTABLE}]").search
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


def media_type(content_type: bytes) -> tuple[bytes, dict[bytes, bytes]]:
    """The media type of a ``content-type`` value and its parameters, as RFC 9110 reads them:
    type and parameter names are case-insensitive (returned in lower case), a parameter value may
    be quoted (``Application/JSON; Charset="UTF-8"`` -> ``(b"application/json", {b"charset":
    b"UTF-8"})``)."""
    kind, *params = content_type.split(b";")
    found: dict[bytes, bytes] = {}
    for param in params:
        name, _, value = param.partition(b"=")
        if name.strip():
            found[name.strip().lower()] = value.strip().removeprefix(b'"').removesuffix(b'"')
    return kind.strip().lower(), found


def format_of(content_type: bytes | None, data: bytes = b"") -> Format:
    """The format named by a ``content-type`` header value (case-insensitive, parameters
    allowed; JSON's ``charset``, if given, must be UTF-8 or its subset US-ASCII).  Without the
    header (``None``) it is msgpack, or JSON when ``data`` starts with ``{`` (after JSON
    whitespace), which can never begin a msgpack envelope: there, ``{`` would be the integer 123."""
    if content_type is None:
        return "json" if data[:64].lstrip(b" \t\r\n")[:1] == b"{" else "msgpack"
    if content_type == MSGPACK:
        return "msgpack"
    if content_type == JSON:
        return "json"
    kind, params = media_type(content_type)
    shown = content_type[:64].decode("utf-8", "replace")
    if kind == MSGPACK:
        return "msgpack"
    if kind != JSON:
        raise UnknownContentTypeError(
            f"content-type {shown!r} is neither {MSGPACK.decode()} nor {JSON.decode()}"
        )
    charset = params.get(b"charset", b"utf-8").lower()
    if charset not in _UTF8_CHARSETS:
        raise UnknownContentTypeError(
            f"content-type {shown!r}: charset {charset[:32].decode('utf-8', 'replace')!r} is not read; "
            "JSON events are UTF-8"
        )
    return "json"


def may_mention(data: bytes, content_type: bytes | None, needles: Sequence[bytes]) -> bool:
    """Whether a record may hold one of ``needles`` (UTF-8 ids) — a pre-filter before a decode.
    Msgpack stores a string's bytes as they are, so a byte test is exact there; JSON may escape
    any character (``"j\\u00e9"`` is ``"jé"``), so a JSON record (or one of a format not known)
    is always worth decoding."""
    try:
        if format_of(content_type, data) != "msgpack":
            return True
    except BadEventError:
        return True  # the decode names what is wrong with it
    return any(needle in data for needle in needles)


def decode(data: bytes, content_type: bytes | None = None) -> Envelope:
    """Decode one envelope; raise a :class:`BadEventError` subclass saying what is wrong
    (and no other exception, whatever ``data`` holds)."""
    try:
        return _decode(data, content_type)
    except BadEventError:
        raise
    except RecursionError as exc:
        raise _too_deep() from exc
    except Exception as exc:  # a failure we could not name: still a dead letter, never a crash
        raise UndecodableError(f"cannot decode: {type(exc).__name__}: {str(exc)[:500]}") from exc


def _decode(data: bytes, content_type: bytes | None) -> Envelope:
    fmt = format_of(content_type, data)
    if len(data) > MAX_EVENT_BYTES:
        raise EventTooLargeError(f"event is {len(data)} bytes; the limit is {MAX_EVENT_BYTES}")
    try:
        env = (_MSGPACK_DECODER if fmt == "msgpack" else _JSON_DECODER).decode(data)
    except Exception as exc:  # any type: diagnose names it
        raise diagnose(data, fmt, exc) from exc
    if fmt == "json":
        _check_unique_keys(data, env)
    if env.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        raise _unsupported(env.schema_version)
    _check_ids(env.event)
    return env


def _check_ids(event: Event) -> None:
    """Refuse an event whose identifiers are not all printable (one search over all of them)."""
    if _UNPRINTABLE(ID_TEXT[type(event)](event)) is not None:
        path = unprintable_id(event, _UNPRINTABLE)
        raise InvalidEventError(
            f"invalid {type(event).__name__}: Expected a printable identifier (no spaces, control, "
            f"format or bidirectional characters) - at `$.event{path}`"
        )


def _too_deep() -> TooDeepError:
    return TooDeepError("arrays or maps nested too deeply (no event nests more than 6 levels)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise DuplicateKeyError(f"a JSON object repeats the key {_first_repeat(pairs)[:100]!r}")
    return found


def _first_repeat(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    return ""


def _repeated_key(data: bytes) -> DuplicateKeyError | None:
    try:
        _refuse_duplicate_keys(data)
    except DuplicateKeyError as exc:
        return exc
    except Exception:  # not JSON at all: the diagnosis goes on and says so
        return None
    return None


def _check_unique_keys(data: bytes, env: Envelope) -> None:
    """msgspec keeps the last of repeated keys, other validators the first: refuse both.

    Cheap first: every key is followed by a ``:``, and ``env`` re-encoded holds at most the keys
    of ``data`` (defaults are left out, a repeated key kept once), so as many ``:`` in both
    means no key was repeated — unless a ``\\u`` escape (say of a ``:`` in a string) changed
    the count.  Otherwise the stdlib parser, which sees every key, decides."""
    if b"\\u" in data or _JSON_ENCODER.encode(env).count(b":") != data.count(b":"):
        _refuse_duplicate_keys(data)


def _refuse_duplicate_keys(data: bytes) -> None:
    """Raise :class:`DuplicateKeyError` naming the first key an object of ``data`` repeats."""
    json.loads(data, object_pairs_hook=_unique_keys)


def decode_many(values: Iterable[tuple[bytes, bytes | None]]) -> list[Envelope | BadEventError]:
    """Decode (value, content-type) pairs; a bad one yields its error in place.

    The hot path of every consumer: msgpack values without a content-type take one
    msgspec call each, with no Python-level checks but the schema version.  Anything
    else (JSON, a failure to diagnose) goes through :func:`decode`.
    """
    out: list[Envelope | BadEventError] = []
    append = out.append
    fast, ids, unprintable = _MSGPACK_DECODER.decode, ID_TEXT, _UNPRINTABLE
    for data, content_type in values:
        if content_type is None and len(data) <= MAX_EVENT_BYTES:
            try:
                env = fast(data)
            except Exception:  # diagnosed by decode below, whatever the type
                pass
            else:
                event = env.event
                if env.schema_version == SCHEMA_VERSION and unprintable(ids[type(event)](event)) is None:
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
    if isinstance(exc, RecursionError):
        return _too_deep()
    not_a_map = _not_a_map(data, fmt)
    if not_a_map is not None:
        return not_a_map
    if fmt == "json":
        repeated = _repeated_key(data)
        if repeated is not None:  # a repeated key may be why it failed ("type" twice, say)
            return repeated
    try:
        head = _HEAD_DECODERS[fmt].decode(data)
    except msgspec.ValidationError as head_exc:
        return InvalidEventError(f"not an event envelope: {head_exc}")
    except msgspec.DecodeError as head_exc:
        return UndecodableError(f"not valid {fmt}: {head_exc}")
    except RecursionError:
        return _too_deep()
    if head.schema_version not in SUPPORTED_SCHEMA_VERSIONS:
        return _unsupported(head.schema_version)
    try:
        tag = _TAG_DECODERS[fmt].decode(head.event).type
    except (msgspec.DecodeError, msgspec.ValidationError) as tag_exc:
        return InvalidEventError(f"event has no string `type` field: {tag_exc}")
    except RecursionError:
        return _too_deep()
    if tag not in EVENT_TYPE_NAMES:
        return UnknownEventTypeError(
            f"unknown event type {tag[:100]!r}; known: {', '.join(EVENT_TYPE_NAMES)}"
        )
    if not isinstance(exc, (msgspec.DecodeError, msgspec.ValidationError)):
        return UndecodableError(f"cannot decode {tag}: {type(exc).__name__}: {str(exc)[:500]}")
    return InvalidEventError(f"invalid {tag}: {exc}")



def _not_a_map(data: bytes, fmt: Format) -> UndecodableError | None:
    """``undecodable`` for bytes that cannot be an envelope at all, whatever they hold (not one
    map / JSON object: plain text, a JSON array, a number; JSON behind a byte-order mark),
    said in words — not as an ``invalid_event`` about the integer the first byte would be."""
    if not data:
        return None  # "truncated", as the decoder says
    if data.startswith(UTF8_BOM):
        return UndecodableError("starts with a UTF-8 byte-order mark (EF BB BF): send JSON without it "
                                "(RFC 8259 forbids it on the wire)")
    if fmt == "msgpack":
        if data[0] in _MSGPACK_MAPS:
            return None
        start = data[:64].lstrip(_JSON_SPACE)[:1]
        if start == b"[":
            return UndecodableError("a JSON array: a record holds one envelope, a JSON object")
        if start == b"{":  # only an explicit msgpack content-type reads a '{' as msgpack
            return UndecodableError(f"JSON under content-type {MSGPACK.decode()}: send it as {JSON.decode()}")
        if data[:32].isascii() and data[:32].decode().strip().isprintable():
            return UndecodableError(f"text {data[:32].decode()!r}, neither a msgpack map nor a JSON object: "
                                    f"an event is one envelope (JSON needs content-type {JSON.decode()} or "
                                    "a leading '{')")
        return UndecodableError(f"not valid msgpack for an envelope: the first byte 0x{data[0]:02x} does not "
                                "start a map")
    start = data.lstrip(_JSON_SPACE)[:1]
    if start in (b"{", b""):
        return None
    kind = "a JSON array" if start == b"[" else "not a JSON object"
    shown = data.lstrip(_JSON_SPACE)[:32].decode("utf-8", "replace")
    return UndecodableError(f"{kind} ({shown!r}...): an event is one envelope, a JSON object")
