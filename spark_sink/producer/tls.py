"""The TLS context of security.protocol=SSL or SASL_SSL, from Java's store settings.

Stores are PEM files (or PEM text) or PKCS12 files, the Java keystore default since Java 9
and what ``keytool`` writes; JKS files are refused with the command that converts them.
Any store that cannot be read is a ConfigError naming its key, at producer creation. A
failed handshake becomes an error that says which setting to check.
"""

from __future__ import annotations

import os
import secrets
import ssl
import tempfile

from spark_sink.producer.config import ProducerConfig
from spark_sink.producer.errors import ConfigError, SslAuthenticationError
from spark_sink.protocol.errors import KafkaConnectionError, KProdError

_JKS_MAGIC = b"\xfe\xed\xfe\xed"


def ssl_context(config: ProducerConfig) -> ssl.SSLContext | None:
    """The client TLS context, or None when the protocol has no TLS."""
    if not config.security_protocol.endswith("SSL"):
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # certificates always verified
    context.check_hostname = config.ssl_endpoint_identification_algorithm == "https"
    if config.ssl_truststore_location or config.ssl_truststore_certificates:
        _load_truststore(context, config)  # replaces the system's CAs, as in Java
    else:
        context.load_default_certs()
    if config.ssl_keystore_location:
        _load_keystore(context, config)
    return context


def is_alert(exc: OSError) -> bool:
    """True for a TLS protocol error (an alert from the peer, a failed check), not for a
    connection that merely ended or broke."""
    return isinstance(exc, ssl.SSLError) and not isinstance(
        exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError))


def handshake_error(exc: OSError, host: str, port: int, config: ProducerConfig) -> KProdError:
    """The error for a TLS handshake with ``host``:``port`` that failed with ``exc``, or a
    first read refused by an alert (with TLS 1.3 the client's side of the handshake ends
    before the broker has checked the client's certificate). A certificate that is not
    trusted and a session the broker refused are authentication failures, as Java's
    SslAuthenticationException, naming the setting to check."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return SslAuthenticationError(
            f"TLS handshake with {host}:{port} failed: certificate verify failed: {exc.verify_message or exc} "
            "(check ssl.truststore.location / ssl.truststore.certificates, and "
            "ssl.endpoint.identification.algorithm for the host name)")
    if is_alert(exc):
        hint = ("the broker may require a client certificate: set ssl.keystore.location"
                if config.ssl_keystore_location is None
                else "check the client certificate in ssl.keystore.location and that the broker trusts its CA")
        return SslAuthenticationError(
            f"the TLS session with {host}:{port} was refused: {getattr(exc, 'reason', None) or exc} ({hint})")
    return KafkaConnectionError(f"TLS handshake failed: {getattr(exc, 'reason', None) or exc} (is {host}:{port} "
                                "a TLS listener? a plaintext one closes the connection; check security.protocol)")


def _load_truststore(context: ssl.SSLContext, config: ProducerConfig) -> None:
    key = "ssl.truststore.location"
    try:
        if config.ssl_truststore_location:
            if config.ssl_truststore_type == "PKCS12":
                context.load_verify_locations(cadata=_pkcs12_certificates(key, config.ssl_truststore_location,
                                                                          config.ssl_truststore_password))
            else:
                _check_pem_file(key, config.ssl_truststore_location, "ssl.truststore.type")
                context.load_verify_locations(cafile=config.ssl_truststore_location)
        if config.ssl_truststore_certificates:
            key = "ssl.truststore.certificates"
            context.load_verify_locations(cadata=config.ssl_truststore_certificates)
    except ConfigError:
        raise
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{key}: cannot load it as {config.ssl_truststore_type}: {exc}") from None


def _load_keystore(context: ssl.SSLContext, config: ProducerConfig) -> None:
    key, location = "ssl.keystore.location", config.ssl_keystore_location
    try:
        if config.ssl_keystore_type == "PKCS12":
            _load_pkcs12_keystore(context, config)
        else:
            _check_pem_file(key, location, "ssl.keystore.type")
            context.load_cert_chain(location, password=config.ssl_key_password)
    except ConfigError:
        raise
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{key}: cannot load it as {config.ssl_keystore_type}: {exc}") from None


def _check_pem_file(key: str, location: str, type_key: str) -> None:
    """Refuse, naming ``type_key``, a JKS or DER (PKCS12) file given as PEM."""
    with open(location, "rb") as f:
        head = f.read(4)
    if head == _JKS_MAGIC:
        raise ConfigError(
            f"{key}: {location} is a JKS store, which kprod does not read; convert it with "
            f"`keytool -importkeystore -srckeystore {location} -destkeystore store.p12 -deststoretype PKCS12` "
            f"and set {type_key}=PKCS12")
    if head[:1] == b"\x30":  # DER: a PKCS12 file read as PEM
        raise ConfigError(f"{key}: {location} is not PEM; if it is a PKCS12 store, set {type_key}=PKCS12")


def _pkcs12(key: str, location: str, password: str | None):  # -> PKCS12KeyAndCertificates
    from cryptography.hazmat.primitives.serialization import pkcs12

    with open(location, "rb") as f:
        data = f.read()
    try:
        return pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError:
        # The message cryptography gives does not say which setting: name it, never the value.
        password_key = "ssl.truststore.password" if key.startswith("ssl.truststore") else "ssl.keystore.password"
        raise ConfigError(f"{key}: cannot read {location} as PKCS12 (a wrong or missing {password_key}, "
                          "or not a PKCS12 file)") from None


def _pkcs12_certificates(key: str, location: str, password: str | None) -> str:
    """Every certificate in a PKCS12 truststore, as PEM text."""
    from cryptography.hazmat.primitives.serialization import Encoding

    store = _pkcs12(key, location, password)
    certificates = ([store.cert] if store.cert else []) + list(store.additional_certs)
    if not certificates:
        raise ConfigError(f"{key}: {location} holds no certificate")
    return "".join(c.certificate.public_bytes(Encoding.PEM).decode() for c in certificates)


def _load_pkcs12_keystore(context: ssl.SSLContext, config: ProducerConfig) -> None:
    """The key and certificate chain of a PKCS12 keystore. Python's ssl module loads keys
    only from files, so they go through a private temporary file, the key encrypted with a
    one-time password: the unencrypted key never touches the disk."""
    from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, Encoding, PrivateFormat

    key, location = "ssl.keystore.location", config.ssl_keystore_location
    store = _pkcs12(key, location, config.ssl_keystore_password or config.ssl_key_password)
    if store.key is None or store.cert is None:
        raise ConfigError(f"{key}: {location} holds no private key with its certificate")
    one_time = secrets.token_bytes(32)
    pem = store.key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(one_time))
    for certificate in [store.cert, *store.additional_certs]:
        pem += certificate.certificate.public_bytes(Encoding.PEM)
    fd, path = tempfile.mkstemp(prefix="kprod-keystore-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        context.load_cert_chain(path, password=one_time)
    finally:
        os.unlink(path)
