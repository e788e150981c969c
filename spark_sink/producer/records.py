"""What a user sends and what the broker's acknowledgement tells them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class ProducerRecord:
    """A record to send. key and value are bytes, str (UTF-8) or None unless serializers
    are configured; headers are ``(str, bytes | None)`` pairs; timestamp is epoch ms."""

    topic: str
    value: Any
    key: Any = None
    partition: int | None = None
    headers: list[tuple[str, bytes | None]] | None = None
    timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where an acknowledged record was written; offset is -1 when acks=0."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int
    serialized_value_size: int
