"""SASL/GSSAPI (Kerberos) credentials and security contexts, through the system's GSSAPI
(MIT Kerberos or Heimdal, with the ``gssapi`` package).

The credentials are those Java's Krb5LoginModule would use: a keytab and principal
(``useKeyTab=true``), or the tickets in a ticket cache that ``kinit`` filled
(``useTicketCache=true``). A keytab is used through a credential store (RFC 8353-style
``gss_acquire_cred_from``) whose tickets live in a memory cache of kprod's own: kprod
sets no environment variable (KRB5CCNAME, KRB5_CONFIG, KRB5_CLIENT_KTNAME are the
process's, and krb5.conf is the system's or the one KRB5_CONFIG names) and writes no
ticket cache on disk.

The KDC is the other server kprod talks to outside network.py: a blocking exchange here
when the producer is created (the ticket-granting ticket, so that a wrong principal or
keytab fails the producer's creation, as Java's login does) and when a connection to a
broker host is first set up (its service ticket, cached after).
"""

from __future__ import annotations

import functools
import hashlib
import ipaddress
import logging
import os
import socket
from collections.abc import Callable
from typing import Any

from spark_sink.client.config import ClientConfig, KerberosOptions, kerberos_options
from spark_sink.client.errors import ConfigError, SaslAuthenticationError
from spark_sink.protocol import sasl

log = logging.getLogger(__name__)


def _gssapi() -> Any:
    try:
        import gssapi
    except ImportError as exc:
        raise ConfigError(
            f"sasl.mechanism: GSSAPI needs the gssapi package ({exc}): pip install -e '.[kerberos]' in a clone of kprod "
            "(it builds against the system's Kerberos: Debian's libkrb5-dev, Red Hat's krb5-devel)") from None
    return gssapi


def _gss_reason(exc: Exception) -> str:
    """A GSSAPI error's own words (principal and service names, never a key): the
    mechanism's (minor) message, which says what went wrong, where there is one."""
    text = " ".join(str(exc).split())
    major, _, minor = text.partition(", Minor (")
    minor = minor.partition("): ")[2].strip()
    return minor or major.partition("): ")[2].strip() or text


