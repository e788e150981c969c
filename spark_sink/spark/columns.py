"""Checks the DataFrame's columns on the driver, before any record is sent.

Columns follow Spark's Kafka sink (value, key, topic, partition, headers) plus
``timestamp``; names match case-insensitively, as Spark resolves columns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pyspark.sql.types import (
    ArrayType, BinaryType, DataType, IntegerType, LongType, StringType, StructType, TimestampNTZType, TimestampType,
)

from spark_sink.producer.errors import ColumnError

log = logging.getLogger(__name__)

ACCEPTED: dict[str, str] = {
    "value": "string or binary (required; nulls are sent as null values)",
    "key": "string or binary (null keys are spread over partitions)",
    "topic": "string (required unless the 'topic' option is set, which then overrides it)",
    "partition": "int or bigint (null lets the partitioner choose)",
    "headers": "array<struct<key: string, value: binary>>",
    "timestamp": "timestamp, timestamp_ntz (read as UTC) or bigint epoch milliseconds (null: the send time)",
}


def _binary_or_string(t: DataType) -> bool:
    return isinstance(t, (StringType, BinaryType))


def _headers(t: DataType) -> bool:
    if not isinstance(t, ArrayType) or not isinstance(t.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in t.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], BinaryType)
    )


_CHECKS = {
    "value": _binary_or_string,
    "key": _binary_or_string,
    "topic": lambda t: isinstance(t, StringType),
    "partition": lambda t: isinstance(t, (IntegerType, LongType)),
    "headers": _headers,
    "timestamp": lambda t: isinstance(t, (TimestampType, TimestampNTZType, LongType)),
}

_HINTS = {
    "value": "e.g. to_json(struct(...)) AS value, or CAST(x AS STRING)",
    "key": "e.g. CAST(x AS STRING) AS key",
    "headers": "e.g. array(struct(lit('h') AS key, CAST(x AS BINARY) AS value)) AS headers",
    "partition": "e.g. CAST(x AS INT) AS partition",
    "timestamp": "e.g. CAST(x AS TIMESTAMP) AS timestamp",
    "topic": "e.g. CAST(x AS STRING) AS topic",
}


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """How a task turns Spark's Arrow batches into ``send_arrow`` input.

    ``names`` are the canonical (lower-case) names, position by position; ``drop`` are
    positions not sent (the topic column when the topic option overrides it).
    """

    names: tuple[str, ...]
    drop: tuple[int, ...]
    renamed: bool


def plan_columns(schema: StructType, topic_option: str | None) -> ColumnPlan:
    """Check ``schema``; raise ColumnError naming the column and what is accepted."""
    seen: dict[str, str] = {}
    names: list[str] = []
    for f in schema.fields:
        name = f.name.lower()
        if name not in _CHECKS:
            raise ColumnError(
                f"column {f.name!r} is not accepted by kprod; the columns are "
                f"{', '.join(ACCEPTED)}. Put other columns into the value or a header, "
                "e.g. select(to_json(struct(*cols)).alias('value'))"
            )
        if name in seen:
            raise ColumnError(f"columns {seen[name]!r} and {f.name!r} are the same column for kprod; keep one")
        if not _CHECKS[name](f.dataType):
            raise ColumnError(
                f"column {f.name!r} has type {f.dataType.simpleString()}; kprod accepts "
                f"{ACCEPTED[name]} ({_HINTS[name]})"
            )
        seen[name] = f.name
        names.append(name)
    if "value" not in seen:
        raise ColumnError(
            f"column 'value' is required ({ACCEPTED['value']}); "
            f"the DataFrame has {', '.join(map(repr, schema.fieldNames())) or 'no columns'}"
            " (e.g. select(to_json(struct(*cols)).alias('value')))"
        )
    drop: tuple[int, ...] = ()
    if "topic" in seen and topic_option:
        # Spark's Kafka sink does the same: the option wins over the column.
        log.info("option topic=%s overrides column %r", topic_option, seen["topic"])
        drop = (names.index("topic"),)
    if "topic" not in seen and not topic_option:
        raise ColumnError(
            "no topic: set the 'topic' option or add a 'topic' column (string) naming each row's topic"
        )
    renamed = tuple(names) != tuple(schema.fieldNames())
    return ColumnPlan(tuple(names), drop, renamed)
