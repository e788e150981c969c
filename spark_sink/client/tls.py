"""The TLS context of security.protocol=SSL or SASL_SSL, from Java's store settings.

Stores are read as Java reads them: JKS (Java's default type; read with pyjks) and PKCS12
(read with ``cryptography``), each type reading either kind of file by its content as
Java's keystore.type.compat does, and PEM files (or PEM text). Any store that cannot be
read (a wrong password, a type that does not fit the file) is a ConfigError naming its
key, at producer creation; no password ever appears in one. A failed handshake becomes
an error that says which setting to check.
"""

from __future__ import annotations

import os
import secrets
import ssl
import tempfile
from typing import TYPE_CHECKING, Any

from spark_sink.client.config import ClientConfig
from spark_sink.client.errors import ConfigError, SslAuthenticationError
from spark_sink.protocol.error_codes import KafkaConnectionError, KProdError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.serialization.pkcs12 import PKCS12KeyAndCertificates

_JKS_MAGIC = b"\xfe\xed\xfe\xed"
_JCEKS_MAGIC = b"\xce\xce\xce\xce"


def ssl_context(config: ClientConfig) -> ssl.SSLContext | None:
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
        _load_keystore(context, config, config.ssl_keystore_location)
    return context


def is_alert(exc: OSError) -> bool:
    """True for a TLS protocol error (an alert from the peer, a failed check), not for a
    connection that merely ended or broke."""
    return isinstance(exc, ssl.SSLError) and not isinstance(
        exc, (ssl.SSLEOFError, ssl.SSLZeroReturnError, ssl.SSLSyscallError))


def handshake_error(exc: OSError, host: str, port: int, config: ClientConfig) -> KProdError:
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


def _load_truststore(context: ssl.SSLContext, config: ClientConfig) -> None:
    key = "ssl.truststore.location"
    try:
        if config.ssl_truststore_location:
            location = config.ssl_truststore_location
            fmt = _store_format(key, location, config.ssl_truststore_type, "ssl.truststore.type")
            if fmt == "PEM":
                context.load_verify_locations(cafile=location)
            else:
                context.load_verify_locations(cadata=_trusted_certificates(key, location, fmt,
                                                                           config.ssl_truststore_password))
        if config.ssl_truststore_certificates:
            key = "ssl.truststore.certificates"
            context.load_verify_locations(cadata=config.ssl_truststore_certificates)
    except ConfigError:
        raise
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{key}: cannot load it as {config.ssl_truststore_type}: {exc}") from None


def _load_keystore(context: ssl.SSLContext, config: ClientConfig, location: str) -> None:
    key = "ssl.keystore.location"
    try:
        fmt = _store_format(key, location, config.ssl_keystore_type, "ssl.keystore.type")
        if fmt == "PEM":
            context.load_cert_chain(location, password=config.ssl_key_password)
        else:
            _load_private_key(context, *_key_and_chain(config, fmt, location))
    except ConfigError:
        raise
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise ConfigError(f"{key}: cannot load it as {config.ssl_keystore_type}: {exc}") from None


def _store_format(key: str, location: str, declared: str, type_key: str) -> str:
    """What the file at ``location`` is (JKS, PKCS12 or PEM), checked against the type
    declared in ``type_key``. As Java's keystore.type.compat: JKS and PKCS12 each read
    either kind of store, found by its content. PEM files are read under JKS, the default,
    as well (kprod took PEM by default before it read JKS); a type that does not fit the
    file is a ConfigError naming ``type_key``."""
    with open(location, "rb") as f:
        head = f.read(4)
    fmt = "JKS" if head in (_JKS_MAGIC, _JCEKS_MAGIC) else "PKCS12" if head[:1] == b"\x30" else "PEM"
    if declared == "PEM" and fmt != "PEM":
        raise ConfigError(f"{key}: {location} is a {fmt} store, not PEM; set {type_key}={fmt} "
                          "(or leave it out: JKS, the default, reads JKS and PKCS12 stores)")
    if declared == "PKCS12" and fmt == "PEM":
        raise ConfigError(f"{key}: {location} is not a PKCS12 (or JKS) store; if it is PEM, set {type_key}=PEM")
    return fmt


def _password_error(key: str, location: str, fmt: str, password_key: str) -> ConfigError:
    # The libraries' messages do not say which setting: name it, never the value.
    return ConfigError(f"{key}: cannot read {location} as {fmt} (a wrong or missing {password_key}, "
                       f"or a damaged file)")


