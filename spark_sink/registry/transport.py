"""HTTP to the Schema Registry with the standard library: one connection per call, TLS and
basic authentication from the settings, and retries within a deadline.

A call is retried, with a doubling backoff, on a connection error (refused, reset, timed
out, closed before the answer) and on an answer a server may give when busy or restarting
(5xx, 408, 429), trying the configured URLs in turn, until ``max.retries`` retries or the
call's ``timeout.ms`` is spent. Anything else (401, 403, 404, 409, 422, a TLS certificate
not trusted) is raised at once. Every call Kafka clients make to a registry (register, look
up, read, check) can be sent twice without harm.
"""

from __future__ import annotations

import base64
import http
import http.client
import json
import logging
import random
import socket
import ssl
from typing import Any

from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.client.tls import is_alert
from spark_sink.registry.config import Endpoint, RegistryConfig
from spark_sink.registry.errors import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    RegistryAuthError,
    RegistryErrorCode,
    RegistryUnavailableError,
    SchemaNotFoundError,
    SchemaRegistryError,
)

log = logging.getLogger(__name__)

_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_ACCEPT = f"{_CONTENT_TYPE}, application/vnd.schemaregistry+json, application/json"
_RETRIABLE = {http.HTTPStatus.REQUEST_TIMEOUT, http.HTTPStatus.TOO_MANY_REQUESTS}
_NOT_FOUND = {RegistryErrorCode.SUBJECT_NOT_FOUND, RegistryErrorCode.VERSION_NOT_FOUND,
              RegistryErrorCode.SCHEMA_NOT_FOUND, RegistryErrorCode.SUBJECT_SOFT_DELETED}


class Transport:
    """Sends the registry's REST calls; ``request`` returns the decoded JSON answer."""

    def __init__(self, config: RegistryConfig, clock: Time = SYSTEM_TIME) -> None:
        self.config = config
        self._clock = clock  # the deadline's, and the backoff's sleep
        self._ssl = config.ssl_context() if any(e.scheme == "https" for e in config.endpoints) else None
        self._first = 0  # the URL that answered last: tried first

    def request(self, method: str, path: str, body: Any = None, *, what: str, subject: str | None = None) -> Any:
        """``method`` ``path`` (quoted, after each URL's own path) with ``body`` as JSON.
        ``what`` says what the call does, for messages; ``subject`` is named by an
        IncompatibleSchemaError."""
        config = self.config
        deadline = self._clock() + config.timeout_ms
        data = None if body is None else json.dumps(body).encode()
        causes: dict[str, str] = {}
        attempts = 0
        while True:
            index = (self._first + attempts) % len(config.endpoints)
            endpoint = config.endpoints[index]
            attempts += 1
            status: int | None = None
            try:
                status, reason, text = self._send(endpoint, method, path, data, deadline)
            except ssl.SSLCertVerificationError as exc:
                raise RegistryAuthError(
                    f"{what}: the TLS certificate of the Schema Registry at {endpoint.url} is not trusted: "
                    f"{exc.verify_message or exc} (check ssl.ca.location)", url=endpoint.url) from None
            except ssl.SSLError as exc:
                if is_alert(exc):
                    hint = ("the registry may require a client certificate: set ssl.certificate.location"
                            if config.ssl_certificate_location is None
                            else "check ssl.certificate.location and that the registry trusts its CA")
                    raise RegistryAuthError(f"{what}: the Schema Registry at {endpoint.url} refused the TLS "
                                            f"session: {exc.reason or exc} ({hint})", url=endpoint.url) from None
                causes[endpoint.url] = _describe(exc, endpoint)
            except (OSError, http.client.HTTPException) as exc:
                causes[endpoint.url] = _describe(exc, endpoint)
            else:
                if status < 300:
                    self._first = index
                    return _json(text, endpoint, what) if text else None
                code, message = _error_body(text)
                if not (status >= 500 or status in _RETRIABLE):
                    raise _error(status, reason, code, message, endpoint, what, subject, self._has_credentials(
                        endpoint))
                causes[endpoint.url] = f"HTTP {status} {reason}: {message}"
            wait_ms = min(config.retries_max_wait_ms, config.retries_wait_ms * 2 ** (attempts - 1))
            wait_ms *= random.uniform(0.5, 1.0)  # many drivers retrying after one outage spread out
            left_ms = deadline - self._clock()
            if attempts > config.max_retries or wait_ms >= left_ms:
                tried = "; ".join(f"{url}: {cause}" for url, cause in causes.items())
                raise RegistryUnavailableError(
                    f"{what}: the Schema Registry is unavailable after {attempts} attempt(s) within timeout.ms="
                    f"{config.timeout_ms} (max.retries={config.max_retries}): {tried}",
                    url=endpoint.url, status=status)
            log.info("%s: %s: %s; retrying in %.0f ms", what, endpoint.url, causes.get(endpoint.url), wait_ms)
            self._clock.sleep(wait_ms / 1000)

    def _has_credentials(self, endpoint: Endpoint) -> bool:
        return bool(endpoint.user_info or self.config.user_info)

    def _send(self, endpoint: Endpoint, method: str, path: str, data: bytes | None,
              deadline: float) -> tuple[int, str, bytes]:
        timeout = max(deadline - self._clock(), 1.0) / 1000  # covers the connect and each read
        connection: http.client.HTTPConnection
        if endpoint.scheme == "https":
            connection = http.client.HTTPSConnection(endpoint.host, endpoint.port, timeout=timeout,
                                                     context=self._ssl)
        else:
            connection = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout)
        headers = {"Accept": _ACCEPT}
        if data is not None:
            headers["Content-Type"] = _CONTENT_TYPE
        user_info = endpoint.user_info or self.config.user_info
        if user_info is not None:
            token = base64.b64encode(f"{user_info[0]}:{user_info[1]}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        try:
            connection.request(method, endpoint.path + path, body=data, headers=headers)
            response = connection.getresponse()
            return response.status, response.reason, response.read()
        finally:
            connection.close()


def _describe(exc: BaseException, endpoint: Endpoint) -> str:
    """What happened to a connection, in words."""
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError):
        return "connection reset"
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "no answer in time"
    if isinstance(exc, socket.gaierror):
        return f"host name {endpoint.host!r} not resolved ({exc.strerror})"
    if isinstance(exc, http.client.RemoteDisconnected):
        return "connection closed before an answer"
    if isinstance(exc, ssl.SSLError):
        return f"TLS failed: {exc.reason or exc} (is it an https port?)"
    return f"{type(exc).__name__}: {exc}"


