"""Kubernetes' URL library of CEL (k8s.io/apiserver@v0.36.3 pkg/cel/library/urls.go) on a port of
Go's net/url parsing (url.ParseRequestURI, url.Parse, Hostname, Port, EscapedPath, Query), so
``url(s)`` accepts and splits exactly what kube-apiserver does."""
from __future__ import annotations

from typing import Any, Optional as Maybe

from .functions import Overload, overload, register_type
from .strings import go_quote
from .values import CelType, Err, no_such_overload

LIBRARY = "kubernetes.urls"
URL_TYPE = CelType("kubernetes.URL")
_PATH, _HOST, _ZONE, _USER, _QUERY, _FRAGMENT = "path", "host", "zone", "user", "query", "fragment"
_HEX = "0123456789abcdefABCDEF"


class UrlError(ValueError):
    pass


class Url:
    __slots__ = ("scheme", "opaque", "user", "host", "path", "raw_path", "raw_query", "fragment", "force_query",
                 "omit_host", "text")
    cel_type = URL_TYPE

    def cel_equals(self, other: Any) -> Any:
        if type(other) is not Url:
            return no_such_overload(other)
        return self.text == other.text


register_type(URL_TYPE.name, Url)


def _should_escape(c: int, mode: str) -> bool:
    """net/url's shouldEscape for one byte."""
    ch = chr(c)
    if ch.isascii() and ch.isalnum():
        return False
    if mode in (_HOST, _ZONE) and ch in "!$&'()*+,;=:[]<>\"":
        return False
    if ch in "-_.~":
        return False
    if ch in "$&+,/:;=?@":
        if mode == _PATH:
            return ch == "?"
        if mode == _USER:
            return ch in "@/?:"
        if mode == _QUERY:
            return True
        if mode == _FRAGMENT:
            return False
    if mode == _FRAGMENT and ch in "!()*":
        return False
    return True


def _quote(text: str) -> str:
    """strconv.Quote, enough for the few characters an escape error shows."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _unescape(text: str, mode: str) -> str:
    data = text.encode("utf-8", "surrogateescape")
    count, plus = 0, False
    i = 0
    while i < len(data):
        b = data[i]
        if b == 0x25:  # %
            count += 1
            if i + 2 >= len(data) or chr(data[i + 1]) not in _HEX or chr(data[i + 2]) not in _HEX:
                raise UrlError("invalid URL escape " + _quote(data[i:i + 3].decode("utf-8", "replace")))
            if mode == _HOST and int(chr(data[i + 1]), 16) < 8 and data[i:i + 3] != b"%25":
                raise UrlError("invalid URL escape " + _quote(data[i:i + 3].decode()))
            if mode == _ZONE:
                v = int(data[i + 1:i + 3].decode(), 16)
                if data[i:i + 3] != b"%25" and v != 0x20 and _should_escape(v, _HOST):
                    raise UrlError("invalid URL escape " + _quote(data[i:i + 3].decode()))
            i += 3
        elif b == 0x2B:  # +
            plus = mode == _QUERY
            i += 1
        else:
            if mode in (_HOST, _ZONE) and b < 0x80 and _should_escape(b, mode):
                raise UrlError("invalid character " + _quote(chr(b)) + " in host name")
            i += 1
    if count == 0 and not plus:
        return text
    out = bytearray()
    i = 0
    while i < len(data):
        b = data[i]
        if b == 0x25:
            out.append(int(data[i + 1:i + 3].decode(), 16))
            i += 3
            continue
        out.append(0x20 if b == 0x2B and mode == _QUERY else b)
        i += 1
    return out.decode("utf-8", "surrogateescape")


def _escape(text: str, mode: str) -> str:
    out = []
    for b in text.encode("utf-8", "surrogateescape"):
        if b == 0x20 and mode == _QUERY:
            out.append("+")
        elif _should_escape(b, mode):
            out.append(f"%{b:02X}")
        else:
            out.append(chr(b))
    return "".join(out)


def _scheme(raw: str) -> tuple[str, str]:
    for i, c in enumerate(raw):
        if c.isascii() and c.isalpha():
            continue
        if c.isascii() and (c.isdigit() or c in "+-."):
            if i == 0:
                return "", raw
            continue
        if c == ":":
            if i == 0:
                raise UrlError("missing protocol scheme")
            return raw[:i], raw[i + 1:]
        return "", raw
    return "", raw


def _valid_port(port: str) -> bool:
    return port == "" or (port[0] == ":" and all("0" <= c <= "9" for c in port[1:]))


def _host(scheme: str, host: str) -> str:
    bracket = host.rfind("[")
    if bracket > 0:
        raise UrlError("invalid IP-literal")
    if bracket == 0:
        close = host.rfind("]")
        if close < 0:
            raise UrlError("missing ']' in host")
        colon_port = host[close + 1:]
        if not _valid_port(colon_port):
            raise UrlError(f"invalid port {_quote(colon_port)} after host")
        port = _unescape(colon_port, _HOST)
        name = host[1:close]
        zone = name.find("%25")
        unescaped = (_unescape(name[:zone], _HOST) + _unescape(name[zone:], _ZONE)) if zone >= 0 else _unescape(name, _HOST)
        from ipaddress import IPv6Address, ip_address
        try:
            address = ip_address(unescaped.split("%")[0])
        except ValueError:
            raise UrlError(f"invalid host: ParseAddr({_quote(unescaped)}): unable to parse IP") from None
        if not isinstance(address, IPv6Address):
            raise UrlError("invalid IP-literal")
        return "[" + unescaped + "]" + port
    first = host.find(":")
    if first != -1:
        if host.rfind(":") != first and scheme not in ("http", "https"):
            first = host.rfind(":")
        colon_port = host[first:]
        if not _valid_port(colon_port):
            raise UrlError(f"invalid port {_quote(colon_port)} after host")
    return _unescape(host, _HOST)


_USERINFO = frozenset("-._:~!$&'()*+,;=%@")


def _authority(scheme: str, authority: str) -> tuple[Maybe[str], str]:
    at = authority.rfind("@")
    host = _host(scheme, authority[at + 1:] if at >= 0 else authority)
    if at < 0:
        return None, host
    userinfo = authority[:at]
    if not all((c.isascii() and c.isalnum()) or c in _USERINFO for c in userinfo):
        raise UrlError("net/url: invalid userinfo")
    for part in userinfo.split(":", 1):
        _unescape(part, _USER)
    return userinfo, host


def parse(raw: str, via_request: bool) -> Url:
    """net/url's parse(): raises UrlError with Go's message (without the ``parse "...":`` prefix)."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in raw):
        raise UrlError("net/url: invalid control character in URL")
    if raw == "" and via_request:
        raise UrlError("empty url")
    url = Url()
    url.scheme = url.opaque = url.host = url.path = url.raw_path = url.raw_query = url.fragment = ""
    url.user, url.force_query, url.omit_host, url.text = None, False, False, raw
    if raw == "*":
        url.path = "*"
        return url
    scheme, rest = _scheme(raw)
    url.scheme = scheme.lower()
    if rest.endswith("?") and rest.count("?") == 1:
        url.force_query, rest = True, rest[:-1]
    else:
        rest, _, url.raw_query = rest.partition("?")
    if not rest.startswith("/"):
        if url.scheme:
            url.opaque = rest
            return url
        if via_request:
            raise UrlError("invalid URI for request")
        if ":" in rest.partition("/")[0]:
            raise UrlError("first path segment in URL cannot contain colon")
    if (url.scheme or (not via_request and not rest.startswith("///"))) and rest.startswith("//"):
        authority, slash, path = rest[2:].partition("/")
        rest = slash + path
        url.user, url.host = _authority(url.scheme, authority)
    elif url.scheme and rest.startswith("/"):
        url.omit_host = True
    path = _unescape(rest, _PATH)
    url.path = path
    url.raw_path = "" if _escape(path, _PATH) == rest else rest
    return url