def _jks(key: str, location: str, password: str | None) -> Any:  # jks.KeyStore (pyjks has no types)
    """A JKS (or JCEKS) store read by pyjks. Without a password, as in Java, its integrity
    is not checked (a truststore needs none); keys are decrypted by the caller."""
    import jks

    with open(location, "rb") as f:
        data = f.read()
    try:
        return jks.KeyStore.loads(data, password, try_decrypt_keys=False)
    except jks.util.KeystoreSignatureException:
        password_key = "ssl.truststore.password" if key.startswith("ssl.truststore") else "ssl.keystore.password"
        raise _password_error(key, location, "JKS", password_key) from None
    except (jks.util.KeystoreException, ValueError) as exc:
        raise ConfigError(f"{key}: cannot read {location} as a JKS store: {exc}") from None


def _pkcs12(key: str, location: str, password: str | None) -> PKCS12KeyAndCertificates:
    from cryptography.hazmat.primitives.serialization import pkcs12

    with open(location, "rb") as f:
        data = f.read()
    try:
        return pkcs12.load_pkcs12(data, password.encode() if password else None)
    except ValueError:
        password_key = "ssl.truststore.password" if key.startswith("ssl.truststore") else "ssl.keystore.password"
        raise _password_error(key, location, "PKCS12", password_key) from None


def _trusted_certificates(key: str, location: str, fmt: str, password: str | None) -> str:
    """Every certificate a JKS or PKCS12 truststore holds, as PEM text: as Java's trust
    manager, the trusted-certificate entries and the first certificate of each key entry."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    if fmt == "JKS":
        store = _jks(key, location, password)
        ders = [entry.cert for entry in store.certs.values()]
        ders += [entry.cert_chain[0][1] for entry in store.private_keys.values() if entry.cert_chain]
        certificates = [x509.load_der_x509_certificate(der) for der in ders]
    else:
        p12 = _pkcs12(key, location, password)
        certificates = [c.certificate for c in ([p12.cert] if p12.cert else []) + list(p12.additional_certs)]
    if not certificates:
        raise ConfigError(f"{key}: {location} holds no certificate")
    return "".join(c.public_bytes(Encoding.PEM).decode() for c in certificates)


def _key_and_chain(config: ClientConfig, fmt: str, location: str) -> tuple[Any, list[Any]]:
    """The private key and certificate chain of a JKS or PKCS12 keystore. The key's
    password is ssl.key.password, or else ssl.keystore.password, as in Kafka's Java
    client."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import load_der_private_key

    key = "ssl.keystore.location"
    if fmt == "PKCS12":
        # keytool refuses a key password that differs from the store's for PKCS12.
        p12 = _pkcs12(key, location, config.ssl_keystore_password or config.ssl_key_password)
        if p12.key is None or p12.cert is None:
            raise ConfigError(f"{key}: {location} holds no private key with its certificate")
        return p12.key, [p12.cert.certificate, *(c.certificate for c in p12.additional_certs)]
    import jks

    store = _jks(key, location, config.ssl_keystore_password)
    if not store.private_keys:
        raise ConfigError(f"{key}: {location} holds no private key with its certificate")
    # Java's key manager picks among several keys by the broker's request; Kafka's stores
    # hold one. Take the first, by alias, so that the choice is stable.
    entry = store.private_keys[sorted(store.private_keys)[0]]
    try:
        entry.decrypt(config.ssl_key_password or config.ssl_keystore_password or "")
    except jks.util.DecryptionFailureException:
        password_key = "ssl.key.password" if config.ssl_key_password else "ssl.key.password (or ssl.keystore.password)"
        raise _password_error(key, location, "JKS", password_key) from None
    chain = [x509.load_der_x509_certificate(der) for _, der in entry.cert_chain]
    if not chain:
        raise ConfigError(f"{key}: {location} holds no certificate for its private key")
    return load_der_private_key(entry.pkey_pkcs8, None), chain


def _load_private_key(context: ssl.SSLContext, private_key: Any, chain: list[Any]) -> None:
    """Load a key and its chain into ``context``. Python's ssl module loads keys only from
    files, so they go through a private temporary file, the key encrypted with a one-time
    password: the unencrypted key never touches the disk."""
    from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, Encoding, PrivateFormat

    one_time = secrets.token_bytes(32)
    pem = private_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(one_time))
    for certificate in chain:
        pem += certificate.public_bytes(Encoding.PEM)
    fd, path = tempfile.mkstemp(prefix="kprod-keystore-", suffix=".pem")  # mode 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        context.load_cert_chain(path, password=one_time)
    finally:
        os.unlink(path)
