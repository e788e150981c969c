"""subject_name: Confluent's three subject name strategies."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_sink.client.errors import ConfigError
from spark_sink.registry import subject_name

_TOPIC = st.from_regex(r"[A-Za-z0-9._-]{1,249}", fullmatch=True)  # Kafka's legal topic names
_RECORD = st.from_regex(r"([A-Za-z_][A-Za-z0-9_]*\.){0,3}[A-Za-z_][A-Za-z0-9_]*", fullmatch=True)


@given(topic=_TOPIC, record=st.none() | _RECORD, is_key=st.booleans())
def test_topic_name_strategy_is_the_topic_and_key_or_value(topic: str, record: str | None, is_key: bool) -> None:
    expected = f"{topic}-{'key' if is_key else 'value'}"
    assert subject_name("TopicNameStrategy", topic, record, is_key) == expected
    assert subject_name("io.confluent.kafka.serializers.subject.TopicNameStrategy", topic, record, is_key) == expected


@given(topic=_TOPIC, record=_RECORD, is_key=st.booleans())
def test_record_strategies_name_the_record(topic: str, record: str, is_key: bool) -> None:
    assert subject_name("RecordNameStrategy", topic, record, is_key) == record
    assert subject_name("TopicRecordNameStrategy", topic, record, is_key) == f"{topic}-{record}"


@pytest.mark.parametrize("is_key", [False, True])
def test_a_record_strategy_without_a_record_name_names_the_setting(is_key: bool) -> None:
    key = "key" if is_key else "value"
    with pytest.raises(ConfigError, match=rf"{key}\.subject\.name\.strategy: RecordNameStrategy .* record name"):
        subject_name("RecordNameStrategy", "t", None, is_key)
    with pytest.raises(ConfigError, match=rf"{key}\.subject\.name\.strategy: expected one of TopicNameStrategy"):
        subject_name("TopicStrategy", "t", "r", is_key)
