"""A throw-away certificate authority for TLS on loopback: the test and benchmark brokers'
TLS listeners and the clients that talk to them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class TlsFiles:
    """PEM files for TLS on loopback: a CA, a broker certificate for 127.0.0.1 and
    localhost, and a client certificate, each signed by the CA."""

    ca: Path
    broker: Path  # private key (PKCS#8) and certificate: a PEM key store
    client_cert: Path
    client_key: Path


def make_tls_files(directory: Path) -> TlsFiles:
    """Generate a CA and the broker's and a client's certificates into ``directory``."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def certificate(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str, signer: ec.EllipticCurvePrivateKey,
                    *extensions: tuple[x509.ExtensionType, bool]) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(name(subject)).issuer_name(name(issuer))
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=2)))
        for extension, critical in extensions:
            builder = builder.add_extension(extension, critical)
        return builder.sign(signer, hashes.SHA256())

    def pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
        return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())

    ca_key, broker_key, client_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    ca = certificate("kprod-test-ca", ca_key, "kprod-test-ca", ca_key,
                     (x509.BasicConstraints(ca=True, path_length=None), True))
    san = x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    broker = certificate("localhost", broker_key, "kprod-test-ca", ca_key, (san, False),
                         (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False))
    client = certificate("kprod-client", client_key, "kprod-test-ca", ca_key,
                         (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False))
    pem = serialization.Encoding.PEM
    files = TlsFiles(directory / "ca.pem", directory / "broker.pem", directory / "client-cert.pem",
                     directory / "client-key.pem")
    files.ca.write_bytes(ca.public_bytes(pem))
    files.broker.write_bytes(pem_key(broker_key) + broker.public_bytes(pem) + ca.public_bytes(pem))
    files.client_cert.write_bytes(client.public_bytes(pem) + ca.public_bytes(pem))
    files.client_key.write_bytes(pem_key(client_key))
    return files


def ssl_listener_config(files: TlsFiles, client_auth: bool = False) -> dict[str, str]:
    """A listener's settings for TLS with ``files`` (PEM stores); ``client_auth`` requires
    a client certificate signed by the CA (mutual TLS)."""
    return {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(files.broker),
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(files.ca),
            "ssl.client.auth": "required" if client_auth else "none"}
