"""kmsg.py against Kafka's own message definitions: regenerated from the kafka-clients jar
the suite fetches, it must come out byte for byte as checked in, and every version kprod
implements must be one Kafka defines. The request and response headers come from the
same definitions, and so does which fields a version may drop."""

from __future__ import annotations

import os
import typing
from pathlib import Path

import pytest

from spark_sink.protocol import generate, kmsg
from spark_sink.protocol import primitives as p
from spark_sink.protocol.apis import APIS, VERSIONS, ApiKey, encode_request_body, encode_response_body
from spark_sink.protocol.error_codes import UnsupportedVersionError
from spark_sink.protocol.framing import KafkaProtocol, encode_request_header
from spark_sink.protocol.schema import Request, decode


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


def test_kmsg_is_what_the_generator_makes_of_the_jar(jar: Path) -> None:
    generated = generate.render(generate.build(jar), jar.name)
    checked_in = Path(kmsg.__file__).read_text()
    assert generated == checked_in, (
        f"spark_sink/protocol/kmsg.py differs from what {jar.name} defines: regenerate it with `make kmsg`")


def test_every_version_kprod_implements_is_one_kafka_defines(jar: Path) -> None:
    definitions = generate.load_definitions(jar)
    for key, (low, high) in VERSIONS.items():
        for kind in ("request", "response"):
            valid = generate.parse_versions(definitions[(int(key), kind)]["validVersions"], key.name)
            assert valid is not None and valid[0] <= low <= high <= valid[1], (key.name, kind, valid)


def test_the_tables_cover_exactly_the_apis_kprod_implements() -> None:
    assert set(kmsg.SCHEMAS) == {int(k) for k in ApiKey} == set(APIS)
    for key, api in APIS.items():
        versions = VERSIONS[ApiKey(key)]
        assert api.request.versions == api.response.versions == (api.min_version, api.max_version) == versions


def test_each_request_class_names_its_reply_as_the_tables_pair_them() -> None:
    """What types a send by its reply (``Request[Reply]``) is what the codec decodes."""
    for api in APIS.values():
        (base,) = [b for b in vars(api.request.cls)["__orig_bases__"] if typing.get_origin(b) is Request]
        (reply,) = typing.get_args(base)  # a forward reference: the reply class comes after
        assert getattr(kmsg, reply.__forward_arg__) is api.response.cls, api.request.cls


def test_a_version_outside_kprods_range_is_refused() -> None:
    with pytest.raises(ValueError, match="AddPartitionsToTxnRequest v4: kprod speaks v0-v3"):
        encode_request_body(ApiKey.ADD_PARTITIONS_TO_TXN, 4, kmsg.AddPartitionsToTxnRequest())


@pytest.mark.parametrize(("text", "expected"), [
    ("0+", (0, 32767)), ("3-11", (3, 11)), ("5", (5, 5)), ("none", None)])
def test_version_ranges_as_kafka_writes_them(text: str, expected: tuple[int, int] | None) -> None:
    assert generate.parse_versions(text, "f") == expected


def test_comments_are_stripped_outside_strings_only() -> None:
    text = '// licence\n{ "a": "http://x", // why\n  "b": 1 }\n'
    assert generate.strip_comments(text).split() == ['{', '"a":', '"http://x",', '"b":', '1', '}']


@pytest.mark.parametrize(("name", "snake"), [
    ("ThrottleTimeMs", "throttle_time_ms"), ("ResultsByTopicV3AndBelow", "results_by_topic_v3_and_below"),
    ("TopicId", "topic_id"), ("IsrNodes", "isr_nodes")])
def test_attribute_names(name: str, snake: str) -> None:
    assert generate.snake(name) == snake


# -- the headers --------------------------------------------------------------


def test_the_headers_come_from_the_jar_in_the_versions_framing_uses(jar: Path) -> None:
    definitions = generate.load_definitions(jar)
    for name, schema in (("RequestHeader", kmsg.REQUEST_HEADER), ("ResponseHeader", kmsg.RESPONSE_HEADER)):
        data = definitions[(name, "header")]
        assert schema.versions == generate.HEADERS[name]
        assert [generate.snake(f["name"]) for f in data["fields"]] == [f.name for f in schema.fields]


