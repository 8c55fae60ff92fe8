"""Who may use the server: the API key, the ``Host`` of a request and the ``Origin`` of a WebSocket.

* **API key** (``--api-key-file``, ``$ISAN_API_KEY``): :func:`authorized` compares it in constant
  time with ``Authorization: Bearer KEY``, ``X-API-Key: KEY`` or, on a WebSocket, ``?api_key=KEY``.
* **Host** (:func:`host_refused`): a request whose ``Host`` is not one of the server's names is
  refused with 403, so a web page cannot reach the server by rebinding its own DNS name to the
  server's address (it would otherwise be the server's own origin); an HTTP/1.1 request without
  ``Host``, with two, or with one that is not a host name or address is refused with 400
  (:func:`hosts_error`).
* **Origin** (:func:`origin_refused`): a WebSocket handshake that carries a web page's ``Origin``
  is refused unless that origin is the server's own, a loopback one, or one of ``--allow-origin``:
  without an API key, a web page could otherwise use the server through its visitors' browsers.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
from urllib.parse import parse_qs, urlsplit

from isan.engine.serve.config import host_name
from isan.engine.serve.errors import RequestError


def authorized(scope, key: bytes | None) -> bool:
    """Whether the request or handshake ``scope`` carries the API key ``key`` (its UTF-8 bytes;
    None: no key needed)."""
    if key is None:
        return True
    for name, value in scope.get("headers", ()):
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            if hmac.compare_digest(value[7:].strip(), key):
                return True
        elif name == b"x-api-key" and hmac.compare_digest(value.strip(), key):
            return True
    if scope["type"] == "websocket" and scope.get("query_string"):
        # latin-1 both ways keeps every byte: the percent-decoded bytes are compared, whatever they are
        for v in parse_qs(scope["query_string"].decode("latin-1"), encoding="latin-1").get("api_key", []):
            if hmac.compare_digest(v.encode("latin-1"), key):
                return True
    return False


def key_error(stream: bool = False) -> RequestError:
    """401 for a request (``stream``: a WebSocket handshake) without the server's API key."""
    if stream:
        return RequestError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY' or "
                                 "'X-API-Key: KEY', or connect to /v1/stream?api_key=KEY")
    return RequestError(401, "this server needs an API key: send the header 'Authorization: Bearer KEY' or "
                             "'X-API-Key: KEY'", headers={"WWW-Authenticate": 'Bearer realm="isan"',
                                                          "Connection": "close"})


_LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}


