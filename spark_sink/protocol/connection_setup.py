"""Connection bring-up as a sans-IO state machine: ApiVersions, then SASL, then the end of
the SASL session's lifetime.

Shaped after h11: :data:`TRANSITIONS` is the whole machine, a table of
(state, event) -> next state. The caller hands over the bytes it read, with the time;
the machine classifies each response into an :class:`Event`, looks up the next state and
runs that state's entry action, which says what to do next as outputs: :class:`Send`
(a request frame to write), :class:`Ready` or :class:`Failed`. It never touches a socket
and never reads a clock.

The exchanges: ApiVersions (KIP-35; a broker that does not know the version asked for
answers UNSUPPORTED_VERSION with the versions it knows, KIP-511, in v0's layout or in that
of the version asked, and the request is sent again at the highest both know), then, with SASL, SaslHandshake v1 (KIP-43) and
SaslAuthenticate
(KIP-152) carrying the mechanism's tokens until the client's side is complete. A session
with a lifetime (KIP-368) is renewed before the broker ends it: past ``renew_fraction``
of it (which the owner draws at random, as Java does, so that a fleet of clients does not
renew at once) the connection takes no new request (RENEWING), and its owner replaces it
with a freshly authenticated one once the requests on it are answered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from spark_sink.protocol import kmsg, sasl
from spark_sink.protocol.apis import APIS, ApiKey, choose_version
from spark_sink.protocol.error_codes import (
    IllegalSaslStateError,
    KProdError,
    UnsupportedSaslMechanismError,
    UnsupportedVersionError,
    failure_for_code,
)
from spark_sink.protocol.framing import KafkaProtocol

# Who is asking (KIP-511): Kafka checks both names against its pattern of letters, digits,
# dots and dashes, and answers INVALID_REQUEST to anything else.
_API_VERSIONS_REQUEST = kmsg.ApiVersionsRequest(client_software_name="kprod", client_software_version="0.1.0")


class SetupState(Enum):
    """Where a connection's bring-up stands."""

    CONNECTING = "the transport (TCP, TLS) is not up yet"
    API_VERSIONS = "ApiVersions sent"
    SASL_HANDSHAKE = "SaslHandshake sent"
    SASL_AUTHENTICATE = "SaslAuthenticate sent"
    READY = "ready for requests"
    RENEWING = "SASL session ending: no new request"
    FAILED = "failed"


class Event(Enum):
    """What happened: the table's inputs."""

    CONNECTED = "the transport is up"
    VERSION_TOO_NEW = "the broker does not know the ApiVersions version asked for"
    VERSIONS_AGREED = "versions agreed, no SASL to do"
    VERSIONS_AGREED_SASL = "versions agreed, SASL to do"
    NO_SASL_API = "SASL to do, but the broker has no SaslHandshake v1 or SaslAuthenticate"
    VERSIONS_ERROR = "ApiVersions answered with an error"
    MECHANISM_ACCEPTED = "the broker enables the mechanism"
    MECHANISM_REFUSED = "the broker does not enable the mechanism"
    HANDSHAKE_ERROR = "SaslHandshake answered with another error"
    CHALLENGE = "a server token the client answers"
    AUTHENTICATED = "the exchange is complete on both sides"
    CREDENTIALS_REFUSED = "SaslAuthenticate answered with an error"
    EXCHANGE_FAILED = "the client refused a server token (bad message, wrong signature)"
    SESSION_ENDING = "the SASL session's lifetime is nearly over"


S, E = SetupState, Event

TRANSITIONS: dict[tuple[SetupState, Event], SetupState] = {
    (S.CONNECTING, E.CONNECTED): S.API_VERSIONS,
    (S.API_VERSIONS, E.VERSION_TOO_NEW): S.API_VERSIONS,
    (S.API_VERSIONS, E.VERSIONS_AGREED): S.READY,
    (S.API_VERSIONS, E.VERSIONS_AGREED_SASL): S.SASL_HANDSHAKE,
    (S.API_VERSIONS, E.NO_SASL_API): S.FAILED,
    (S.API_VERSIONS, E.VERSIONS_ERROR): S.FAILED,
    (S.SASL_HANDSHAKE, E.MECHANISM_ACCEPTED): S.SASL_AUTHENTICATE,
    (S.SASL_HANDSHAKE, E.MECHANISM_REFUSED): S.FAILED,
    (S.SASL_HANDSHAKE, E.HANDSHAKE_ERROR): S.FAILED,
    (S.SASL_AUTHENTICATE, E.CHALLENGE): S.SASL_AUTHENTICATE,
    (S.SASL_AUTHENTICATE, E.AUTHENTICATED): S.READY,
    (S.SASL_AUTHENTICATE, E.CREDENTIALS_REFUSED): S.FAILED,
    (S.SASL_AUTHENTICATE, E.EXCHANGE_FAILED): S.FAILED,
    (S.READY, E.SESSION_ENDING): S.RENEWING,
}

