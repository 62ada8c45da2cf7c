"""Container image references read as the kubelet reads them, so that a policy on images judges
what will be pulled: the kubelet parses ``image`` with distribution/reference v0.6.0
``ParseNormalizedNamed`` (k8s.io/kubernetes pkg/util/parsers/parsers.go ``ParseImageName``) and
leaves a pod that fails it waiting in ``InvalidImageName`` for ever.

The grammar is distribution/reference's ``regexp.go`` (``name[:tag][@digest]``), the defaults
its ``normalize.go`` (``ubuntu`` is ``docker.io/library/ubuntu``, no tag and no digest is
``:latest``), the digest check opencontainers/go-digest v1.0.0 ``algorithm.go``. Matched with
RE2, whose time is linear in the reference, whatever a submitter writes.
"""
from __future__ import annotations

from dataclasses import dataclass

import re2
from .. import PolicyError

_ALNUM = r"[a-z0-9]+"
_SEPARATOR = r"(?:[._]|__|[-]+)"
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[(?:[a-fA-F0-9:]+)\])"
_DOMAIN = rf"{_HOST}(?::[0-9]+)?"
_PATH = rf"{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*(?:/{_ALNUM}(?:{_SEPARATOR}{_ALNUM})*)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*[:][0-9a-fA-F]{32,}"
_REFERENCE = re2.compile(rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_PATH})(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?")
_IDENTIFIER = re2.compile(r"[a-f0-9]{64}")
_HEX = re2.compile(r"[a-f0-9]+")
DIGEST_LENGTHS = {"sha256": 64, "sha384": 96, "sha512": 128}  # go-digest's algorithms, in hex characters
MAX_PATH = 255  # RepositoryNameTotalLengthMax
DEFAULT_DOMAIN = "docker.io"
PINNED = "sha256"  # what a digest-pinning policy asks for


class InvalidImage(PolicyError, ValueError):
    """A reference the kubelet cannot pull; the message says why."""


@dataclass(frozen=True)
class ImageRef:
    domain: str  # "docker.io" for a bare name; "" when the first component is no host
    path: str  # "library/ubuntu", "team/train"
    tag: str | None
    digest: str | None  # "sha256:<hex>"

    @property
    def repository(self) -> str:
        return f"{self.domain}/{self.path}" if self.domain else self.path

    @property
    def pulled(self) -> str:
        """What the container runtime fetches: the digest when there is one (a tag beside it is
        ignored), else the tag, ``latest`` by default."""
        return f"{self.repository}@{self.digest}" if self.digest else f"{self.repository}:{self.tag or 'latest'}"

    @property
    def pinned(self) -> bool:
        return bool(self.digest and self.digest.startswith(PINNED + ":"))

    def covers(self, image: ImageRef) -> bool:
        """As an allow-list entry: the same repository, and the tag and digest this entry names, if any."""
        if self.repository != image.repository:
            return False
        if self.digest and self.digest != image.digest:
            return False
        return not self.tag or self.tag == (image.tag or ("latest" if not image.digest else None))


def parse(image: object) -> ImageRef:
    """The reference as the kubelet reads it; InvalidImage says why it cannot."""
    if not isinstance(image, str) or not image:
        raise InvalidImage("an image must be a non-empty string")
    if _IDENTIFIER.fullmatch(image):
        raise InvalidImage("a bare 64-character hex string is an image ID, not a reference")
    domain, remainder = _split_domain(image)
    if remainder.partition(":")[0].lower() != remainder.partition(":")[0]:
        raise InvalidImage("the repository name must be lowercase")
    match = _REFERENCE.fullmatch(f"{domain}/{remainder}")
    if match is None:
        raise InvalidImage("not name[:tag][@digest] (e.g. quay.io/team/train:1.2@sha256:<64 hex>)")
    # A first component that is no valid host ("my_registry.io") is read as part of the path, as Parse does.
    path = match.group("path")
    if len(path) > MAX_PATH:
        raise InvalidImage(f"the repository name is {len(path)} characters, more than {MAX_PATH}")
    digest = match.group("digest")
    if digest:
        _check_digest(digest)
    return ImageRef(match.group("domain") or "", path, match.group("tag"), digest)


def registry(image: str) -> str:
    """The registry an image is pulled from, as the kubelet reads the name ("docker.io" for bare
    names and index.docker.io), for any string: the registry allow-list judges references that
    may not parse."""
    return _split_domain(image)[0]


def _split_domain(name: str) -> tuple[str, str]:
    """normalize.go splitDockerDomain: the first component is a registry only if it looks like a
    host (a dot or a port, localhost, capitals); Docker Hub's official images live under library/."""
    first, sep, rest = name.partition("/")
    if not sep:
        return DEFAULT_DOMAIN, "library/" + name
    if first == "localhost" or any(c in first for c in ".:") or first.lower() != first:
        domain, remote = (DEFAULT_DOMAIN if first == "index.docker.io" else first), rest
    else:
        domain, remote = DEFAULT_DOMAIN, name
    if domain == DEFAULT_DOMAIN and "/" not in remote:
        remote = "library/" + remote
    return domain, remote


def _check_digest(digest: str) -> None:
    """go-digest Validate: a known algorithm with exactly its number of lowercase hex characters."""
    algorithm, _, encoded = digest.partition(":")
    length = DIGEST_LENGTHS.get(algorithm)
    if length is None:
        raise InvalidImage(f"digest algorithm {algorithm!r} is not supported (use sha256)")
    if len(encoded) != length:
        raise InvalidImage(f"a {algorithm} digest has {length} hex characters, this one {len(encoded)}")
    if not _HEX.fullmatch(encoded):
        raise InvalidImage(f"the {algorithm} digest must be lowercase hex")