def test_client_id_keeps_its_two_byte_length_in_the_flexible_request_header() -> None:
    """Its own flexibleVersions "none": a broker reads the client id of any request the
    same way, before it knows whether the request's version is flexible."""
    header = encode_request_header(ApiKey.METADATA, 12, 7, "kp")
    assert header == p.INT16.pack(3) + p.INT16.pack(12) + p.INT32.pack(7) + p.INT16.pack(2) + b"kp" + b"\x00"
    assert decode(kmsg.REQUEST_HEADER, 2, header) == kmsg.RequestHeader(3, 12, 7, "kp")
    v1 = p.INT16.pack(3) + p.INT16.pack(8) + p.INT32.pack(7) + b"\xff\xff"  # a null client id, no tags
    assert encode_request_header(ApiKey.METADATA, 8, 7, None) == v1


def test_every_response_header_starts_with_the_correlation_id() -> None:
    """framing reads it before it knows the header's version."""
    first = kmsg.RESPONSE_HEADER.fields[0]
    assert (first.name, first.type) == ("correlation_id", "int32")
    assert (first.min_version, first.max_version) == kmsg.RESPONSE_HEADER.versions


def test_a_flexible_response_header_with_tagged_fields_is_read_past() -> None:
    proto = KafkaProtocol()
    cid, _ = proto.send_request(ApiKey.FIND_COORDINATOR, 3, kmsg.FindCoordinatorRequest(key="g"))
    body = encode_response_body(ApiKey.FIND_COORDINATOR, 3, kmsg.FindCoordinatorResponse(node_id=4, host="h", port=1))
    frame = p.INT32.pack(cid) + b"\x01" + b"\x05" + b"\x02zz" + body  # header v1: one unknown tag (5)
    ((got_cid, _, _, decoded),) = proto.receive_data(p.INT32.pack(len(frame)) + frame)
    assert isinstance(decoded, kmsg.FindCoordinatorResponse)
    assert got_cid == cid and (decoded.node_id, decoded.host, decoded.port) == (4, "h", 1)


# -- fields a version lacks ("ignorable") -------------------------------------


def test_a_value_a_version_cannot_carry_is_refused_naming_message_field_and_version() -> None:
    """As Kafka's generated code: a transaction coordinator looked up with FindCoordinator
    v0, which knows group coordinators only, would silently be a group's."""
    with pytest.raises(UnsupportedVersionError, match=r"FindCoordinatorRequest\.key_type is set \(1, not its default "
                                                      r"0\), but version 0 has no such field \(it is in v1-v3\)"):
        encode_request_body(ApiKey.FIND_COORDINATOR, 0, kmsg.FindCoordinatorRequest(key="tx", key_type=1))
    assert encode_request_body(ApiKey.FIND_COORDINATOR, 0, kmsg.FindCoordinatorRequest(key="g")) == b"\x00\x01g"


def test_the_error_names_the_path_to_a_nested_field() -> None:
    body = kmsg.ProduceResponse([kmsg.TopicProduceResponse("t", [kmsg.PartitionProduceResponse(
        current_leader=kmsg.LeaderIdAndEpoch(1, 2))])])
    with pytest.raises(UnsupportedVersionError,
                       match=r"ProduceResponse\.responses\[\]\.partition_responses\[\]\.current_leader is set .*"
                             r"version 9 has no such field \(it is in v10-v12\)"):
        encode_response_body(ApiKey.PRODUCE, 9, body)
    encode_response_body(ApiKey.PRODUCE, 10, body)


def test_an_ignorable_field_is_left_out_of_a_version_that_lacks_it() -> None:
    body = kmsg.ApiVersionsRequest(client_software_name="kprod", client_software_version="1")
    assert kmsg.API_VERSIONS_REQUEST.field("client_software_name").ignorable
    assert encode_request_body(ApiKey.API_VERSIONS, 0, body) == b""


def test_the_generator_keeps_a_fields_own_flexible_versions_and_whether_it_is_ignorable() -> None:
    struct = generate._struct("X", [
        {"name": "ClientId", "type": "string", "versions": "0+", "nullableVersions": "0+", "flexibleVersions": "none"},
        {"name": "Extra", "type": "int32", "versions": "2+", "ignorable": True},
        {"name": "Kept", "type": "int32", "versions": "1+"}], (0, 3), {}, "X")
    assert generate._fields_source(struct, "") == [
        'F("client_id", "string", 0, 3, default="", nullable=(0, 3), flexible=None),',
        'F("extra", "int32", 2, 3, ignorable=True),',
        'F("kept", "int32", 1, 3),']
    with pytest.raises(generate.DefinitionError, match=r"X\.Ids: field-level flexibleVersions on a \[\]int32 field"):
        generate._struct("X", [{"name": "Ids", "type": "[]int32", "versions": "0+", "flexibleVersions": "none"}],
                         (0, 3), {}, "X")
