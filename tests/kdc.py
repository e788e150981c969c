"""A throw-away MIT Kerberos KDC on loopback, for the SASL/GSSAPI tests.

Its database, stash, keytabs and the ``krb5.conf`` that points at it live in a temporary
directory; the KDC (``krb5kdc``, Debian's krb5-kdc) listens on a free TCP and UDP port.
Principals and keytabs are made with ``kadmin.local``. Nothing here touches the process's
environment: the tools run with KRB5_CONFIG and KRB5_KDC_PROFILE set for them only, and
:meth:`Kdc.env` gives the same for the processes a test starts (the producer reads
``krb5.conf`` through the system's GSSAPI, the broker's JVM through
``-Djava.security.krb5.conf``).

Without the KDC's programs the Kerberos tests skip, except in CI (``CI`` set), where they
must fail rather than pass unexercised (.ci/run installs krb5-kdc).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REALM = "KPROD.TEST"
_PROGRAMS = ("krb5kdc", "kdb5_util", "kadmin.local")


class KdcUnavailableError(RuntimeError):
    """The KDC could not be set up or started (the message says why)."""


def _find(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


def _program(name: str) -> str:
    """The path of a KDC program ``kdc_missing`` found."""
    path = _find(name)
    if path is None:
        raise KdcUnavailableError(f"{name} is not installed")
    return path


def kdc_missing() -> str | None:
    """Why no KDC can be started here (a program is missing), or None."""
    missing = [name for name in _PROGRAMS if _find(name) is None]
    if missing:
        return f"MIT Kerberos KDC programs missing: {', '.join(missing)} (apt-get install krb5-kdc krb5-admin-server)"
    try:
        import gssapi  # noqa: F401
    except ImportError as exc:
        return f"the gssapi package is not importable ({exc}; it needs libkrb5-dev to build)"
    return None


def _free_port() -> int:
    """A loopback port free a moment ago for both TCP and UDP (the KDC listens on both)."""
    for _ in range(50):
        with socket.socket() as tcp:
            tcp.bind(("127.0.0.1", 0))
            port = tcp.getsockname()[1]
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise KdcUnavailableError("no free port for the KDC")


@dataclass
class Kdc:
    """A running KDC for realm :data:`REALM`."""

    directory: Path
    port: int
    process: subprocess.Popen = field(repr=False)
    realm: str = REALM

    @property
    def krb5_conf(self) -> Path:
        return self.directory / "krb5.conf"

    def env(self) -> dict[str, str]:
        """The environment for a process that uses this KDC (a copy of this one's, plus
        KRB5_CONFIG); KRB5CCNAME points at a file of its own so that nothing reads or
        writes the user's ticket cache."""
        return {**os.environ, "KRB5_CONFIG": str(self.krb5_conf),
                "KRB5_KDC_PROFILE": str(self.directory / "kdc.conf"),
                "KRB5CCNAME": f"FILE:{self.directory / 'ccache-default'}"}

    def kadmin(self, query: str) -> None:
        """Run one kadmin.local query against this KDC's database."""
        result = subprocess.run([_program("kadmin.local"), "-r", self.realm, "-q", query], env=self.env(),
                                capture_output=True, text=True, timeout=60)
        if result.returncode != 0 or "error" in result.stderr.lower():
            raise KdcUnavailableError(f"kadmin.local {query!r} failed: {result.stderr.strip()}")

    def add_principal(self, name: str, keytab: Path | None = None) -> Path:
        """Create ``name`` (without the realm) with random keys and write them to a keytab
        of its own (or ``keytab``); returns the keytab's path."""
        keytab = keytab or self.directory / (name.replace("/", "_") + ".keytab")
        self.kadmin(f"addprinc -randkey {name}")
        self.kadmin(f"ktadd -k {keytab} {name}")
        return keytab

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_kdc(directory: Path) -> Kdc:
    """Create a realm's database in ``directory`` and start its KDC on a free port."""
    reason = kdc_missing()
    if reason:
        raise KdcUnavailableError(reason)
    directory.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    (directory / "kdc.conf").write_text(f"""\
[kdcdefaults]
    kdc_ports = {port}
    kdc_tcp_ports = {port}
[realms]
    {REALM} = {{
        database_name = {directory}/principal
        key_stash_file = {directory}/stash
        acl_file = {directory}/kadm5.acl
        kdc_ports = {port}
        kdc_tcp_ports = {port}
        max_life = 2h
        max_renewable_life = 2h
        supported_enctypes = aes256-cts-hmac-sha1-96:normal aes128-cts-hmac-sha1-96:normal
    }}
[logging]
    kdc = FILE:{directory}/kdc.log
""")
    (directory / "kadm5.acl").write_text("")
    # No DNS: the realm, the KDC and host names are what this file says. TCP only, which
    # Java's Kerberos (the broker) and MIT's (the producer) both speak.
    (directory / "krb5.conf").write_text(f"""\
[libdefaults]
    default_realm = {REALM}
    dns_lookup_kdc = false
    dns_lookup_realm = false
    dns_canonicalize_hostname = false
    rdns = false
    udp_preference_limit = 1
    ticket_lifetime = 2h
    forwardable = false
[realms]
    {REALM} = {{
        kdc = 127.0.0.1:{port}
    }}
[domain_realm]
    localhost = {REALM}
""")
    kdc = Kdc(directory, port, process=None)  # type: ignore[arg-type]
    result = subprocess.run([_program("kdb5_util"), "create", "-s", "-r", REALM, "-P", os.urandom(12).hex()],
                            env=kdc.env(), capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise KdcUnavailableError(f"kdb5_util create failed: {result.stderr.strip()}")
    log = open(directory / "krb5kdc.out", "wb")
    kdc.process = subprocess.Popen([_program("krb5kdc"), "-n", "-r", REALM], env=kdc.env(),
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if kdc.process.poll() is not None:
            raise KdcUnavailableError(f"krb5kdc exited with {kdc.process.returncode}: "
                                      f"{(directory / 'krb5kdc.out').read_text(errors='replace')[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return kdc
        time.sleep(0.05)
    kdc.stop()
    raise KdcUnavailableError(f"krb5kdc did not listen on 127.0.0.1:{port} within 30 s")
