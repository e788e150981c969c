"""Key and value columns into the Schema Registry's wire format: byte 0, the schema's id
(4 bytes, big-endian), then the Avro binary body or the JSON text, as Confluent's
serializers write them, from a struct column in compiled loops (``encoder.formats``).

``ArrowSerializer`` decides the schema and its registry id once per subject: given
(``schema``) or derived from the column's Arrow type as Spark's ``to_avro`` derives it,
registered (``auto_register``), looked up, or the subject's latest (``use_latest``). The
Spark sink resolves the ids on the driver and ships the serializer, ids included, to the
tasks; ``send_arrow(..., value_serializer=...)`` uses the same object."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.client.errors import ColumnError, ConfigError
from spark_sink.encoder.formats import AvroEncoder, JsonEncoder, WireBudget, avro_schema_for, json_schema_for
from spark_sink.producer.row_errors import RowRefusals, rows_of, topic_name_error
from spark_sink.registry import IncompatibleSchemaError, RegistryConfig, SchemaRegistryClient, subject_name

FORMATS = ("avro", "json")
_SCHEMA_TYPES = {"avro": "AVRO", "json": "JSON"}
MAGIC = b"\x00"


class ArrowSerializer:
    """One column (``key`` or ``value``, a struct) of every row into the registry's wire
    format. Picklable: its registry client is made again where it is used, on ``clock``
    (the time of the registry calls' deadlines and retry waits)."""

    def __init__(self, fmt: str, registry: RegistryConfig | Mapping[str, Any], *, is_key: bool = False,
                 schema: str | Mapping[str, Any] | None = None, subject_name_strategy: str = "TopicNameStrategy",
                 auto_register: bool = True, use_latest_version: bool = False, clock: Time = SYSTEM_TIME) -> None:
        if fmt not in FORMATS:
            raise ConfigError(f"format: expected one of {', '.join(FORMATS)} (or binary, no serializer), got {fmt!r}")
        subject_name(subject_name_strategy, "topic", "record", is_key)  # ConfigError naming the setting
        self.format = fmt
        self.registry = registry if isinstance(registry, RegistryConfig) else RegistryConfig.from_mapping(registry)
        self.is_key = is_key
        self.column = "key" if is_key else "value"
        self.schema = json.dumps(schema) if isinstance(schema, Mapping) else schema
        if self.schema is not None:
            try:
                json.loads(self.schema)
            except ValueError as exc:
                raise ConfigError(f"{self.column}.{fmt}.schema: not JSON ({exc})") from None
        self.strategy = subject_name_strategy
        self.auto_register = auto_register
        self.use_latest = use_latest_version
        self.clock = clock
        # subject -> (schema id, schema text): what the driver resolved travels to the tasks.
        self.resolved: dict[str, tuple[int, str]] = {}
        self._client: SchemaRegistryClient | None = None
        self._encoders: dict[tuple[str, pa.DataType], AvroEncoder | JsonEncoder] = {}
        # (topic, column type) -> its entry of ``resolved``: each call after the first
        # derives, checks and names nothing again.
        self._by_topic: dict[tuple[str, pa.DataType], tuple[int, str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_encoders": {}, "_by_topic": {}}

    @property
    def client(self) -> SchemaRegistryClient:
        if self._client is None:
            self._client = SchemaRegistryClient(self.registry, self.clock)
        return self._client

    def _schema_text(self, arrow_type: pa.DataType) -> str:
        """The given schema, or the one Spark's mapping gives ``arrow_type``."""
        if self.schema is not None:
            return self.schema
        if self.format == "avro":
            return json.dumps(avro_schema_for(arrow_type, column=self.column), separators=(",", ":"))
        return json.dumps(json_schema_for(arrow_type, column=self.column), separators=(",", ":"))

    def _record_name(self, schema_text: str) -> str | None:
        schema = json.loads(schema_text)
        if not isinstance(schema, dict):
            return None
        if self.format == "json":
            title = schema.get("title")
            return title if isinstance(title, str) else None
        name, space = schema.get("name"), schema.get("namespace")
        if not isinstance(name, str):
            return None
        return name if "." in name or not space else f"{space}.{name}"

    def subject(self, topic: str, arrow_type: pa.DataType) -> str:
        return subject_name(self.strategy, topic, self._record_name(self._schema_text(arrow_type)), self.is_key)

    def prepare(self, arrow_type: pa.DataType, topic: str) -> int:
        """The schema id rows of ``arrow_type`` to ``topic`` carry: registered, looked up or
        the subject's latest, once per subject. Checks the column against the schema first,
        so that a column the schema cannot carry fails here, naming it."""
        return self._prepared(arrow_type, topic)[0]

    def _prepared(self, arrow_type: pa.DataType, topic: str) -> tuple[int, str]:
        """(schema id, schema text) for rows of ``arrow_type`` to ``topic``."""
        found = self._by_topic.get((topic, arrow_type))
        if found is None:
            self.check(arrow_type)
            subject = self.subject(topic, arrow_type)
            found = self.resolved.get(subject)
            if found is None:
                found = self.resolved[subject] = self._resolve(subject, arrow_type)
            self._encoder(found[1], arrow_type)  # the registry's schema, where it is the latest
            self._by_topic[(topic, arrow_type)] = found
        return found

    def check(self, arrow_type: pa.DataType) -> None:
        """Check the column against the schema given or derived, asking no registry (where
        the subject is not known yet: it depends on each row's topic)."""
        if not pa.types.is_struct(arrow_type):
            raise ConfigError(f"column {self.column!r}: kprod.{self.column}.format={self.format} encodes a struct "
                              f"(e.g. struct(*cols) AS {self.column}), got {arrow_type}")
        if not self.use_latest:
            self._encoder(self._schema_text(arrow_type), arrow_type)

    def _resolve(self, subject: str, arrow_type: pa.DataType) -> tuple[int, str]:
        schema_type = _SCHEMA_TYPES[self.format]
        if self.use_latest:
            latest = self.client.latest(subject)
            return latest.id, latest.schema_str
        text = self._schema_text(arrow_type)
        if not self.auto_register:
            found = self.client.lookup(subject, text, schema_type)
            if found is None:
                raise ConfigError(
                    f"subject {subject!r} of the Schema Registry has no version with the {self.column} schema "
                    f"{'given' if self.schema else 'derived from the DataFrame'} (auto.register.schemas=false): "
                    f"register it first, or set kprod.auto.register.schemas=true; schema: {text}")
            return found.id, text
        try:
            return self.client.register(subject, text, schema_type), text
        except IncompatibleSchemaError as exc:
            if self.schema is None:
                exc.add_note(
                    f"kprod derived the {self.column} schema from the DataFrame as Spark's to_avro does, where a "
                    "nullable field is a union [type, \"null\"] that can carry no null default: adding a column "
                    "is then no BACKWARD-compatible change. Give the schema, with defaults for new fields, in "
                    f"kprod.{self.column}.{self.format}.schema")
            else:
                exc.add_note(
                    f"The {self.column} schema given in kprod.{self.column}.{self.format}.schema is not a change the "
                    "subject's compatibility level allows (under BACKWARD, Confluent's default: a new field needs "
                    "a default, and no field may change its type): change the schema there, or write to another "
                    "subject")
            raise

    def _encoder(self, schema_text: str, arrow_type: pa.DataType) -> AvroEncoder | JsonEncoder:
        key = (schema_text, arrow_type)
        encoder = self._encoders.get(key)
        if encoder is None:
            kind = AvroEncoder if self.format == "avro" else JsonEncoder
            encoder = self._encoders[key] = kind(schema_text, arrow_type, column=self.column)
        return encoder

    def serialize(self, column: pa.Array | pa.ChunkedArray, topics: str | pa.Array | pa.ChunkedArray,
                  refused: list[tuple[np.ndarray, Exception]] | None = None,
                  budget: WireBudget | None = None) -> pa.Array:
        """The column's rows in the wire format (a null row stays null: a tombstone), to
        ``topics`` (one topic, or each row's). With ``refused`` (a list), a row the
        schema cannot carry (or with a null topic) is null in the result and listed there,
        by reason, instead of failing the call. Past ``budget``, WireBudgetExceeded."""
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if not len(column):  # every row refused before (invalid topics): no subject to name
            return pa.array([], pa.binary())
        if isinstance(topics, str):
            return self._serialize_one(column, topics, refused, budget)
        if isinstance(topics, pa.ChunkedArray):
            topics = topics.combine_chunks()
        distinct = pc.unique(topics).to_pylist()
        if len(distinct) == 1 and distinct[0] is not None:
            return self._serialize_one(column, distinct[0], refused, budget)
        # Each topic's rows with its own id, encoded in place (the others skipped: a take
        # of a list column would make an index per value, 8 bytes per boolean), then back
        # in the rows' order (compiled takes of the binaries). A refused row or one past
        # the budget is named by its index in the column.
        pieces, order = [], []
        for topic in distinct:
            if topic is None:
                if refused is None:
                    raise ConfigError("column 'topic': a null topic (every row needs one, or set the topic option)")
                rows = np.flatnonzero(topics.is_null().to_numpy(zero_copy_only=False))
                refused.append((rows, ColumnError("column 'topic' is null and no default topic is set")))
                pieces.append(pa.nulls(len(rows), pa.binary()))
                order.append(rows)
                continue
            selected = pc.fill_null(pc.equal(topics, topic), False).to_numpy(zero_copy_only=False)
            pieces.append(self._serialize_one(column, topic, refused, budget, selected).filter(selected))
            order.append(np.flatnonzero(selected))
        if len({p.type for p in pieces}) > 1:
            pieces = [p.cast(pa.large_binary()) for p in pieces]
        joined = pa.concat_arrays(pieces)
        return joined.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))

    def _serialize_one(self, column: pa.Array, topic: str, refused: list[tuple[np.ndarray, Exception]] | None = None,
                       budget: WireBudget | None = None, selected: np.ndarray | None = None) -> pa.Array:
        schema_id, text = self._prepared(column.type, topic)
        encoder = self._encoder(text, column.type)
        prefix = MAGIC + schema_id.to_bytes(4, "big")
        if refused is None:
            return encoder.encode(column, prefix=prefix, budget=budget, selected=selected)
        encoded, bad = encoder.encode_valid(column, prefix=prefix, budget=budget, selected=selected)
        refused += bad
        return encoded


def serialize_columns(data: pa.RecordBatch | pa.Table, topic: str | None, key_serializer: ArrowSerializer | None,
                      value_serializer: ArrowSerializer | None, refusals: RowRefusals | None = None,
                      budget: WireBudget | None = None) -> pa.Table:
    """``data`` with its key and value columns serialized, by the serializers given.

    Each row's subject is named after the topic it is sent to: its ``topic`` column's,
    ``topic`` where that is null or absent (as ``send_arrow`` chooses). A row whose topic
    name Kafka refuses is refused (or fails the call) before any subject is resolved, so
    that none is registered for it. With ``refusals`` (made over ``data``), a row its key
    or value format cannot carry is refused there (its columns as they were: the dead
    letter's) and left out of the result; else it fails the call, naming the column path
    and the row. With ``budget``, the key and value share it, and an encoding past it
    raises WireBudgetExceeded (serialize fewer rows: a row count it gives fits)."""
    table = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
    serializers = [s for s in (key_serializer, value_serializer) if s is not None]
    if not serializers:
        return table
    topics: str | pa.Array | None = topic
    if "topic" in table.column_names:
        column = table.column("topic").combine_chunks()
        topics = column if topic is None else pc.fill_null(column, topic)
    kept = _without_invalid_topics(topics, refusals)
    if kept is not None:
        table = rows_of(table, kept)  # not one take: a list column's would make an index per value
        if isinstance(topics, pa.Array):
            topics = topics.take(pa.array(kept))
    for serializer in serializers:
        name = serializer.column
        if name not in table.column_names:
            raise ConfigError(f"column {name!r}: missing; a {serializer.format} {name} serializer was given")
        if topics is None:
            raise ConfigError("a topic is needed to name the schema's subject: give topic= or a 'topic' column")
        refused: list[tuple[np.ndarray, Exception]] | None = None if refusals is None else []
        encoded = serializer.serialize(table.column(name), topics, refused, budget)
        table = table.set_column(table.column_names.index(name), name, encoded)
        if refusals is not None and refused:
            for rows, error in refused:
                refusals.refuse(rows if kept is None else kept[rows], error, _topic_of(topics, rows))
    if refusals is None or not refusals.mask.any():
        return table
    return table.filter(pa.array(~refusals.mask if kept is None else ~refusals.mask[kept]))


def _without_invalid_topics(topics: str | pa.Array | None, refusals: RowRefusals | None) -> np.ndarray | None:
    """The rows left once those to a topic name Kafka refuses are refused (None: all of
    them); without ``refusals``, such a row raises InvalidTopicException."""
    if topics is None:
        return None
    names = [topics] if isinstance(topics, str) else [t for t in pc.unique(topics).to_pylist() if t is not None]
    for name in names:
        error = topic_name_error(name)
        if error is None:
            continue
        if refusals is None:
            raise error
        n = len(refusals.mask)
        rows = np.arange(n) if isinstance(topics, str) else np.flatnonzero(
            pc.equal(topics, name).to_numpy(zero_copy_only=False))
        refusals.refuse(rows, error, name)
    return None if refusals is None or not refusals.mask.any() else np.flatnonzero(~refusals.mask)


def _topic_of(topics: str | pa.Array | None, rows: np.ndarray) -> str | None:
    """The topic of ``rows`` (all of one topic, as the serializer groups them), if known."""
    if isinstance(topics, str) or topics is None:
        return topics
    return topics.take(pa.array(rows[:1])).to_pylist()[0]
