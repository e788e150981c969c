"""A small HTTP(S) reverse proxy in front of the suite's Schema Registry, for what Apicurio
does not do by itself without Keycloak: basic authentication, TLS (and client
certificates), and answers a busy registry gives (5xx) on demand. It records every request
it gets, so a test can count what reached the registry.

A thread with the standard library's http.server on loopback; each connection in its own
thread, its TLS handshake there too.
"""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field


@dataclass
class Faults:
    """Answers the front gives instead of forwarding: ``status`` for the next ``count``
    requests."""

    count: int = 0
    status: int = 503


@dataclass
class Front:
    """Forward ``http(s)://127.0.0.1:<port><path>`` to ``upstream`` (a registry URL)."""

    upstream: str
    user_info: tuple[str, str] | None = None  # required credentials, if any
    tls: ssl.SSLContext | None = None  # a server context: https, with client certificates if it asks
    requests: list[tuple[str, str]] = field(default_factory=list)  # (method, path) of every request
    faults: Faults = field(default_factory=Faults)

    def __post_init__(self) -> None:
        target = urllib.parse.urlsplit(self.upstream)
        if target.hostname is None:
            raise ValueError(f"upstream {self.upstream!r}: expected a URL with a host")
        self._target: tuple[str, int | None] = (target.hostname, target.port)
        self._lock = threading.Lock()
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _handle(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with front._lock:
                    front.requests.append((self.command, self.path))
                    fault = front.faults.count > 0
                    if fault:
                        front.faults.count -= 1
                if fault:
                    return self._answer(front.faults.status, {"error_code": front.faults.status * 100 + 1,
                                                              "message": "injected by the test's front"})
                if front.user_info is not None and self.headers.get("Authorization") != _basic(*front.user_info):
                    return self._answer(401, {"error_code": 40101, "message": "Unauthorized"},
                                        {"WWW-Authenticate": 'Basic realm="registry"'})
                upstream = http.client.HTTPConnection(*front._target, timeout=30)
                try:
                    upstream.request(self.command, self.path, body=body or None, headers={
                        k: v for k, v in self.headers.items() if k.lower() in ("content-type", "accept")})
                    response = upstream.getresponse()
                    self._send(response.status, response.read(), response.getheader("Content-Type"))
                finally:
                    upstream.close()

            def _answer(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
                self._send(status, json.dumps(body).encode(), "application/vnd.schemaregistry.v1+json", headers)

            def _send(self, status: int, data: bytes, content_type: str | None,
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for name, value in {"Content-Type": content_type or "application/json",
                                    "Content-Length": str(len(data)), **(headers or {})}.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_PUT = do_DELETE = _handle

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def finish_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
                if front.tls is not None:
                    try:  # in the connection's thread: a slow or failed handshake holds no one else up
                        request = front.tls.wrap_socket(request, server_side=True)
                    except OSError:
                        return
                super().finish_request(request, client_address)

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        # A short poll: close() (shutdown) waits for the loop's next look, 0.5 s by default,
        # and a randomized test opens a front per example.
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,),
                                        name=f"registry-front-{self.port}", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        path = urllib.parse.urlsplit(self.upstream).path
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def fail_next(self, count: int, status: int = 503) -> None:
        """Answer the next ``count`` requests with ``status`` instead of forwarding them."""
        with self._lock:
            self.faults = Faults(count, status)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> Front:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def server_context(cert_and_key: str, ca: str | None = None) -> ssl.SSLContext:
    """A TLS server context with the certificate and key in ``cert_and_key`` (PEM); with
    ``ca``, clients must present a certificate that CA signed."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_and_key)
    if ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(ca)
    return context
