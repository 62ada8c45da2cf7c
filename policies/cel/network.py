"""Kubernetes' IP and CIDR libraries of CEL (k8s.io/apiserver@v0.36.3 pkg/cel/library/ip.go and
cidr.go) on Go's net/netip rules: strict dotted IPv4 (no leading zeros), IPv6 written back in
RFC 5952 form, no zones, no IPv4-mapped IPv6, a prefix kept as written (``masked()`` masks it)."""
from __future__ import annotations

import ipaddress
from typing import Any

from .functions import Overload, overload, register_type
from .strings import go_quote
from .values import CelType, Err, no_such_overload

IP_LIBRARY, CIDR_LIBRARY = "kubernetes.ip", "kubernetes.cidr"
IP_TYPE, CIDR_TYPE = CelType("net.IP"), CelType("net.CIDR")


class IP:
    __slots__ = ("address",)
    cel_type = IP_TYPE

    def __init__(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address):
        self.address = address

    def cel_equals(self, other: Any) -> Any:
        return self.address == other.address if type(other) is IP else no_such_overload(other)

    def cel_string(self) -> str:
        return str(self.address)


class CIDR:
    __slots__ = ("address", "bits")
    cel_type = CIDR_TYPE

    def __init__(self, address: ipaddress.IPv4Address | ipaddress.IPv6Address, bits: int):
        self.address, self.bits = address, bits

    def cel_equals(self, other: Any) -> Any:
        if type(other) is not CIDR:
            return no_such_overload(other)
        return self.address == other.address and self.bits == other.bits

    def cel_string(self) -> str:
        return f"{self.address}/{self.bits}"

    def network(self) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        return ipaddress.ip_network(f"{self.address}/{self.bits}", strict=False)


register_type(IP_TYPE.name, IP)
register_type(CIDR_TYPE.name, CIDR)


class AddressError(ValueError):
    pass


def _parse_address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """netip.ParseAddr without zones (Python's parser is as strict about IPv4 octets)."""
    if "%" in text:
        raise AddressError("zone")
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        raise AddressError(f"ParseAddr({go_quote(text)}): unable to parse IP") from None
    return address


def _to_ip(text: str) -> Any:
    if "%" in text:
        return Err(f"IP address {go_quote(text)} with zone value is not allowed")
    try:
        address = _parse_address(text)
    except AddressError as exc:
        return Err(f"IP Address {go_quote(text)} parse error during conversion from string: {exc}")
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return Err(f"IPv4-mapped IPv6 address {go_quote(text)} is not allowed")
    return IP(address)


def _to_cidr(text: str) -> Any:
    failure = Err("network address parse error during conversion from string: network address parse error during "
                  f"conversion from string: netip.ParsePrefix({go_quote(text)}): invalid prefix")
    address_text, slash, bits_text = text.rpartition("/")
    if not slash or "%" in address_text or not bits_text.isascii() or not bits_text.isdigit() \
            or (len(bits_text) > 1 and bits_text[0] == "0"):
        return failure
    try:
        address = _parse_address(address_text)
    except AddressError:
        return failure
    bits = int(bits_text)
    if bits > address.max_prefixlen:
        return failure
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return Err(f"network address parse error during conversion from string: IPv4-mapped IPv6 address "
                   f"{go_quote(text)} is not allowed")
    return CIDR(address, bits)


def _is_global_unicast(ip: IP) -> bool:
    """netip.Addr.IsGlobalUnicast: private and ULA addresses count, as in Go."""
    address = ip.address
    if isinstance(address, ipaddress.IPv4Address) and int(address) in (0, 0xFFFFFFFF):
        return False
    return not (address.is_unspecified or address.is_loopback or address.is_multicast or _link_local(address))


def _link_local(address: Any) -> bool:
    if isinstance(address, ipaddress.IPv4Address):
        return address in ipaddress.IPv4Network("169.254.0.0/16")
    return address in ipaddress.IPv6Network("fe80::/10")


def _link_local_multicast(ip: IP) -> bool:
    address = ip.address
    if isinstance(address, ipaddress.IPv4Address):
        return address in ipaddress.IPv4Network("224.0.0.0/24")
    return address in ipaddress.IPv6Network("ff02::/16")


def _loopback(ip: IP) -> bool:
    address = ip.address
    if isinstance(address, ipaddress.IPv4Address):
        return address in ipaddress.IPv4Network("127.0.0.0/8")
    return int(address) == 1


