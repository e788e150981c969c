"""kmsg.py against Kafka's own message definitions: regenerated from the kafka-clients jar
the suite fetches, it must come out byte for byte as checked in, and every version kprod
implements must be one Kafka defines."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spark_sink.protocol import generate, kmsg
from spark_sink.protocol.messages import APIS, VERSIONS, ApiKey


@pytest.fixture(scope="module")
def jar() -> Path:
    """kafka-clients from kprod_broker's cache. Without it (no Java to fetch it) the test
    skips, except in CI, where it must fail rather than pass unexercised."""
    from kprod_broker import KafkaUnavailableError, kafka_clients_jar

    try:
        return kafka_clients_jar()
    except KafkaUnavailableError as exc:
        if os.environ.get("CI"):
            pytest.fail(f"Kafka's jars are not there to check kmsg.py against: {exc}", pytrace=False)
        pytest.skip(f"Kafka's jars are not there: {exc}")


def test_kmsg_is_what_the_generator_makes_of_the_jar(jar):
    generated = generate.render(generate.build(jar), jar.name)
    checked_in = Path(kmsg.__file__).read_text()
    assert generated == checked_in, (
        f"spark_sink/protocol/kmsg.py differs from what {jar.name} defines: regenerate it with `make kmsg`")


def test_every_version_kprod_implements_is_one_kafka_defines(jar):
    definitions = generate.load_definitions(jar)
    for key, (low, high) in VERSIONS.items():
        for kind in ("request", "response"):
            valid = generate.parse_versions(definitions[(int(key), kind)]["validVersions"], key.name)
            assert valid is not None and valid[0] <= low <= high <= valid[1], (key.name, kind, valid)


def test_the_tables_cover_exactly_the_apis_kprod_implements():
    assert set(kmsg.SCHEMAS) == {int(k) for k in ApiKey} == set(APIS)
    for key, api in APIS.items():
        assert api.request.versions == api.response.versions == (api.min_version, api.max_version) == VERSIONS[key]


def test_a_version_outside_kprods_range_is_refused():
    with pytest.raises(ValueError, match="AddPartitionsToTxnRequest v4: kprod speaks v0-v3"):
        from spark_sink.protocol.messages import encode_request_body
        encode_request_body(ApiKey.ADD_PARTITIONS_TO_TXN, 4, kmsg.AddPartitionsToTxnRequest())


@pytest.mark.parametrize(("text", "expected"), [
    ("0+", (0, 32767)), ("3-11", (3, 11)), ("5", (5, 5)), ("none", None)])
def test_version_ranges_as_kafka_writes_them(text, expected):
    assert generate.parse_versions(text, "f") == expected


def test_comments_are_stripped_outside_strings_only():
    text = '// licence\n{ "a": "http://x", // why\n  "b": 1 }\n'
    assert generate.strip_comments(text).split() == ['{', '"a":', '"http://x",', '"b":', '1', '}']


@pytest.mark.parametrize(("name", "snake"), [
    ("ThrottleTimeMs", "throttle_time_ms"), ("ResultsByTopicV3AndBelow", "results_by_topic_v3_and_below"),
    ("TopicId", "topic_id"), ("IsrNodes", "isr_nodes")])
def test_attribute_names(name, snake):
    assert generate.snake(name) == snake
