"""What a user sends and what the broker's acknowledgement tells them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple


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


class RecordMetadata(NamedTuple):
    """Where an acknowledged record was written; offset is -1 when acks=0.

    A named tuple (as in kafka-python), not a frozen dataclass: one is made for every
    acknowledged record that has a callback, and this costs a tenth of the dataclass.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int
    serialized_key_size: int
    serialized_value_size: int