def _loopback_ip(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def origin_refused(scope, allowed: tuple[str, ...] = ()) -> str | None:
    """The ``Origin`` of a WebSocket handshake when it is refused, else None.

    Allowed: no ``Origin`` (a client that is not a browser), the server's own origin (its host and
    port are the ``Host`` header's), a loopback origin (``localhost``, ``127.0.0.0/8``, ``[::1]``),
    an origin in ``allowed`` (as the browser sends it, like ``https://app.example.com``) or ``*``
    in ``allowed``. A browser always sends ``Origin`` on a WebSocket and a page cannot change it.
    """
    origin = host = None
    for name, value in scope.get("headers", ()):
        if name == b"origin":
            origin = value.decode("latin-1").strip()
        elif name == b"host":
            host = value.decode("latin-1").strip().lower()
    if origin is None:
        return None
    if "*" in allowed or origin in allowed or origin.rstrip("/") in allowed:
        return None
    try:
        u = urlsplit(origin)
        oh = (u.hostname or "").lower()
        port = u.port
    except ValueError:
        return origin
    if u.scheme not in ("http", "https") or not oh:
        return origin
    if oh in _LOOPBACK or _loopback_ip(oh):
        return None
    if host is not None:
        default = 443 if u.scheme == "https" else 80
        netloc = oh if ":" not in oh else f"[{oh}]"
        if host in (f"{netloc}:{port or default}",) or (port in (None, default) and host == netloc):
            return None
    return origin


def origin_error(origin: str) -> RequestError:
    """403 for a WebSocket whose ``Origin`` :func:`origin_refused` refuses."""
    return RequestError(403, f"a WebSocket from the web page origin {origin!r} is refused: only the server's own "
                             f"origin and loopback ones are allowed; start the server with --allow-origin {origin} "
                             "to allow it")


def _ip(text: str):
    """``text`` as an IP address (an IPv4-mapped IPv6 address as its IPv4 one), else None."""
    try:
        ip = ipaddress.ip_address(text)
    except ValueError:
        return None
    return getattr(ip, "ipv4_mapped", None) or ip


@functools.lru_cache(maxsize=8)
def _names(allowed: tuple[str, ...]) -> frozenset:
    return frozenset(host_name(a) for a in allowed)


def host_refused(scope, allowed: tuple[str, ...] = ()) -> str | None:
    """The ``Host`` of a request or WebSocket handshake when it is refused, else None.

    A web page can make its visitors' browsers reach this server by pointing its own DNS name at
    the server's address (DNS rebinding); the page is then the server's own origin, but its
    requests carry its name in ``Host``. Allowed:

    * ``localhost`` and loopback addresses (``127.0.0.0/8``, ``[::1]``), with any port;
    * on a connection that came in on an address that is not loopback (a server bound to
      ``0.0.0.0``, ``::`` or a network address), any IP address too: no DNS name is involved;
    * the names in ``allowed`` (``--allow-host``; case-insensitive, any port), or any with ``*``;
    * a request without ``Host`` (HTTP/1.0, not a browser), and a connection without an IP address
      (an in-process ASGI client such as Starlette's TestClient, a Unix socket): not checked.

    Starlette's ``TrustedHostMiddleware`` is not used: it answers in plain text (the API's errors
    are JSON, and a refused stream gets an error frame) and has no rule for IP addresses.
    """
    server = scope.get("server")
    local = _ip(str(server[0])) if server else None
    if local is None or "*" in allowed:
        return None
    host = None
    for name, value in scope.get("headers", ()):
        if name == b"host":
            host = value.decode("latin-1")
            break
    if host is None:
        return None
    name = host_name(host)
    if name is None:
        return host
    if name == "localhost" or name in _names(allowed):
        return None
    ip = _ip(name)
    if ip is not None and (ip.is_loopback or not local.is_loopback):
        return None
    return host


def hosts_error(scope) -> RequestError | None:
    """400 for a request or WebSocket handshake whose ``Host`` header is malformed, else None.

    RFC 9112, section 3.2: a server must answer 400 to an HTTP/1.1 request without a ``Host``
    header, with more than one (two parties may each read another one), or with one whose value is
    not a host (a name or an address with an optional port; an empty one included). A request
    without ``Host`` in HTTP/1.0, which has none, is served.
    """
    hosts = [value for name, value in scope.get("headers", ()) if name == b"host"]
    if len(hosts) > 1:
        why = "the request has more than one Host header; send exactly one"
    elif not hosts:
        if scope.get("http_version", "1.1") == "1.0":
            return None
        why = (f"an HTTP/{scope.get('http_version', '1.1')} request must carry a Host header (the server's name or "
               "address, like 'Host: localhost:8000')")
    elif host_name(hosts[0].decode("latin-1")) is None:
        why = (f"the Host {hosts[0].decode('latin-1')[:100]!r} is not a host: send a name or an address with an "
               "optional port, like 'Host: localhost:8000'")
    else:
        return None
    return RequestError(400, why + " (RFC 9112, section 3.2)", headers={"Connection": "close"})


def host_error(host: str) -> RequestError:
    """403 for a request whose ``Host`` :func:`host_refused` refuses."""
    name = host_name(host)
    fix = (f"or, to serve the name {name!r}, start the server with --allow-host {name}" if name else
           "a Host header is a name or an address with an optional port")
    return RequestError(403, f"the Host {host[:100]!r} is not one of this server's names, so the request is refused "
                             "(a web page could otherwise reach the server by rebinding its own name to the server's "
                             f"address): connect to localhost or 127.0.0.1, {fix}")