class KerberosLogin:
    """The producer's Kerberos credentials, acquired when it is created."""

    def __init__(self, config: ClientConfig) -> None:
        self.options: KerberosOptions = kerberos_options(config.sasl_jaas_config, config.sasl_kerberos_service_name)
        self._gssapi = _gssapi()
        self.credentials = self._acquire()

    def _describe(self) -> str:
        o = self.options
        if o.keytab:
            return f"principal {o.principal!r} with keyTab {o.keytab!r}"
        cache = f"ticket cache {o.ticket_cache!r}" if o.ticket_cache else "the default ticket cache"
        return f"{'principal ' + repr(o.principal) + ' in ' if o.principal else ''}{cache}"

    def _acquire(self) -> Any:
        gssapi, o = self._gssapi, self.options
        if o.keytab and not os.access(o.keytab, os.R_OK):
            raise ConfigError(f"sasl.jaas.config: keyTab {o.keytab!r} does not exist or is not readable")
        name = gssapi.Name(o.principal, gssapi.NameType.kerberos_principal) if o.principal else None
        store: dict[str, str] = {}
        if o.keytab:
            # A memory cache per principal and keytab: producers of one identity in this
            # process share its tickets, and nothing is written where kinit's live.
            identity = hashlib.sha256(f"{o.principal}\0{os.path.abspath(o.keytab)}".encode()).hexdigest()[:16]
            store = {"client_keytab": o.keytab, "ccache": f"MEMORY:kprod-{identity}"}
        elif o.ticket_cache:
            store = {"ccache": o.ticket_cache}
        try:
            credentials = gssapi.Credentials(name=name, usage="initiate", store=store or None)
            # Asking for the lifetime gets the ticket-granting ticket from the KDC now (with a
            # keytab): a principal the KDC does not know, or stale keys, fail here.
            lifetime = credentials.lifetime
        except gssapi.exceptions.GSSError as exc:
            hint = ("check principal and keyTab in sasl.jaas.config (the keytab must hold the principal's "
                    "current keys) and that krb5.conf names the realm's KDC" if o.keytab else
                    "run kinit first, or set useKeyTab=true keyTab=\"...\" principal=\"...\" in sasl.jaas.config")
            raise SaslAuthenticationError(f"sasl.jaas.config: no Kerberos credentials for {self._describe()}: "
                                          f"{_gss_reason(exc)} ({hint})") from None
        if not lifetime:
            raise SaslAuthenticationError(f"sasl.jaas.config: the Kerberos tickets of {self._describe()} have "
                                          "expired (run kinit again, or use a keytab)")
        log.info("Kerberos credentials for %s acquired (valid %s s)", self._describe(), lifetime)
        return credentials

    def exchange(self, host: str) -> sasl.Gssapi:
        """A fresh GSSAPI exchange with the broker on ``host``: its first token carries a
        service ticket for ``<sasl.kerberos.service.name>/<host>`` (from the KDC on the
        first connection to the host). Raises SaslAuthenticationError naming what to
        check."""
        gssapi = self._gssapi
        service = f"{self.options.service_name}@{_service_host(host)}"
        flags = (gssapi.RequirementFlag.mutual_authentication | gssapi.RequirementFlag.integrity
                 | gssapi.RequirementFlag.confidentiality)  # what Java's client asks for
        hint = (f"check sasl.kerberos.service.name ({self.options.service_name!r}; a broker's principal is "
                f"<service name>/<its host>@REALM) and the {self._describe()} in sasl.jaas.config")
        try:
            context = gssapi.SecurityContext(name=gssapi.Name(service, gssapi.NameType.hostbased_service),
                                             creds=self.credentials, usage="initiate", flags=flags)
            first = context.step()
        except gssapi.exceptions.GSSError as exc:
            raise SaslAuthenticationError(f"SASL GSSAPI: no service ticket for {service}: {_gss_reason(exc)} "
                                          f"({hint})") from None
        return sasl.Gssapi(_Context(context), first or b"", hint)


class _Context:
    """A ``gssapi.SecurityContext`` as :class:`sasl.GssContext`: after the first token,
    local computations (no KDC), with GSSAPI errors as SaslError."""

    def __init__(self, context: Any) -> None:
        self._context = context

    @property
    def complete(self) -> bool:
        return bool(self._context.complete)

    def _call(self, what: str, call: Callable[[], Any]) -> Any:
        import gssapi

        try:
            return call()
        except gssapi.exceptions.GSSError as exc:
            raise sasl.SaslError(f"GSSAPI: {what} failed: {_gss_reason(exc)}") from None

    def step(self, token: bytes) -> bytes | None:
        return self._call("checking the broker's answer (mutual authentication)", lambda: self._context.step(token))

    def unwrap(self, message: bytes) -> bytes:
        return self._call("reading the security layer offer", lambda: self._context.unwrap(message).message)

    def wrap(self, message: bytes) -> bytes:
        return self._call("answering the security layer offer", lambda: self._context.wrap(message, False).message)


@functools.lru_cache(maxsize=256)
def _service_host(host: str) -> str:
    """The host part of the broker's service principal: the host name as given, and for an
    IP address its name by reverse lookup, as Java's client takes it
    (InetAddress.getHostName), kept for the process as Java's address cache keeps it."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return host.lower()
    try:
        return socket.gethostbyaddr(host)[0].lower()
    except OSError:
        return host


def gssapi_exchanges(config: ClientConfig) -> Callable[[str], sasl.SaslMechanism]:
    """A factory of GSSAPI exchanges, one per connection, given the broker's host; the
    credentials are acquired now, so that a wrong principal or keytab fails the
    producer's creation."""
    return KerberosLogin(config).exchange
