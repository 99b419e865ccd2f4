"""Authentication of the HTTP API (issue 22): bearer tokens checked against a tokens file, and client
certificates from a configured CA (mutual TLS).

The file (config ``[auth] tokens_file``, ``FLEETLOG_AUTH_TOKENS_FILE``) is TOML::

    [[token]]
    principal = "tenant:a"
    sha256 = "<hex of sha256(token)>"
    expires = "2027-01-01T00:00:00Z"   # optional
    revoked = true                     # optional

Only hashes are kept at rest.  Tokens are random (``secrets.token_urlsafe(32)``: 256 bits), so a
plain SHA-256 suffices: a slow password hash (bcrypt, scrypt) defends low-entropy secrets against
guessing, and there is nothing to guess in 256 random bits; a fast hash keeps each check in
microseconds.  A presented token is hashed and looked up in a dict keyed by hash: the timing of
that lookup depends on the *hash* of the attacker's input, which the attacker cannot steer toward a
stored hash (preimage resistance), so it leaks nothing usable; the stored digest is then compared
with :func:`hmac.compare_digest` all the same.

The file is re-read when its inode, size, mtime or mode changes (looked at most once a second), so
a token is rotated without a restart.  At start, a file that is group- or world-readable or
-writable, or not owned by this process's user, is refused.  Later the file **fails closed**
(issue 46): a rewrite with such a mode, a deleted file, or one that does not parse authenticates
nobody (401 naming the file's problem, never a token or hash; ``/healthz`` says why) until a good
file is back.  Keeping the last good tokens instead would keep a revoked token valid for as long
as the revocation was written wrong.

**Mutual TLS** (``[auth] tls_cert_file``, ``tls_key_file``: the API is served over HTTPS;
``client_ca_file``: client certificates that CA signed are accepted, see :func:`server_tls`).  The
client's certificate is asked for but optional (``CERT_OPTIONAL``): one that is presented and does
not verify against the CA (another CA, expired) fails the TLS handshake; a client without one
still reaches the health probes and may send a bearer token.  A verified certificate names its
principal by the subject's commonName (``CN=tenant:a``, as Kubernetes takes the user from CN) and
wins over a token.  The certificates and the key are read at start (a new one: restart).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import ssl
import stat
import time
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final, Generic, NamedTuple, TypeVar

import msgspec

from fleetlog.service.config import AuthSettings

LOG: Final = logging.getLogger("fleetlog.auth")
EXEMPT: Final = frozenset({"/healthz", "/readyz"})
"""The routes answered without a token or certificate (probes carry none)."""
RECHECK_S: Final = 1.0
T = TypeVar("T")
LOOPBACK_NAMES: Final = frozenset({"localhost", "ip6-localhost"})


class AuthError(Exception):
    """The tokens file cannot be used (one line: the file and the problem, never a secret)."""


class TokenEntry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    principal: str
    sha256: str
    expires: dt.datetime | None = None
    revoked: bool = False


class TokensFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    token: list[TokenEntry] = []


class Verdict(msgspec.Struct, frozen=True):
    principal: str | None
    """Who presented the token or the client certificate (``None``: refused)."""
    problem: str = ""
    """Why it was refused (never the token)."""


PeerCert = Mapping[str, Any]
"""A verified client certificate as :meth:`ssl.SSLSocket.getpeercert` gives it (the dict form)."""
NEITHER: Final = ("no client certificate and no token: present a client certificate the auth.client_ca_file "
                  "CA signed, or send Authorization: Bearer <token>")
NO_CERTIFICATE: Final = "no client certificate: present one the auth.client_ca_file CA signed"


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    return secrets.token_urlsafe(32)


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_mode(path: Path, key: str = "auth.tokens_file") -> os.stat_result:
    """The file's stat, or an :class:`AuthError` when others may read or write it (``key``: the
    setting that names it, for the message)."""
    try:
        st = path.stat()
    except OSError as exc:
        raise AuthError(f"{key} {path}: {exc.strerror or exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise AuthError(f"{key} {path}: mode {stat.filemode(st.st_mode)} lets others read or "
                        f"write it; chmod 600 {path}")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise AuthError(f"{key} {path}: owned by uid {st.st_uid}, not this process's user")
    return st


def parse(path: Path, data: bytes) -> dict[str, TokenEntry]:
    """The entries by hash, or an :class:`AuthError` (the message names no token and no hash)."""
    try:
        raw = tomllib.loads(data.decode())
        entries = msgspec.convert(raw, TokensFile).token
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise AuthError(f"auth.tokens_file {path}: {exc}") from None
    by_hash: dict[str, TokenEntry] = {}
    for i, entry in enumerate(entries):
        digest = entry.sha256.lower()
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise AuthError(f"auth.tokens_file {path}: token[{i}] ({entry.principal}): sha256 is not "
                            "64 hex digits")
        if entry.expires is not None and entry.expires.tzinfo is None:
            raise AuthError(f"auth.tokens_file {path}: token[{i}] ({entry.principal}): expires needs a "
                            "time zone (e.g. 2027-01-01T00:00:00Z)")
        by_hash[digest] = entry
    return by_hash


class WatchedFile(Generic[T]):
    """A secrets file (tokens, policy) parsed at start and re-read when its inode, size, mtime or
    mode changes (looked at most once a second): rotated without a restart.  A rewrite that is
    refused (mode, owner, syntax) or a deleted file fails closed: :meth:`current` is ``None`` and
    :attr:`problem` says why until a good file is back — the last good content is not kept, since
    that would keep a revoked token (or a withdrawn role) valid."""

    def __init__(self, path: Path, key: str, parser: Callable[[Path, bytes], T],
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path, self.key, self._parser, self._monotonic = path, key, parser, monotonic
        self.noun = key.removeprefix("auth.").removesuffix("_file")  # tokens, policy
        st = check_mode(path, key)
        self._value: T | None = parser(path, path.read_bytes())
        self._seen: tuple[int, int, int, int] | None = _identity(st)
        self._looked = monotonic()
        self.problem: str | None = None
        """Why the file is not in force (``None``: it is), one line naming the file, never a secret."""

    def current(self) -> T | None:
        """The file's content, or ``None`` while it is refused or missing (see :attr:`problem`)."""
        now = self._monotonic()
        if now - self._looked >= RECHECK_S:
            self._looked = now
            self._reload()
        return self._value

    def _reload(self) -> None:
        try:
            st = self.path.stat()
        except OSError as exc:
            if self._seen is not None:
                self._refuse(f"{self.key} {self.path}: {exc.strerror or exc}")
            self._seen = None
            return
        if _identity(st) == self._seen:
            return
        self._seen = _identity(st)
        try:
            check_mode(self.path, self.key)
            self._value = self._parser(self.path, self.path.read_bytes())
        except (AuthError, OSError) as exc:
            self._refuse(str(exc))
            return
        self.problem = None
        LOG.info("%s %s re-read", self.key, self.path)

    def _refuse(self, problem: str) -> None:
        self._value, self.problem = None, problem
        LOG.error("%s; no %s in force (fail closed) until a good file is back", problem, self.noun)


