"""A small OIDC identity provider for the OAUTHBEARER tests: a JWKS endpoint the broker's
own validator (OAuthBearerValidatorCallbackHandler) fetches its keys from, and a token
endpoint for the client credentials grant, over HTTP and HTTPS (the session's TLS CA).

An RSA key pair is made per run; tokens are JWTs signed RS256 by the tiny encoder here
(``cryptography`` signs; a JWT is two base64url JSON parts and a signature, so no JWT
library is needed). Counters say how often each client fetched a token.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

AUDIENCE = "kprod-test-kafka"
CLIENTS = {"kprod-app": "app-secret", "expired-app": "expired-secret"}
# Clients whose tokens expired a minute before they were issued (the broker must refuse them).
EXPIRED_CLIENTS = frozenset({"expired-app"})


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _uint(number: int) -> str:
    return _b64(number.to_bytes((number.bit_length() + 7) // 8, "big"))


class IdentityProvider:
    """The JWKS and token endpoints, served on loopback until :meth:`close`."""

    def __init__(self, tls_cert: Path | None = None) -> None:
        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.kid = "kprod-test-" + _b64(threading.get_native_id().to_bytes(4, "big"))
        self.token_lifetime_s = 3600.0
        self.fetches: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._servers = [self._serve(None)]
        self.issuer = f"http://127.0.0.1:{self._servers[0].server_port}"
        if tls_cert is not None:
            self._servers.append(self._serve(tls_cert))

    @property
    def jwks_url(self) -> str:
        return f"{self.issuer}/jwks"

    @property
    def token_url(self) -> str:
        return f"{self.issuer}/token"

    @property
    def https_token_url(self) -> str:
        """The token endpoint over TLS, as localhost (the certificate's name)."""
        return f"https://localhost:{self._servers[1].server_port}/token"

    def token(self, subject: str, lifetime_s: float, scope: str = "kafka") -> str:
        """A JWT for ``subject`` signed with the run's key."""
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "kid": self.kid}
        claims = {"iss": self.issuer, "aud": AUDIENCE, "sub": subject, "scope": scope, "iat": now,
                  "exp": now + int(lifetime_s)}
        signing_input = ".".join(_b64(json.dumps(part).encode()) for part in (header, claims))
        signature = self._key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
        return f"{signing_input}.{_b64(signature)}"

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    # -- HTTP -----------------------------------------------------------------

    def _jwks(self) -> dict[str, Any]:
        numbers = self._key.public_key().public_numbers()
        return {"keys": [{"kty": "RSA", "use": "sig", "alg": "RS256", "kid": self.kid,
                          "n": _uint(numbers.n), "e": _uint(numbers.e)}]}

    def _grant(self, authorization: str, form: dict[str, list[str]]) -> tuple[int, dict[str, Any]]:
        """The client credentials grant (RFC 6749 section 4.4) with HTTP Basic client auth."""
        try:
            scheme, _, encoded = authorization.partition(" ")
            client_id, _, secret = base64.b64decode(encoded).decode().partition(":")
        except ValueError:
            scheme, client_id, secret = "", "", ""
        if scheme != "Basic" or CLIENTS.get(client_id) != secret:
            return 401, {"error": "invalid_client", "error_description": "unknown client or wrong secret"}
        if form.get("grant_type") != ["client_credentials"]:
            return 400, {"error": "unsupported_grant_type"}
        with self._lock:
            self.fetches[client_id] += 1
        lifetime = -60.0 if client_id in EXPIRED_CLIENTS else self.token_lifetime_s
        scope = form.get("scope", ["kafka"])[0]
        return 200, {"access_token": self.token(client_id, lifetime, scope), "token_type": "Bearer",
                     "expires_in": int(lifetime)}

    def _serve(self, tls_cert: Path | None) -> ThreadingHTTPServer:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/jwks":
                    self._reply(200, provider._jwks())
                else:
                    self._reply(404, {"error": "not found"})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                if self.path != "/token":
                    self._reply(404, {"error": "not found"})
                    return
                self._reply(*provider._grant(self.headers.get("Authorization", ""), form))

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        if tls_cert is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls_cert))
            server.socket = context.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, name="kprod-test-oidc", daemon=True).start()
        return server


def client_credentials_provider(options: dict[str, str]) -> tuple[str, float]:
    """A token provider as users write one (sasl.oauthbearer.token.provider): its own
    request to the token endpoint named in sasl.jaas.config's options, returning the
    token and its expiry in epoch milliseconds. Importable by name in Spark's workers."""
    credentials = base64.b64encode(f"{options['clientId']}:{options['clientSecret']}".encode()).decode()
    request = urllib.request.Request(options["tokenUrl"], data=b"grant_type=client_credentials",
                                     headers={"Authorization": f"Basic {credentials}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        answer = json.load(response)
    return answer["access_token"], (time.time() + answer["expires_in"]) * 1000.0
