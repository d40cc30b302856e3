"""SIP digest authentication (RFC 3261 §22, RFC 2617 with qop=auth): who may open a recording session.

The server side challenges with MD5 and ``qop="auth"``, and also accepts responses computed with
SHA-256 (RFC 7616, which RFC 8760 brings to SIP). Its nonces are a timestamp and a random salt with an
HMAC over them: a forged nonce fails the HMAC and an old one is answered ``stale=true`` (the client knew
the password and need only retry). Each nonce issued is also remembered until it expires (at most
``MAX_ISSUED_NONCES``, the oldest forgotten first) with the highest nonce count used with it: a request
whose nc does not rise (or, without qop, a nonce used twice) is a replay and refused, and a nonce we did
not issue or no longer hold is answered ``stale=true``. The caller passes the request URI, which the
credentials' ``uri`` must name, so an answer captured for one request URI is no good for another.

The client side (:func:`authorization`) answers a challenge, for the project's own SIPREC client.

Refusals are short reason tokens for the log and the counter; no message here ever holds a password.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pipeline.gateway.siprec.message import unquote_at

MAX_HEADER_CHARS = 4096
MAX_PARAMETERS = 32
MAX_NONCE_CHARS = 128
FUTURE_SKEW_S = 60.0  # a nonce stamped this far ahead of our clock is still taken as fresh
MAX_ISSUED_NONCES = 4096  # challenges outstanding at once; past it the oldest is forgotten (its client: stale)



class _HashObject(Protocol):
    def hexdigest(self) -> str: ...


HASHES: dict[str, Callable[[bytes], _HashObject]] = {"md5": hashlib.md5, "sha-256": hashlib.sha256}
_TOKEN = re.compile(r"[!#$%&'*+\-.0-9A-Z^_`a-z|~]+")
_USERNAME = re.compile(r'[!#-\[\]-~]+')  # printable ASCII but for space, '"' and '\\'
_NC = re.compile(r"[0-9a-fA-F]{8}")
_NONCE = re.compile(r"([0-9a-f]{1,12})-([0-9a-f]{16})-([0-9a-f]{32})")


class DigestError(ValueError):
    """A users spec, challenge or credentials header we cannot use (never holding a password)."""


@dataclass(frozen=True)
class DigestResult:
    user: str | None  # the authenticated user; None when refused
    refusal: str | None  # a short reason token when refused, None when accepted
    stale: bool = False  # the password was right but the nonce expired: challenge again with stale=true


def parse_users(spec: str) -> dict[str, str]:
    """``user:password[,user2:pw2]`` as a dict; errors name the entry by position, never its text."""
    users: dict[str, str] = {}
    if not spec.strip():
        return users
    for number, entry in enumerate(spec.split(","), start=1):
        user, colon, password = entry.strip().partition(":")
        if not colon or not user or not password:
            raise DigestError(f"users entry {number}: expected user:password")
        if _USERNAME.fullmatch(user) is None:
            raise DigestError(f"users entry {number}: the user name may hold no space, quote or backslash")
        if user in users:
            raise DigestError(f"users entry {number}: user {user!r} is given twice")
        users[user] = password
    return users


class DigestAuth:
    """Challenges and checks ``Authorization: Digest`` headers for one realm."""

    def __init__(self, users: dict[str, str], realm: str = "callqa", secret: bytes | None = None,
                 nonce_ttl_s: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        if '"' in realm or "\\" in realm:
            raise DigestError("realm may not hold '\"' or '\\'")
        self._users = dict(users)
        self.realm = realm
        self._secret = secret if secret is not None else os.urandom(32)
        self._ttl = nonce_ttl_s
        self._clock = clock
        self._issued: OrderedDict[str, tuple[float, int]] = OrderedDict()  # nonce -> (issued, highest nc used)

    def challenge(self, stale: bool = False) -> str:
        """The value of a 401's ``WWW-Authenticate`` header, with a fresh nonce."""
        nonce = self._nonce()
        now = self._clock()
        while self._issued and (len(self._issued) >= MAX_ISSUED_NONCES
                                or now - next(iter(self._issued.values()))[0] > self._ttl):
            self._issued.popitem(last=False)
        self._issued[nonce] = (now, 0)
        value = f'Digest realm="{self.realm}", nonce="{nonce}", algorithm=MD5, qop="auth"'
        return value + ", stale=true" if stale else value

    def check(self, method: str, authorization: str | None, request_uri: str | None = None) -> DigestResult:
        """Whether ``authorization`` (the header value, or None) proves a known user for ``method``.

        With ``request_uri``, the credentials' ``uri`` must name the same target (RFC 2617 §3.2.2.5): its
        scheme, host and port, as :func:`same_target` compares them; without it, the ``uri`` is still what
        the response is checked over.
        """
        words = (authorization or "").split(None, 1)
        if not words or words[0].lower() != "digest":
            return _refused("no_credentials")  # none, or another scheme's (Basic): nothing we can check
        try:
            _scheme, params = parse_header(authorization or "")
        except DigestError:
            return _refused("malformed")
        problem = _missing_or_unsupported(params)
        if problem is not None:
            return _refused(problem)
        user = params["username"]
        if params["realm"] != self.realm:
            return _refused("bad_realm")
        if request_uri is not None and not same_target(params["uri"], request_uri):
            return _refused("bad_uri")
        freshness = self._nonce_freshness(params["nonce"])
        if freshness == "forged":
            return _refused("bad_nonce")
        password = self._users.get(user)
        if password is None:
            return _refused("unknown_user")
        expected = _response(params.get("algorithm", "md5").lower(), user, self.realm, password, method,
                             params["uri"], params["nonce"], params.get("qop"), params.get("nc"),
                             params.get("cnonce"))
        if not hmac.compare_digest(expected.encode(), params["response"].lower().encode("utf-8", "surrogatepass")):
            return _refused("bad_response")
        issued = self._issued.get(params["nonce"])
        if freshness == "expired" or issued is None:
            # RFC 2617 §3.2.1: stale only when the digest was right, so the client retries silently.
            self._issued.pop(params["nonce"], None)
            return DigestResult(None, "stale_nonce", stale=True)
        nc = int(params["nc"], 16) if "nc" in params else None  # 8 hex digits (checked above)
        if nc is None and issued[1] or nc is not None and nc <= issued[1]:
            return _refused("replayed_nonce")
        self._issued[params["nonce"]] = (issued[0], nc if nc is not None else 1)
        return DigestResult(user, None)

    def _nonce(self) -> str:
        stamp = f"{int(self._clock()):x}"
        salt = secrets.token_hex(8)
        return f"{stamp}-{salt}-{self._mac(stamp, salt)}"

    def _mac(self, stamp: str, salt: str) -> str:
        message = f"{stamp}-{salt}-{self.realm}".encode()
        return hmac.new(self._secret, message, hashlib.sha256).hexdigest()[:32]

    def _nonce_freshness(self, nonce: str) -> str:
        """'fresh', 'expired' or 'forged' (not ours, or altered)."""
        match = _NONCE.fullmatch(nonce) if len(nonce) <= MAX_NONCE_CHARS else None
        if match is None:
            return "forged"
        stamp, salt, mac = match.groups()
        if not hmac.compare_digest(self._mac(stamp, salt), mac):
            return "forged"
        age = self._clock() - int(stamp, 16)
        return "fresh" if -FUTURE_SKEW_S <= age <= self._ttl else "expired"


