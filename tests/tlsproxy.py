"""TLS for tests: a throwaway certificate authority, and a proxy that terminates TLS in
front of a plaintext broker (Tansu's own TLS options are not used).

Put the proxy in front of a broker whose advertised address is the proxy's
(``start_tansu(advertised_port=proxy.port)``) and every client connection, bootstrap and
leader alike, speaks TLS to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.asyncserver import BackgroundServer


@dataclass(frozen=True)
class Pki:
    """A CA and a server certificate it signed for 127.0.0.1 and localhost."""

    ca: Path
    server_cert: Path
    server_key: Path

    def server_context(self) -> ssl.SSLContext:
        """A server-side TLS context presenting the server certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        return context


def make_pki(directory: Path, name: str = "kprod-test-ca") -> Pki:
    """Create a CA and a server certificate with the openssl command-line tool."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    directory.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
            "-days", "2", "-subj", f"/CN={name}")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost")
    (directory / "san.cnf").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.pem", "-days", "2", "-extfile", "san.cnf")
    return Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")


def make_client_cert(pki: Pki, name: str = "kprod-client") -> tuple[Path, Path]:
    """A client certificate (for mutual TLS) signed by ``pki``'s CA: (cert.pem, key.pem)."""
    directory = pki.ca.parent

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2")
    return directory / f"{name}.pem", directory / f"{name}.key"


class TlsProxy:
    """Accept TLS on 127.0.0.1:``port`` and forward the plaintext to ``target``; with
    ``require_client_cert``, only clients with a certificate from ``pki``'s CA (mutual TLS)."""

    def __init__(self, pki: Pki, target_host: str, target_port: int, port: int = 0,
                 require_client_cert: bool = False) -> None:
        context = pki.server_context()
        if require_client_cert:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=pki.ca)
        self._target = (target_host, target_port)
        self._server = BackgroundServer(self._handle, port, context, "tlsproxy")
        self.port = self._server.port

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._pipe(client_reader, upstream_writer), self._pipe(upstream_reader, client_writer))

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (OSError, ssl.SSLError):
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                writer.close()

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> TlsProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
