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


def _issue(
    subject: str,
    extension: x509.ExtensionType | None = None,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey] | None = None,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A new key and its certificate, signed by ``issuer`` (self-signed when None)."""
    key = ec.generate_private_key(ec.SECP256R1())
    issuer_name, issuer_key = (issuer[0].subject, issuer[1]) if issuer else (_name(subject), key)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )
    if extension is not None:
        critical = isinstance(extension, x509.BasicConstraints)
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256()), key


def make_pki(directory: Path) -> Pki:
    """New keys and certificates under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = _issue("conch test CA", x509.BasicConstraints(ca=True, path_length=None))
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    server = _issue("localhost", x509.SubjectAlternativeName(names), issuer=ca)
    client = _issue("conch test client", issuer=ca)
    pem = serialization.Encoding.PEM
    for name, (cert, _) in (("ca", ca), ("server", server), ("client", client)):
        (directory / f"{name}.pem").write_bytes(cert.public_bytes(pem))
    return Pki(
        ca=directory / "ca.pem",
        server_cert=directory / "server.pem",
        server_key=_write_key(server[1], directory / "server.key"),
        client_cert=directory / "client.pem",
        client_key=_write_key(client[1], directory / "client.key"),
    )