def same_target(uri: str, request_uri: str) -> bool:
    """Whether two SIP URIs name the same scheme, host and port (the default port when none is written).
    The user part and parameters are not compared: SIPp and some SBCs answer a challenge for
    ``sip:srs@host:port`` with ``uri="sip:host:port"``; credentials for another server still fail."""
    target = _target(uri)
    return target is not None and target == _target(request_uri)


def _target(uri: str) -> tuple[str, str, str] | None:
    scheme, colon, rest = uri.strip().partition(":")
    if not colon:
        return None
    host_port = rest.split(";", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1].lower()
    if host_port.startswith("["):  # an IPv6 reference: [::1]:5060
        host, _, port = host_port[1:].partition("]")
        port = port.lstrip(":")
    else:
        host, _, port = host_port.partition(":")
    default = "5061" if scheme.lower() == "sips" else "5060"
    return scheme.lower(), host, port or default


def _refused(reason: str) -> DigestResult:
    return DigestResult(None, reason)


def _missing_or_unsupported(params: dict[str, str]) -> str | None:
    """The refusal for credentials lacking a required parameter or using what we do not support."""
    for name in ("username", "realm", "nonce", "uri", "response"):
        if not params.get(name):
            return "malformed"
    if params.get("algorithm", "md5").lower() not in HASHES:
        return "bad_algorithm"
    qop = params.get("qop")
    if qop is None:
        # RFC 2069 compatibility (RFC 2617 §3.2.2): no qop, so no nc and no cnonce either.
        return "malformed" if "nc" in params or "cnonce" in params else None
    if qop.lower() != "auth":
        return "bad_qop"
    if _NC.fullmatch(params.get("nc", "")) is None or not params.get("cnonce"):
        return "malformed"
    return None


def _response(algorithm: str, user: str, realm: str, password: str, method: str, uri: str, nonce: str,
              qop: str | None, nc: str | None, cnonce: str | None) -> str:
    """The request-digest of RFC 2617 §3.2.2.1 (RFC 7616 §3.4.1 for SHA-256)."""
    digest = HASHES[algorithm]

    def hash_hex(text: str) -> str:
        # surrogatepass: a header decoded with surrogateescape must hash, not raise
        return digest(text.encode("utf-8", "surrogatepass")).hexdigest()

    ha1 = hash_hex(f"{user}:{realm}:{password}")
    ha2 = hash_hex(f"{method}:{uri}")
    if qop is None:
        return hash_hex(f"{ha1}:{nonce}:{ha2}")
    return hash_hex(f"{ha1}:{nonce}:{nc}:{cnonce}:{qop.lower()}:{ha2}")


