"""SSH key pairs for the MPI Secret: formats OpenSSH reads, round trips, and no leaks via repr."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from trainjob_admission.webhook.inject.keys import KEY_TYPES, KeyPair, KeyPool, fingerprint, generate

EXPECTED = {
    "rsa-4096": (b"-----BEGIN RSA PRIVATE KEY-----", b"ssh-rsa "),
    "ecdsa-p384": (b"-----BEGIN EC PRIVATE KEY-----", b"ecdsa-sha2-nistp384 "),
    "ecdsa-p521": (b"-----BEGIN EC PRIVATE KEY-----", b"ecdsa-sha2-nistp521 "),
    "ed25519": (b"-----BEGIN OPENSSH PRIVATE KEY-----", b"ssh-ed25519 "),
}
SSH_KEYGEN = shutil.which("ssh-keygen")


@pytest.fixture(scope="module")
def pairs() -> dict[str, KeyPair]:
    return {t: generate(t) for t in KEY_TYPES}  # type: ignore[arg-type]


def load_private(pair: KeyPair) -> object:
    if pair.key_type == "ed25519":
        return serialization.load_ssh_private_key(pair.private_pem, password=None)
    return serialization.load_pem_private_key(pair.private_pem, password=None)


@pytest.mark.parametrize("key_type", KEY_TYPES)
def test_private_key_derives_the_public_line(pairs: dict[str, KeyPair], key_type: str) -> None:
    pair = pairs[key_type]
    header, prefix = EXPECTED[key_type]
    assert pair.key_type == key_type
    assert pair.private_pem.startswith(header)
    assert pair.public_openssh.startswith(prefix) and pair.public_openssh.endswith(b"\n")
    assert pair.public_openssh.count(b" ") == 1  # "<type> <base64>\n" like ssh.MarshalAuthorizedKey
    key = load_private(pair)
    derived = key.public_key().public_bytes(serialization.Encoding.OpenSSH,  # type: ignore[attr-defined]
                                            serialization.PublicFormat.OpenSSH) + b"\n"
    assert derived == pair.public_openssh


def test_key_sizes_and_curves(pairs: dict[str, KeyPair]) -> None:
    rsa_key = load_private(pairs["rsa-4096"])
    assert isinstance(rsa_key, rsa.RSAPrivateKey) and rsa_key.key_size == 4096
    assert rsa_key.private_numbers().public_numbers.e == 65537
    p384, p521 = load_private(pairs["ecdsa-p384"]), load_private(pairs["ecdsa-p521"])
    assert isinstance(p384, ec.EllipticCurvePrivateKey) and p384.curve.name == "secp384r1"
    assert isinstance(p521, ec.EllipticCurvePrivateKey) and p521.curve.name == "secp521r1"
    assert isinstance(load_private(pairs["ed25519"]), ed25519.Ed25519PrivateKey)


@pytest.mark.parametrize("key_type", KEY_TYPES)
def test_each_call_makes_a_new_key(pairs: dict[str, KeyPair], key_type: str) -> None:
    again = generate(key_type)  # type: ignore[arg-type]
    assert again.private_pem != pairs[key_type].private_pem
    assert again.public_openssh != pairs[key_type].public_openssh
    assert again.fingerprint != pairs[key_type].fingerprint


def test_repr_hides_the_private_key(pairs: dict[str, KeyPair]) -> None:
    for pair in pairs.values():
        body_lines = pair.private_pem.decode().splitlines()[1:-1]
        for text in (repr(pair), str(pair), f"{pair}", repr([pair])):
            assert "PRIVATE" not in text
            assert not any(line in text for line in body_lines)
            assert pair.fingerprint in text and "<hidden>" in text


def test_unknown_key_type_is_rejected() -> None:
    with pytest.raises(ValueError, match="rsa-4096"):
        generate("dsa")  # type: ignore[arg-type]


def test_fingerprint_format(pairs: dict[str, KeyPair]) -> None:
    fp = fingerprint(pairs["ed25519"].public_openssh)
    assert fp == pairs["ed25519"].fingerprint
    assert fp.startswith("SHA256:") and len(fp) == len("SHA256:") + 43 and not fp.endswith("=")


@pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen not installed (Debian: openssh-client)")
@pytest.mark.parametrize("key_type", KEY_TYPES)
def test_openssh_reads_the_private_key(pairs: dict[str, KeyPair], key_type: str, tmp_path: Path) -> None:
    pair = pairs[key_type]
    key_file = tmp_path / "ssh-privatekey"
    key_file.write_bytes(pair.private_pem)
    key_file.chmod(0o600)  # ssh-keygen refuses keys others can read
    public = subprocess.run([SSH_KEYGEN, "-y", "-f", str(key_file)], check=True, capture_output=True).stdout
    assert public.split()[:2] == pair.public_openssh.split()
    listed = subprocess.run([SSH_KEYGEN, "-l", "-E", "sha256", "-f", str(key_file)],
                            check=True, capture_output=True).stdout.decode()
    assert listed.split()[1] == pair.fingerprint


def test_the_async_pool_hands_out_each_pair_once_and_makes_fast_types_fresh() -> None:
    async def take(pool: KeyPool, key_type: str, n: int) -> list[KeyPair]:
        return [await pool.take_async(key_type) for _ in range(n)]

    fast = asyncio.run(take(KeyPool(), "ed25519", 3))
    assert len({p.fingerprint for p in fast}) == 3 and {p.key_type for p in fast} == {"ed25519"}
    pool = KeyPool(size=1)
    pool.warm("rsa-4096")
    deadline = time.monotonic() + 60
    while not pool.ready("rsa-4096") and time.monotonic() < deadline:
        time.sleep(0.1)
    pooled, fresh = asyncio.run(take(pool, "rsa-4096", 2))  # the ready pair, then one made on a thread
    assert pooled.fingerprint != fresh.fingerprint and {pooled.key_type, fresh.key_type} == {"rsa-4096"}