def _containment(parse: Any, test: Any) -> Any:
    """containsIP / containsCIDR: the argument parsed when it is a string; another family is not
    contained."""
    def contains(cidr: CIDR, other: Any) -> Any:
        inner = parse(other) if type(other) is str else other
        if type(inner) is Err:
            return inner
        return type(inner.address) is type(cidr.address) and test(cidr, inner)
    return contains


_contains_ip = _containment(_to_ip, lambda cidr, ip: ip.address in cidr.network())
_contains_cidr = _containment(_to_cidr,
                              lambda cidr, inner: cidr.network().overlaps(inner.network()) and cidr.bits <= inner.bits)


def _is_canonical(text: str) -> Any:
    found = _to_ip(text)
    return found if type(found) is Err else str(found.address) == text


def _masked(cidr: CIDR) -> CIDR:
    return CIDR(cidr.network().network_address, cidr.bits)


_IP, _CIDR = "net.IP", "net.CIDR"
OVERLOADS: list[Overload] = [
    overload("ip", "string_to_ip", "string", _IP, _to_ip, library=IP_LIBRARY, example=("ip('10.0.0.1').family()", "4")),
    overload("string", "ip_to_string", _IP, "string", lambda ip: ip.cel_string(), library=IP_LIBRARY),
    overload("family", "ip_family", _IP, "int", lambda ip: ip.address.version, member=True, library=IP_LIBRARY,
             doc="4 or 6"),
    overload("ip.isCanonical", "ip_is_canonical", "string", "bool", _is_canonical, library=IP_LIBRARY,
             example=("ip.isCanonical('2001:db8::1')", "true")),
    overload("isIP", "is_ip", "string", "bool", lambda s: type(_to_ip(s)) is IP, library=IP_LIBRARY),
    overload("isUnspecified", "ip_is_unspecified", _IP, "bool", lambda ip: ip.address.is_unspecified, member=True,
             library=IP_LIBRARY),
    overload("isLoopback", "ip_is_loopback", _IP, "bool", _loopback, member=True, library=IP_LIBRARY),
    overload("isLinkLocalMulticast", "ip_is_link_local_multicast", _IP, "bool", _link_local_multicast, member=True,
             library=IP_LIBRARY),
    overload("isLinkLocalUnicast", "ip_is_link_local_unicast", _IP, "bool", lambda ip: _link_local(ip.address),
             member=True, library=IP_LIBRARY),
    overload("isGlobalUnicast", "ip_is_global_unicast", _IP, "bool", _is_global_unicast, member=True,
             library=IP_LIBRARY),
    overload("cidr", "string_to_cidr", "string", _CIDR, _to_cidr, library=CIDR_LIBRARY, example=("cidr('10.0.0.0/8').prefixLength()", "8")),
    overload("string", "cidr_to_string", _CIDR, "string", lambda c: c.cel_string(), library=CIDR_LIBRARY),
    overload("containsIP", "cidr_contains_ip_string", f"{_CIDR}, string", "bool", _contains_ip, member=True,
             library=CIDR_LIBRARY, example=("cidr('10.0.0.0/8').containsIP('10.1.2.3')", "true")),
    overload("containsIP", "cidr_contains_ip_ip", f"{_CIDR}, {_IP}", "bool", _contains_ip, member=True,
             library=CIDR_LIBRARY),
    overload("containsCIDR", "cidr_contains_cidr_string", f"{_CIDR}, string", "bool", _contains_cidr, member=True,
             library=CIDR_LIBRARY),
    overload("containsCIDR", "cidr_contains_cidr", f"{_CIDR}, {_CIDR}", "bool", _contains_cidr, member=True,
             library=CIDR_LIBRARY),
    overload("ip", "cidr_ip", _CIDR, _IP, lambda c: IP(c.address), member=True, library=CIDR_LIBRARY),
    overload("masked", "cidr_masked", _CIDR, _CIDR, _masked, member=True, library=CIDR_LIBRARY),
    overload("prefixLength", "cidr_prefix_length", _CIDR, "int", lambda c: c.bits, member=True, library=CIDR_LIBRARY),
    overload("isCIDR", "is_cidr", "string", "bool", lambda s: type(_to_cidr(s)) is CIDR, library=CIDR_LIBRARY),
]