def authorization(method: str, uri: str, user: str, password: str, challenge: str, cnonce: str | None = None,
                  nc: int = 1) -> str:
    """The ``Authorization`` header value answering ``challenge`` (a ``WWW-Authenticate`` value)."""
    scheme, params = parse_header(challenge)
    if scheme != "digest":
        raise DigestError(f"challenge: scheme {scheme[:20]!r} is not Digest")
    realm, nonce = params.get("realm"), params.get("nonce")
    if realm is None or not nonce:
        raise DigestError("challenge: needs realm and nonce")
    algorithm = params.get("algorithm", "MD5")
    if algorithm.lower() not in HASHES:
        raise DigestError(f"challenge: algorithm {algorithm[:20]!r} is not supported")
    offered_qops = {option.strip().lower() for option in params.get("qop", "").split(",") if option.strip()}
    if offered_qops and "auth" not in offered_qops:
        raise DigestError("challenge: offers no qop we support (auth)")
    fields = [("username", _quoted(user)), ("realm", _quoted(realm)), ("nonce", _quoted(nonce)),
              ("uri", _quoted(uri))]
    if offered_qops:
        cnonce = cnonce if cnonce is not None else secrets.token_hex(8)
        nc_text = f"{nc:08x}"
        response = _response(algorithm.lower(), user, realm, password, method, uri, nonce, "auth", nc_text, cnonce)
        fields += [("response", _quoted(response)), ("algorithm", algorithm), ("cnonce", _quoted(cnonce)),
                   ("qop", "auth"), ("nc", nc_text)]
    else:
        response = _response(algorithm.lower(), user, realm, password, method, uri, nonce, None, None, None)
        fields += [("response", _quoted(response)), ("algorithm", algorithm)]
    if "opaque" in params:
        fields.append(("opaque", _quoted(params["opaque"])))
    return "Digest " + ", ".join(f"{name}={value}" for name, value in fields)


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_header(value: str) -> tuple[str, dict[str, str]]:
    """(lower-case scheme, parameters by lower-case name) of a ``WWW-Authenticate`` or ``Authorization``
    value: ``Scheme name=token, name="quoted, \\"string\\"", ...``."""
    if len(value) > MAX_HEADER_CHARS:
        raise DigestError(f"header: more than {MAX_HEADER_CHARS} characters")
    pos = _skip(value, 0, " \t")
    scheme_match = _TOKEN.match(value, pos)
    if scheme_match is None:
        raise DigestError("header: no auth scheme")
    params: dict[str, str] = {}
    pos = scheme_match.end()
    while True:
        pos = _skip(value, pos, " \t,")  # empty list elements are allowed (RFC 7230 §7)
        if pos >= len(value):
            return scheme_match.group().lower(), params
        name, item_value, pos = _parameter(value, pos)
        if name in params:
            raise DigestError(f"header: parameter {name[:20]!r} given twice")
        if len(params) == MAX_PARAMETERS:
            raise DigestError(f"header: more than {MAX_PARAMETERS} parameters")
        params[name] = item_value
        pos = _skip(value, pos, " \t")
        if pos < len(value) and value[pos] != ",":
            raise DigestError(f"header: expected ',' at character {pos}")


def _parameter(value: str, pos: int) -> tuple[str, str, int]:
    name_match = _TOKEN.match(value, pos)
    if name_match is None:
        raise DigestError(f"header: expected a parameter name at character {pos}")
    name = name_match.group().lower()
    pos = _skip(value, name_match.end(), " \t")
    if pos >= len(value) or value[pos] != "=":
        raise DigestError(f"header: parameter {name[:20]!r} has no value")
    pos = _skip(value, pos + 1, " \t")
    if pos < len(value) and value[pos] == '"':
        text, pos = _quoted_string(value, pos + 1)
        return name, text, pos
    token_match = _TOKEN.match(value, pos)
    if token_match is None:
        raise DigestError(f"header: parameter {name[:20]!r} has an empty value")
    return name, token_match.group(), token_match.end()


def _quoted_string(value: str, pos: int) -> tuple[str, int]:
    """The unescaped text of a quoted string whose opening quote is just before ``pos``."""
    quoted = unquote_at(value, pos)
    if quoted is None:
        raise DigestError("header: unclosed quoted string")
    return quoted


def _skip(value: str, pos: int, chars: str) -> int:
    while pos < len(value) and value[pos] in chars:
        pos += 1
    return pos
