"""Throwaway RSA keys for fakes that check signatures (GitHub App JWTs, GCP key grants)."""

from __future__ import annotations

from functools import lru_cache

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa


@lru_cache(maxsize=4)
def rsa_pair(label: str = "default") -> tuple[str, str]:
    """(private PKCS#8 PEM, public SubjectPublicKeyInfo PEM), generated once per label."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public