def _escaped_path(url: Url) -> str:
    raw = url.raw_path
    if raw and all(c in "!$&'()*+,;=:@[]%" or not _should_escape(ord(c), _PATH) for c in raw if ord(c) < 0x100):
        try:
            if _unescape(raw, _PATH) == url.path:
                return raw
        except UrlError:
            pass
    if url.path == "*":
        return "*"
    return _escape(url.path, _PATH)


def _split_host_port(host_port: str) -> tuple[str, str]:
    host, port = host_port, ""
    colon = host.rfind(":")
    if colon != -1 and _valid_port(host[colon:]):
        host, port = host[:colon], host[colon + 1:]
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def _query(url: Url) -> dict:
    values: dict[str, list[str]] = {}
    for pair in url.raw_query.split("&") if url.raw_query else []:
        if ";" in pair or pair == "":
            continue
        key, _, value = pair.partition("=")
        try:
            key, value = _unescape(key, _QUERY), _unescape(value, _QUERY)
        except UrlError:
            continue
        values.setdefault(key, []).append(value)
    return values


def to_url(text: str) -> Any:
    """url(): ParseRequestURI must accept it, then url.Parse gives the value (its fragment split off)."""
    try:
        parse(text, True)
        body, _, fragment = text.partition("#")
        url = parse(body, False)
        url.fragment, url.text = fragment, text
        return url
    except UrlError as exc:
        return Err(f"URL parse error during conversion from string: parse {go_quote(text)}: {exc}")


def is_url(text: str) -> bool:
    try:
        parse(text, True)
    except UrlError:
        return False
    return True


OVERLOADS: list[Overload] = [
    overload("url", "string_to_url", "string", "kubernetes.URL", to_url, library=LIBRARY,
             example=("url('https://example.com:80/path?k=v').getHostname()", "'example.com'"), doc="an error unless an absolute URI or an absolute path"),
    overload("getScheme", "url_get_scheme", "kubernetes.URL", "string", lambda u: u.scheme, member=True,
             library=LIBRARY),
    overload("getHost", "url_get_host", "kubernetes.URL", "string", lambda u: u.host, member=True, library=LIBRARY,
             example=("url('https://example.com:80/p').getHost()", "'example.com:80'")),
    overload("getHostname", "url_get_hostname", "kubernetes.URL", "string", lambda u: _split_host_port(u.host)[0],
             member=True, library=LIBRARY),
    overload("getPort", "url_get_port", "kubernetes.URL", "string", lambda u: _split_host_port(u.host)[1],
             member=True, library=LIBRARY),
    overload("getEscapedPath", "url_get_escaped_path", "kubernetes.URL", "string", _escaped_path, member=True,
             library=LIBRARY),
    overload("getQuery", "url_get_query", "kubernetes.URL", "map(string, list(string))", _query, member=True,
             library=LIBRARY, example=("url('/p?a=1&a=2').getQuery()", "{'a': ['1', '2']}")),
    overload("isURL", "is_url_string", "string", "bool", is_url, library=LIBRARY),
]