# Events after which authentication has failed (not merely the connection): threads
# waiting for metadata then fail at once, as in Java.
AUTHENTICATION_FAILURES = frozenset({
    E.NO_SASL_API, E.MECHANISM_REFUSED, E.HANDSHAKE_ERROR, E.CREDENTIALS_REFUSED, E.EXCHANGE_FAILED})

del S, E


class SetupError(KProdError):
    """An event the table has no transition for: a bug, or a broker answering out of turn."""


@dataclass(frozen=True, slots=True)
class Send:
    """A request frame to write."""

    data: bytes


@dataclass(frozen=True, slots=True)
class Ready:
    """The connection takes requests: ``versions`` maps each API kprod uses that the broker
    supports to the highest version both know; ``features`` the cluster's finalized
    features (name -> level) as the broker knows them at ``features_epoch`` (-1: none)."""

    versions: dict[int, int]
    features: dict[str, int] = field(default_factory=dict)
    features_epoch: int = -1


@dataclass(frozen=True, slots=True)
class Failed:
    """Bring-up failed; ``reason`` says why and what to check (never a secret).
    ``authentication``: the broker refused our credentials or mechanism, or could not
    prove it knows the password."""

    reason: str
    authentication: bool


Output = Send | Ready | Failed


class ConnectionSetup:
    """The bring-up of one connection, fed the bytes read and the time (monotonic ms).

    ``protocol`` frames the requests (it stays the connection's afterwards); ``exchange``
    is a fresh SASL mechanism for this connection, or None without SASL;
    ``renew_fraction`` is the share of a session's lifetime after which it is renewed.
    """

    def __init__(self, protocol: KafkaProtocol, exchange: sasl.SaslMechanism | None = None,
                 renew_fraction: float = 0.9) -> None:
        self.protocol = protocol
        self.state = SetupState.CONNECTING
        self.versions: dict[int, int] = {}
        self.features: dict[str, int] = {}
        self.features_epoch = -1
        # When the request now awaiting its answer was sent (None: none is), so that the
        # caller can time it out like any other.
        self.request_sent_ms: float | None = None
        # When the SASL session is to be renewed; 0: it has no lifetime.
        self.renew_at_ms = 0.0
        self._exchange = exchange
        self._renew_fraction = renew_fraction
        self._api_versions_version = APIS[ApiKey.API_VERSIONS].max_version

    # -- inputs ---------------------------------------------------------------

    def connected(self, now: float) -> list[Output]:
        """The transport is up: the first request to write."""
        return self._fire(Event.CONNECTED, None, now)

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> list[Output]:
        """Bytes read from the connection during bring-up; what to do next."""
        outputs: list[Output] = []
        for _, api_key, version, body in self.protocol.receive_data(data):
            awaited = self._RESPONSES.get(self.state)
            if awaited is None or api_key != awaited[0]:
                raise SetupError(f"unexpected {ApiKey(api_key).name} response in state {self.state.name}")
            event, detail = awaited[1](self, version, body)
            outputs += self._fire(event, detail, now)
        return outputs

    def session_ending(self, now: float) -> bool:
        """True once the SASL session is due to be renewed: the connection takes no new
        request and is to be replaced once its requests are answered."""
        if self.state is SetupState.READY and self.renew_at_ms and now >= self.renew_at_ms:
            self._fire(Event.SESSION_ENDING, None, now)
        return self.state is SetupState.RENEWING

    # -- the machine ----------------------------------------------------------

    def _fire(self, event: Event, detail: Any, now: float) -> list[Output]:
        target = TRANSITIONS.get((self.state, event))
        if target is None:
            raise SetupError(f"no transition for {event.name} in state {self.state.name}")
        self.state = target
        self.request_sent_ms = None
        return self._ENTRY[target](self, event, detail, now)

    def _request(self, api_key: ApiKey, version: int, body: object, now: float) -> list[Output]:
        _, frame = self.protocol.send_request(api_key, version, body)
        self.request_sent_ms = now
        return [Send(frame)]

    # Entry actions: what entering each state does; ``detail`` comes from the classifier.

    def _enter_api_versions(self, event: Event, detail: Any, now: float) -> list[Output]:
        if event is Event.VERSION_TOO_NEW:
            self._api_versions_version = detail
        return self._request(ApiKey.API_VERSIONS, self._api_versions_version, _API_VERSIONS_REQUEST, now)

    def _enter_sasl_handshake(self, event: Event, detail: Any, now: float) -> list[Output]:
        assert self._exchange is not None
        return self._request(ApiKey.SASL_HANDSHAKE, self.versions[ApiKey.SASL_HANDSHAKE],
                             kmsg.SaslHandshakeRequest(self._exchange.name), now)

    def _enter_sasl_authenticate(self, event: Event, detail: Any, now: float) -> list[Output]:
        return self._request(ApiKey.SASL_AUTHENTICATE, self.versions[ApiKey.SASL_AUTHENTICATE],
                             kmsg.SaslAuthenticateRequest(detail), now)

    def _enter_ready(self, event: Event, detail: Any, now: float) -> list[Output]:
        lifetime = detail or 0
        self.renew_at_ms = now + lifetime * self._renew_fraction if lifetime > 0 else 0.0
        self._exchange = None
        return [Ready(self.versions, self.features, self.features_epoch)]

    def _enter_failed(self, event: Event, detail: Any, now: float) -> list[Output]:
        return [Failed(detail, event in AUTHENTICATION_FAILURES)]

    def _enter_renewing(self, event: Event, detail: Any, now: float) -> list[Output]:
        return []

    _ENTRY: dict[SetupState, Callable[..., list[Output]]] = {
        SetupState.API_VERSIONS: _enter_api_versions,
        SetupState.SASL_HANDSHAKE: _enter_sasl_handshake,
        SetupState.SASL_AUTHENTICATE: _enter_sasl_authenticate,
        SetupState.READY: _enter_ready,
        SetupState.FAILED: _enter_failed,
        SetupState.RENEWING: _enter_renewing,
    }

    # Classifiers: a response in its state -> (event, detail for the entry action).

    def _on_api_versions(self, version: int, body: kmsg.ApiVersionsResponse) -> tuple[Event, Any]:
        code = body.error_code
        sent = self._api_versions_version
        if code == UnsupportedVersionError.code and sent > 0:
            # The broker's own range for ApiVersions comes with the error (KIP-511), in the
            # layout of the version sent or of v0 (the framing reads either, as Java does).
            # As Java: ask again at the highest version it lists, 0 if it lists none; and
            # never at the version just refused, so a broker listing it cannot loop us.
            theirs = [e.max_version for e in body.api_keys if e.api_key == ApiKey.API_VERSIONS]
            return Event.VERSION_TOO_NEW, min(sent - 1, max(theirs or [0]))
        if code:
            return Event.VERSIONS_ERROR, f"ApiVersions failed: {failure_for_code(code).name}"
        versions = {}
        for entry in body.api_keys:
            try:
                versions[entry.api_key] = choose_version(entry.api_key, entry.min_version, entry.max_version)
            except (KeyError, UnsupportedVersionError):
                continue  # an API kprod does not use, or none of its versions is common
        self.versions = versions
        self.features = {f.name: f.max_version_level for f in body.finalized_features}
        self.features_epoch = body.finalized_features_epoch
        if self._exchange is None:
            return Event.VERSIONS_AGREED, None
        if ApiKey.SASL_HANDSHAKE not in versions or ApiKey.SASL_AUTHENTICATE not in versions:
            return Event.NO_SASL_API, ("the broker does not support SaslHandshake v1 and SaslAuthenticate "
                                       "(Kafka 1.0 or newer), or has no SASL listener on this port")
        return Event.VERSIONS_AGREED_SASL, None

    def _on_sasl_handshake(self, version: int, body: kmsg.SaslHandshakeResponse) -> tuple[Event, Any]:
        assert self._exchange is not None
        code = body.error_code
        if code == UnsupportedSaslMechanismError.code:
            offered = ", ".join(body.mechanisms) or "none"
            return Event.MECHANISM_REFUSED, (f"sasl.mechanism {self._exchange.name} is not enabled on the broker; "
                                             f"it offers {offered}")
        if code == IllegalSaslStateError.code:
            # What a listener without SASL (PLAINTEXT or SSL) answers a SaslHandshake with.
            return Event.HANDSHAKE_ERROR, ("SaslHandshake failed: ILLEGAL_SASL_STATE (is this a SASL listener? "
                                           "a PLAINTEXT or SSL one answers so; check security.protocol)")
        if code:
            return Event.HANDSHAKE_ERROR, f"SaslHandshake failed: {failure_for_code(code).name}"
        return Event.MECHANISM_ACCEPTED, self._exchange.first_token()

    def _on_sasl_authenticate(self, version: int, body: kmsg.SaslAuthenticateResponse) -> tuple[Event, Any]:
        assert self._exchange is not None
        code = body.error_code
        if code:
            reason = body.error_message or failure_for_code(code).name
            return Event.CREDENTIALS_REFUSED, f"{reason} ({self._exchange.hint})"
        try:
            token = self._exchange.respond(body.auth_bytes)
        except sasl.SaslError as exc:
            return Event.EXCHANGE_FAILED, str(exc)
        if token is not None:
            return Event.CHALLENGE, token
        return Event.AUTHENTICATED, body.session_lifetime_ms

    # The response each waiting state expects, and its classifier.
    _RESPONSES: dict[SetupState, tuple[ApiKey, Callable[..., tuple[Event, Any]]]] = {
        SetupState.API_VERSIONS: (ApiKey.API_VERSIONS, _on_api_versions),
        SetupState.SASL_HANDSHAKE: (ApiKey.SASL_HANDSHAKE, _on_sasl_handshake),
        SetupState.SASL_AUTHENTICATE: (ApiKey.SASL_AUTHENTICATE, _on_sasl_authenticate),
    }
