"""Subject names: under which subject a key's or a value's schema is registered, by
Confluent's subject name strategies (``key.subject.name.strategy``,
``value.subject.name.strategy``)."""

from __future__ import annotations

from spark_sink.client.errors import ConfigError

STRATEGIES = ("TopicNameStrategy", "RecordNameStrategy", "TopicRecordNameStrategy")
# Java configurations name the strategy by its class.
_JAVA_PACKAGE = "io.confluent.kafka.serializers.subject."


def subject_name(strategy: str, topic: str, record_name: str | None, is_key: bool) -> str:
    """The subject of ``topic``'s keys (``is_key``) or values whose schema's full name is
    ``record_name``: TopicNameStrategy (the default) ``<topic>-key`` / ``<topic>-value``;
    RecordNameStrategy ``<record name>``; TopicRecordNameStrategy ``<topic>-<record name>``.
    The strategy may be given by its Java class name too."""
    key = f"{'key' if is_key else 'value'}.subject.name.strategy"
    name = strategy.strip()
    name = name[len(_JAVA_PACKAGE):] if name.startswith(_JAVA_PACKAGE) else name
    if name not in STRATEGIES:
        raise ConfigError(f"{key}: expected one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if name == "TopicNameStrategy":
        return f"{topic}-{'key' if is_key else 'value'}"
    if not record_name:
        raise ConfigError(f"{key}: {name} names the subject after the schema's record name, and this "
                          "schema has none (it is not an Avro record or a JSON schema with a title)")
    return record_name if name == "RecordNameStrategy" else f"{topic}-{record_name}"
