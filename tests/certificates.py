"""A throwaway PKI for TLS tests: a CA, a server certificate for 127.0.0.1/localhost and
a client certificate, each signed by the CA, written as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return path


def _certificate(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: str,
    issuer_key: ec.EllipticCurvePrivateKey,
    *extensions: tuple[x509.ExtensionType, bool],
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(_name(issuer))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    """New keys and certificates under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _certificate(
        "conch test CA",
        ca_key,
        "conch test CA",
        ca_key,
        (x509.BasicConstraints(ca=True, path_length=None), True),
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = _certificate(
        "localhost",
        server_key,
        "conch test CA",
        ca_key,
        (
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            False,
        ),
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client = _certificate("conch test client", client_key, "conch test CA", ca_key)
    pem = serialization.Encoding.PEM
    (directory / "ca.pem").write_bytes(ca.public_bytes(pem))
    (directory / "server.pem").write_bytes(server.public_bytes(pem))
    (directory / "client.pem").write_bytes(client.public_bytes(pem))
    return Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=_write_key(server_key, directory / "server.key"),
        client_cert=directory / "client.pem",
        client_key=_write_key(client_key, directory / "client.key"),
    )