def refused_files(*files: WatchedFile[Any] | None) -> dict[str, str]:
    """The problem of each watched file that is not in force, by its setting (``/healthz``)."""
    found: dict[str, str] = {}
    for watched in files:
        if watched is not None:
            watched.current()
            if watched.problem is not None:
                found[watched.key] = watched.problem
    return found


class Authenticator:
    """Who a request is: its verified client certificate's commonName (``certificates``: a
    ``client_ca_file`` is configured), else its ``Authorization`` header checked against the
    tokens file (``path``; ``None``: no tokens), re-read when it changes."""

    def __init__(self, path: Path | None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic, certificates: bool = False) -> None:
        self.path, self._clock, self.certificates = path, clock, certificates
        self._tokens = None if path is None else WatchedFile(path, "auth.tokens_file", parse, monotonic)

    def check(self, authorization: str | None, peercert: PeerCert | None = None) -> Verdict:
        """The principal of a verified client certificate (``peercert``; only verified ones reach
        here: the handshake refuses the rest), else of a ``Bearer`` header, or why it is refused."""
        if peercert:
            return certificate_principal(peercert)
        if self._tokens is None:
            return Verdict(None, NO_CERTIFICATE)
        if not authorization and self.certificates:
            return Verdict(None, NEITHER)
        tokens = self._tokens.current()
        if tokens is None:
            return Verdict(None, f"no token is accepted until the tokens file is good again: "
                                 f"{self._tokens.problem}")
        return self._token(tokens, authorization)

    @property
    def tokens(self) -> WatchedFile[dict[str, TokenEntry]] | None:
        """The watched tokens file (``None``: certificates only)."""
        return self._tokens

    def _token(self, tokens: dict[str, TokenEntry], authorization: str | None) -> Verdict:
        if not authorization:
            return Verdict(None, "no token: send Authorization: Bearer <token>")
        if not authorization.isascii():  # (a token is ASCII; other bytes would not even hash)
            return Verdict(None, "the Authorization header is not ASCII: send Authorization: Bearer <token>")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Verdict(None, "the Authorization header is not 'Bearer <token>'")
        digest = token_hash(token.strip())
        entry = tokens.get(digest)
        if entry is None or not hmac.compare_digest(entry.sha256.lower(), digest):
            return Verdict(None, "the token is not known")
        if entry.revoked:
            return Verdict(None, "the token is revoked")
        if entry.expires is not None and entry.expires.timestamp() <= self._clock():
            return Verdict(None, "the token has expired")
        return Verdict(entry.principal)


