"""Checks the DataFrame's columns on the driver, before any record is sent.

The column contract is the producer's: each column, converted to the Arrow type Spark
hands a task, goes through ``check_arrow_column``, and the whole through
``check_arrow_schema``. What is Spark's own stays here: names match case-insensitively,
as Spark resolves columns (so two columns may be the same one); the topic option
overrides a topic column, as in Spark's Kafka sink; and errors speak Spark's types and
give Spark hints.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import DataType, StructField, StructType

from spark_sink.producer import ColumnError, check_arrow_column, check_arrow_schema

log = logging.getLogger(__name__)

# The producer's columns (ARROW_COLUMNS), in Spark's types.
ACCEPTED: dict[str, str] = {
    "value": "string or binary (required; nulls are sent as null values)",
    "key": "string or binary (null keys are spread over partitions)",
    "topic": "string (required unless the 'topic' option is set, which then overrides it)",
    "partition": "int or bigint (null lets the partitioner choose)",
    "headers": "array<struct<key: string, value: binary>>",
    "timestamp": "timestamp, timestamp_ntz (read as UTC) or bigint epoch milliseconds (null: the send time)",
}

_HINTS = {
    "value": "e.g. to_json(struct(...)) AS value, or CAST(x AS STRING)",
    "key": "e.g. CAST(x AS STRING) AS key",
    "headers": "e.g. array(struct(lit('h') AS key, CAST(x AS BINARY) AS value)) AS headers",
    "partition": "e.g. CAST(x AS INT) AS partition",
    "timestamp": "e.g. CAST(x AS TIMESTAMP) AS timestamp",
    "topic": "e.g. CAST(x AS STRING) AS topic",
}

_PACK_HINT = "e.g. select(to_json(struct(*cols)).alias('value'))"


@dataclass(frozen=True, slots=True)
class ColumnPlan:
    """How a task turns Spark's Arrow batches into ``send_arrow`` input.

    ``names`` are the canonical (lower-case) names, position by position; ``drop`` are
    positions not sent (the topic column when the topic option overrides it).
    """

    names: tuple[str, ...]
    drop: tuple[int, ...]
    renamed: bool


# PySpark 4.2 names the session time zone ``timezone``; 4.1 has ``timestamp_utc`` instead.
_UTC = ({"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_type).parameters
        else {"timestamp_utc": True})


def arrow_type_of(data_type: DataType) -> pa.DataType:
    """The Arrow type of a Spark column as a task receives it."""
    try:
        return to_arrow_type(data_type, **_UTC)
    except Exception:
        return pa.null()  # which no column accepts


def _checked_field(f: StructField, name: str) -> pa.Field:
    """``f`` as the producer will see it, or ColumnError in Spark's words."""
    arrow_type = arrow_type_of(f.dataType)
    try:
        check_arrow_column(name, arrow_type)
    except ColumnError as exc:
        raise ColumnError(
            f"column {f.name!r} has type {f.dataType.simpleString()}; kprod accepts {ACCEPTED[name]} "
            f"({_HINTS[name]})") from exc
    return pa.field(name, arrow_type)


def plan_columns(schema: StructType, topic_option: str | None, formatted: frozenset[str] = frozenset()
                 ) -> ColumnPlan:
    """Check ``schema``; raise ColumnError naming the column and what is accepted. The
    ``formatted`` columns (a key or value format's) are checked by their serializer."""
    seen: dict[str, str] = {}
    fields: list[pa.Field] = []
    extra: list[int] = []
    for i, f in enumerate(schema.fields):
        name = f.name.lower()
        if name not in ACCEPTED:
            # Spark's Kafka sink ignores every other column (select("*") brings many):
            # so does kprod, which never sends them to a task's producer.
            extra.append(i)
            fields.append(pa.field(f.name, pa.null()))
            continue
        if name in seen:
            raise ColumnError(f"columns {seen[name]!r} and {f.name!r} are the same column for kprod; keep one")
        seen[name] = f.name
        # A formatted column is sent as the bytes its serializer makes.
        fields.append(pa.field(name, pa.binary()) if name in formatted else _checked_field(f, name))
    names = [f.name for f in fields]
    if extra:
        log.warning("kprod ignores column(s) %s, as Spark's Kafka sink does: it writes key, value, topic, partition, "
                    "headers and timestamp; Spark still hands the others to each task, so select only what is written "
                    "(%s)", ", ".join(repr(schema.fields[i].name) for i in extra), _PACK_HINT)
    drop = tuple(extra)
    if "topic" in seen and topic_option:
        # Spark's Kafka sink does the same: the option wins over the column.
        log.info("option topic=%s overrides column %r", topic_option, seen["topic"])
        drop = tuple(sorted(drop + (names.index("topic"),)))
    try:
        check_arrow_schema(pa.schema([f for i, f in enumerate(fields) if i not in drop]), topic_option)
    except ColumnError as exc:  # a column missing
        if "value" in seen:
            raise ColumnError(f"{exc}: in Spark, set the 'topic' option (the default topic)") from exc
        columns = ", ".join(map(repr, schema.fieldNames())) or "no columns"
        raise ColumnError(f"{exc}; the DataFrame has {columns} ({_PACK_HINT})") from exc
    renamed = tuple(names) != tuple(schema.fieldNames())
    return ColumnPlan(tuple(names), drop, renamed)
