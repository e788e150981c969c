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


class _TlsSession:
    """The server side of one TLS connection over asyncio streams, on memory BIOs.

    asyncio's own TLS closes a refused handshake without sending its alert; a broker sends
    it (with TLS 1.3 the client learns only from that alert that its certificate was
    refused), so the handshake is driven here.
    """

    def __init__(self, context: ssl.SSLContext, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._incoming, self._outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self._tls = context.wrap_bio(self._incoming, self._outgoing, server_side=True)
        self._reader, self._writer = reader, writer

    async def handshake(self) -> bool:
        """True once the session is up; False if it was refused (the alert is sent) or the
        client went away."""
        while True:
            try:
                self._tls.do_handshake()
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._feed():
                    return False
                continue
            except ssl.SSLError:
                await self._flush()
                return False
            await self._flush()
            return True

    async def read(self) -> bytes:
        """Plaintext from the client; b"" once it has closed."""
        while True:
            try:
                data = self._tls.read(65536)
            except ssl.SSLWantReadError:
                await self._flush()
                if not await self._feed():
                    return b""
                continue
            except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                return b""
            await self._flush()
            return data

    async def write(self, data: bytes) -> None:
        self._tls.write(data)
        await self._flush()

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self._writer.close()

    async def _feed(self) -> bool:
        data = await self._reader.read(65536)
        if not data:
            self._incoming.write_eof()
            return False
        self._incoming.write(data)
        return True

    async def _flush(self) -> None:
        data = self._outgoing.read()
        if data:
            self._writer.write(data)
            await self._writer.drain()


class TlsProxy:
    """Accept TLS on 127.0.0.1:``port`` and forward the plaintext to ``target``; with
    ``require_client_cert``, only clients with a certificate from ``pki``'s CA (mutual TLS)."""

    def __init__(self, pki: Pki, target_host: str, target_port: int, port: int = 0,
                 require_client_cert: bool = False) -> None:
        self._context = pki.server_context()
        if require_client_cert:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(cafile=pki.ca)
        self._target = (target_host, target_port)
        self._server = BackgroundServer(self._handle, port, None, "tlsproxy")
        self.port = self._server.port

    async def _handle(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        session = _TlsSession(self._context, client_reader, client_writer)
        try:
            if await session.handshake():
                upstream_reader, upstream_writer = await asyncio.open_connection(*self._target)
                await asyncio.gather(self._decrypt(session, upstream_writer), self._encrypt(upstream_reader, session))
        except OSError:
            pass
        finally:
            session.close()

    @staticmethod
    async def _decrypt(session: _TlsSession, upstream: asyncio.StreamWriter) -> None:
        try:
            while data := await session.read():
                upstream.write(data)
                await upstream.drain()
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError, RuntimeError):
                upstream.close()

    @staticmethod
    async def _encrypt(upstream: asyncio.StreamReader, session: _TlsSession) -> None:
        try:
            while data := await upstream.read(65536):
                await session.write(data)
        except OSError:  # ssl.SSLError included
            pass
        finally:
            session.close()

    def close(self) -> None:
        self._server.close()

    def __enter__(self) -> TlsProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
