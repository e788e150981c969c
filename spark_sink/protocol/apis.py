"""The Kafka APIs kprod speaks: their keys, the versions kprod implements, version choice,
and the bodies' encoding and decoding.

The request and response schemas and their typed classes are generated from Kafka's own
message definitions into :mod:`spark_sink.protocol.kmsg`.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from spark_sink.protocol import kmsg, produce
from spark_sink.protocol import primitives as p
from spark_sink.protocol.error_codes import UnsupportedVersionError
from spark_sink.protocol.schema import Buffer, Schema, decode, encode


class ApiKey(IntEnum):
    """Kafka API keys used by kprod."""

    PRODUCE = 0
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


# The versions kprod implements of each API. The generator reads this table from the
# source (python -m spark_sink.protocol.generate) and clips kmsg's classes and tables to it.
#
# Produce v12, TxnOffsetCommit v5 and EndTxn v5 (Kafka 4.0) are transaction protocol v2
# (KIP-890 part 2): a Produce or TxnOffsetCommit adds its partition to the transaction
# itself, and EndTxn bumps the epoch and answers with it. kprod sends them only where the
# cluster finalizes transaction.version 2 (transaction_version), and within a transaction of
# protocol v1 at most V1_MAX_VERSIONS, as Java's producer does.
# AddPartitionsToTxn v4 and later batch several transactions and are for brokers only
# (Java's client stops at v3 too); under protocol v2 no client sends it.
# SaslHandshake v1 only: v0 (Kafka 0.10) sends the SASL tokens unframed, outside the protocol.
VERSIONS: dict[ApiKey, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 12),
    ApiKey.METADATA: (1, 12),
    ApiKey.OFFSET_COMMIT: (2, 9),
    ApiKey.OFFSET_FETCH: (1, 7),
    ApiKey.FIND_COORDINATOR: (0, 3),
    ApiKey.SASL_HANDSHAKE: (1, 1),
    ApiKey.API_VERSIONS: (0, 3),
    ApiKey.INIT_PRODUCER_ID: (0, 5),
    ApiKey.ADD_PARTITIONS_TO_TXN: (0, 3),
    ApiKey.ADD_OFFSETS_TO_TXN: (0, 4),
    ApiKey.END_TXN: (0, 5),
    ApiKey.TXN_OFFSET_COMMIT: (0, 5),
    ApiKey.DESCRIBE_CONFIGS: (1, 4),
    ApiKey.SASL_AUTHENTICATE: (0, 2),
    ApiKey.DESCRIBE_TRANSACTIONS: (0, 0),
    ApiKey.LIST_TRANSACTIONS: (0, 1),
}


# The feature a cluster finalizes at 2 or more to speak transaction protocol v2, and the
# versions a transaction of protocol v1 may use at most (the later ones are v2's).
TRANSACTION_VERSION_FEATURE = "transaction.version"
V1_MAX_VERSIONS: dict[ApiKey, int] = {ApiKey.PRODUCE: 11, ApiKey.END_TXN: 4, ApiKey.TXN_OFFSET_COMMIT: 4}


def transaction_version(features: dict[str, int], versions: dict[int, int]) -> int:
    """The transaction protocol a broker speaks with kprod: its finalized
    ``transaction.version`` (0 where it finalizes none), but 1 where the versions agreed
    on the connection (``versions``) lack one of protocol v2's."""
    level = features.get(TRANSACTION_VERSION_FEATURE, 0)
    if level >= 2 and any(versions.get(key, -1) <= high for key, high in V1_MAX_VERSIONS.items()):
        return 1
    return level


@dataclass(frozen=True)
class Api:
    """Request and response schemas of one API and the versions this client implements."""

    key: ApiKey
    min_version: int
    max_version: int
    request: Schema
    response: Schema


APIS: dict[int, Api] = {key: Api(key, low, high, *kmsg.SCHEMAS[key]) for key, (low, high) in VERSIONS.items()}


def choose_version(api_key: int, broker_min: int, broker_max: int) -> int:
    """The highest version both this client and the broker support."""
    ours = APIS[api_key]
    version = min(ours.max_version, broker_max)
    if version < max(ours.min_version, broker_min):
        raise UnsupportedVersionError(
            f"{ApiKey(api_key).name}: broker supports v{broker_min}-v{broker_max}, "
            f"kprod v{ours.min_version}-v{ours.max_version}"
        )
    return version


def is_flexible(api_key: int, version: int, response: bool = False) -> bool:
    """Whether this API version uses compact encodings and tagged fields."""
    api = APIS[api_key]
    return version >= (api.response if response else api.request).flexible_from


def encode_request_parts(api_key: int, version: int, body: object) -> list[Buffer]:
    """A request body (an instance of the API's request class in kmsg) as buffers to write
    in order (record bytes are not copied)."""
    if api_key == ApiKey.PRODUCE:
        if not isinstance(body, kmsg.ProduceRequest):
            raise TypeError(f"a Produce request body must be a kmsg.ProduceRequest, not {type(body).__name__}")
        return produce.encode_request(version, body)
    return [encode(APIS[api_key].request, version, body)]


def encode_request_body(api_key: int, version: int, body: object) -> bytes:
    return b"".join(encode_request_parts(api_key, version, body))


def decode_request_body(api_key: int, version: int, data: bytes | memoryview) -> object:
    return decode(APIS[api_key].request, version, data)


def encode_response_body(api_key: int, version: int, body: object) -> bytes:
    return encode(APIS[api_key].response, version, body)


def decode_response_body(api_key: int, version: int, data: bytes | memoryview | p.Reader) -> object:
    """A response body, as an instance of the API's response class in kmsg."""
    if api_key == ApiKey.PRODUCE:
        reader = data if isinstance(data, p.Reader) else p.Reader(data)
        body, reader.pos = produce.decode_response(version, reader.buf[:reader.end], reader.pos)
        return body
    return decode(APIS[api_key].response, version, data)