def _json(text: bytes, endpoint: Endpoint, what: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise SchemaRegistryError(f"{what}: {endpoint.url} answered with something other than JSON "
                                  f"(is it a Schema Registry?): {text[:200]!r}", url=endpoint.url) from None


def _error_body(text: bytes) -> tuple[int | None, str]:
    """The registry's ``error_code`` and ``message`` (the body itself when it is not JSON)."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and "message" in body:
        code = body.get("error_code")
        return (code if isinstance(code, int) else None), str(body["message"])
    return None, text[:500].decode(errors="replace").strip()


def _error(status: int, reason: str, code: int | None, message: str, endpoint: Endpoint, what: str,
           subject: str | None, credentials: bool) -> SchemaRegistryError:
    """The error for a refusal that no retry can change."""
    url = endpoint.url
    named = f" ({RegistryErrorCode(code).name})" if code is not None and code in set(RegistryErrorCode) else ""
    detail = f"HTTP {status} {reason}" + (f", error code {code}{named}" if code else "") + f": {message}"
    kwargs: dict[str, Any] = {"url": url, "status": status, "error_code": code}
    if status in (http.HTTPStatus.UNAUTHORIZED, http.HTTPStatus.FORBIDDEN):
        hint = ("check basic.auth.user.info, or the URL's user info" if credentials else
                "no credentials are set: basic.auth.user.info, or user info in the URL")
        return RegistryAuthError(f"{what}: the Schema Registry at {url} refused: {detail} ({hint})", **kwargs)
    if status == http.HTTPStatus.CONFLICT:
        return IncompatibleSchemaError(
            f"{what}: the schema is not compatible with the subject's earlier versions under its compatibility "
            f"level (Schema Registry at {url}): {message}", subject=subject, messages=(message,),
            **kwargs)
    if status == http.HTTPStatus.NOT_FOUND and code in _NOT_FOUND:
        return SchemaNotFoundError(f"{what}: not found in the Schema Registry at {url}: {detail}", **kwargs)
    if status == http.HTTPStatus.UNPROCESSABLE_ENTITY:
        return InvalidSchemaError(f"{what}: the Schema Registry at {url} refused it as invalid: {detail}", **kwargs)
    return SchemaRegistryError(f"{what}: the Schema Registry at {url} refused: {detail}", **kwargs)