def certificate_principal(peercert: PeerCert) -> Verdict:
    """The subject's one commonName (``CN=tenant:a`` -> ``tenant:a``); a certificate with none, or
    with several, names no principal."""
    names = [value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"]
    if len(names) != 1 or not str(names[0]).strip():
        return Verdict(None, f"the client certificate's subject has {len(names)} commonNames: the principal "
                             "is its one CN (e.g. CN=tenant:a)")
    return Verdict(str(names[0]).strip())


def _identity(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_mode)


def entry_toml(principal: str, token: str, expires: str | None) -> str:
    """The ``[[token]]`` entry to paste into the tokens file for ``token``."""
    lines = ["[[token]]", f"principal = {_quoted(principal)}", f'sha256 = "{token_hash(token)}"']
    if expires:
        lines.append(f"expires = {_quoted(expires)}")
    return "\n".join(lines) + "\n"


def _quoted(text: str) -> str:
    return msgspec.json.encode(text).decode()


def authenticator(tokens_file: str | None, host: str,
                  client_ca_file: str | None = None) -> Authenticator | None:
    """The service's authenticator (``None``: none configured), or an :class:`AuthError` when the
    tokens file is unusable or ``host`` is not loopback and there is no authentication (neither
    tokens nor client certificates)."""
    if tokens_file is None and client_ca_file is None:
        if not is_loopback(host):
            raise AuthError(f"http_host = {host} listens beyond this machine without authentication: "
                            "set [auth] tokens_file (FLEETLOG_AUTH_TOKENS_FILE) or client_ca_file "
                            "(FLEETLOG_AUTH_CLIENT_CA_FILE), or bind 127.0.0.1")
        return None
    return Authenticator(None if tokens_file is None else Path(tokens_file),
                         certificates=client_ca_file is not None)


def server_tls(cert_file: str | None, key_file: str | None,
               client_ca_file: str | None) -> ssl.SSLContext | None:
    """The HTTPS context of ``tls_cert_file`` (the chain) and ``tls_key_file`` (``None``: plain
    HTTP), asking for client certificates of ``client_ca_file`` (optional ones: ``CERT_OPTIONAL``),
    TLS 1.2 at least; an :class:`AuthError` of one line when the files do not go together, the key
    is readable by others, or a file does not load."""
    if cert_file is None or key_file is None:
        if client_ca_file is not None:
            raise AuthError("auth.client_ca_file checks client certificates over TLS: set [auth] "
                            "tls_cert_file and tls_key_file (FLEETLOG_AUTH_TLS_CERT_FILE, "
                            "FLEETLOG_AUTH_TLS_KEY_FILE) too")
        if (cert_file, key_file) != (None, None):
            given, missing = ("tls_cert_file", "tls_key_file") if key_file is None else ("tls_key_file",
                                                                                           "tls_cert_file")
            raise AuthError(f"auth.{given} needs auth.{missing} (the server's certificate and its key)")
        return None
    check_mode(Path(key_file), "auth.tls_key_file")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load(context.load_cert_chain, f"auth.tls_cert_file {cert_file} and auth.tls_key_file {key_file}",
          cert_file, key_file)
    if client_ca_file is not None:
        context.verify_mode = ssl.CERT_OPTIONAL
        _load(context.load_verify_locations, f"auth.client_ca_file {client_ca_file}", client_ca_file)
    return context


def _load(load: Callable[..., None], what: str, *paths: str) -> None:
    """``load(*paths)``, or an :class:`AuthError` naming ``what`` (the settings and files; never a
    key's bytes: ssl's messages name the problem only)."""
    try:
        load(*paths)
    except (ssl.SSLError, OSError, ValueError) as exc:
        why = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or exc
        raise AuthError(f"{what}: cannot be loaded ({why})") from None


class Security(NamedTuple):
    """What the HTTP server is given by ``[auth]``."""

    auth: Authenticator | None
    tls: ssl.SSLContext | None


def security(settings: AuthSettings, host: str) -> Security:
    """The authenticator and HTTPS context of the ``[auth]`` table for a server on ``host`` (an
    :class:`AuthError` when they cannot be used; checked before anything starts)."""
    tls = server_tls(settings.tls_cert_file, settings.tls_key_file, settings.client_ca_file)
    return Security(authenticator(settings.tokens_file, host, settings.client_ca_file), tls)
