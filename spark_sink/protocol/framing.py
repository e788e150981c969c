"""Request/response headers, size-prefixed frames and a sans-IO connection object.

The headers are Kafka's RequestHeader and ResponseHeader definitions (generated into
:mod:`~spark_sink.protocol.kmsg`); which version goes with a message is decided here, as
Kafka's ApiMessageType does: the flexible header with a flexible message, except that an
ApiVersions response always has header v0 (a client must read it before it knows which
versions the broker speaks).

:class:`KafkaProtocol` follows h11's shape: the caller feeds it bytes it read and writes
the bytes it returns; it keeps correlation ids and the (api, version) each response must
be decoded with, and never touches a socket or a clock.

A request sent expecting no response (Produce with acks=0) is remembered too: Kafka never
answers one, but a broker that does (Tansu) answers in order, and that answer is dropped
here rather than taken for a corrupt stream, which would cost the connection and every
request queued behind it.
"""

from __future__ import annotations

from collections import deque

from spark_sink.protocol import primitives as p
from spark_sink.protocol.apis import ApiKey, decode_response_body, encode_request_parts, is_flexible
from spark_sink.protocol.error_codes import CorruptRecordError
from spark_sink.protocol.kmsg import REQUEST_HEADER, RESPONSE_HEADER, ApiVersionsResponse, RequestHeader
from spark_sink.protocol.schema import Buffer, decode, encode

# Correlation ids of requests sent expecting no response, remembered per connection; a
# broker that answers them answers in order, so a few suffice.
_MAX_UNANSWERED = 4096


def request_header_version(api_key: int, api_version: int) -> int:
    """Request header v2 for a flexible request (it adds a tagged-field section; ClientId
    keeps its two-byte length, so any broker can read an ApiVersions request), else v1."""
    return 2 if is_flexible(api_key, api_version) else 1


def response_header_version(api_key: int, api_version: int) -> int:
    """Response header v1 for a flexible response, except ApiVersions', always v0."""
    return 1 if api_key != ApiKey.API_VERSIONS and is_flexible(api_key, api_version, response=True) else 0


def encode_request_header(api_key: int, api_version: int, correlation_id: int, client_id: str | None) -> bytes:
    """The request header for a request of ``api_key`` at ``api_version``."""
    return encode(REQUEST_HEADER, request_header_version(api_key, api_version),
                  RequestHeader(api_key, api_version, correlation_id, client_id))



class KafkaProtocol:
    """Client side of one Kafka connection, sans I/O."""

    def __init__(self, client_id: str | None = "kprod") -> None:
        self.client_id = client_id
        self._next_correlation_id = 0
        self._pending: deque[tuple[int, int, int]] = deque()  # (correlation id, api key, version)
        self._unanswered: deque[int] = deque(maxlen=_MAX_UNANSWERED)  # sent expecting no response
        self._buffer = bytearray()

    @property
    def in_flight(self) -> int:
        """Requests sent that still await a response."""
        return len(self._pending)

    def send_request(self, api_key: int, api_version: int, body: object,
                     expect_response: bool = True) -> tuple[int, bytes]:
        """Frame a request; returns (correlation id, bytes to write including the size prefix)."""
        correlation_id, parts = self.send_request_parts(api_key, api_version, body, expect_response)
        return correlation_id, b"".join(parts)

    def send_request_parts(self, api_key: int, api_version: int, body: object,
                           expect_response: bool = True) -> tuple[int, list[Buffer]]:
        """As :meth:`send_request`, but the frame comes as buffers to write in order (for
        ``sendmsg``), so record bytes are never copied into one frame."""
        correlation_id = self._next_correlation_id
        self._next_correlation_id = (correlation_id + 1) & 0x7FFFFFFF
        header = encode_request_header(api_key, api_version, correlation_id, self.client_id)
        parts = encode_request_parts(api_key, api_version, body)
        size = len(header) + sum(len(part) for part in parts)
        if expect_response:
            self._pending.append((correlation_id, api_key, api_version))
        else:
            self._unanswered.append(correlation_id)
        if len(parts[0]) < 4096:  # the usual case: small leading fields join the header
            parts[0] = p.INT32.pack(size) + header + parts[0]
        else:
            parts.insert(0, p.INT32.pack(size) + header)
        return correlation_id, parts

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[tuple[int, int, int, object]]:
        """Feed bytes read from the socket; returns completed responses in arrival order as
        (correlation id, api key, api version, decoded body)."""
        buf = self._buffer
        buf += data
        responses = []
        pos = 0
        while len(buf) - pos >= 4:
            (size,) = p.INT32.unpack_from(buf, pos)
            if size < 4:
                raise CorruptRecordError(f"response frame of {size} bytes is too short")
            if len(buf) - pos - 4 < size:
                break
            # Every version of the header starts with it (test_kafka_json checks), read before
            # the request it answers, and so the header's version, is known.
            (correlation_id,) = p.INT32.unpack_from(buf, pos + 4)
            start, end = pos + 4, pos + 4 + size
            pos = end
            if self._unanswered and self._answers_unanswered(correlation_id):
                continue
            if not self._pending:
                raise CorruptRecordError(f"response with correlation id {correlation_id} but no request in flight")
            expected, api_key, version = self._pending.popleft()
            if correlation_id != expected:
                raise CorruptRecordError(f"correlation id {correlation_id} does not match the expected {expected}")
            reader = p.Reader(memoryview(buf)[start:end])
            decode(RESPONSE_HEADER, response_header_version(api_key, version), reader)
            body: object
            if api_key == ApiKey.API_VERSIONS and p.INT16.unpack_from(reader.buf, reader.pos)[0] != 0:
                version, body = _decode_api_versions_error(version, reader)
            else:
                body = decode_response_body(api_key, version, reader)
            del reader
            responses.append((correlation_id, api_key, version, body))
        if pos:
            del buf[:pos]
        return responses

    def _answers_unanswered(self, correlation_id: int) -> bool:
        """Whether a response answers a request sent expecting none; forgets those sent
        before its request, which will never be answered (Kafka's behaviour)."""
        unanswered = self._unanswered
        while unanswered:
            oldest = unanswered[0]
            if oldest == correlation_id:
                unanswered.popleft()
                return True
            if (correlation_id - oldest) & 0x7FFFFFFF >= 0x40000000:
                return False  # oldest was sent after this response's request
            unanswered.popleft()
        return False


def _decode_api_versions_error(version: int, reader: p.Reader) -> tuple[int, ApiVersionsResponse]:
    """An ApiVersions error, decoded as the Java client does: in the version that was sent,
    and in v0 only if that fails. Kafka answers a version it does not know in v0's layout
    (KIP-511); other brokers (librdkafka's mock cluster) answer in the layout of the version
    asked. Java's parse gives up on an exception; a v0 body read as v3 can also end early
    or leave bytes over, which is checked here too."""
    start = reader.pos
    if version > 0:
        try:
            body = decode_response_body(ApiKey.API_VERSIONS, version, reader)
        except (CorruptRecordError, ValueError):
            pass
        else:
            if reader.pos == reader.end and isinstance(body, ApiVersionsResponse):
                return version, body
        reader.pos = start
    body = decode_response_body(ApiKey.API_VERSIONS, 0, reader)
    assert isinstance(body, ApiVersionsResponse)  # the codec decodes ApiVersions into its class
    return 0, body
