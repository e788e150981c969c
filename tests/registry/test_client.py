"""kprod's SchemaRegistryClient against a real registry (Apicurio, the ``schema_registry``
fixture), checked with an independent client (confluent-kafka's SchemaRegistryClient):
what one registers the other reads. Faults come from a TCP fault proxy
(tests/faultproxy.py) and an HTTP front (tests/registry/front.py) that adds basic
authentication, TLS and server errors, which Apicurio alone does not do without Keycloak."""

from __future__ import annotations

import json
import logging
import urllib.parse
import uuid

import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema
from confluent_kafka.schema_registry import SchemaRegistryClient as TheirClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kprod_broker import TlsFiles, make_tls_files
from spark_sink.producer import ArrowSerializer
from spark_sink.registry import (
    IncompatibleSchemaError,
    InvalidSchemaError,
    RegisteredSchema,
    RegistryAuthError,
    RegistryErrorCode,
    RegistryUnavailableError,
    SchemaNotFoundError,
    SchemaRegistryClient,
    SchemaRegistryError,
)
from tests.brokers import free_port
from tests.clock import MovedClock
from tests.faultproxy import FaultProxy
from tests.registry.front import Front, server_context


def _subject(prefix: str = "s") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}-value"


def _record(*fields: dict, name: str = "Row") -> str:
    return json.dumps({"type": "record", "name": name, "namespace": "kprod.test", "fields": list(fields)})


V1 = _record({"name": "id", "type": "long"})
V2 = _record({"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""})
RETYPED = _record({"name": "id", "type": "string"})
JSON_SCHEMA = json.dumps({"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]})


def _same(a: str | None, b: str) -> bool:
    """Whether two schemas' texts are the same JSON (confluent-kafka's schema_str may be None)."""
    assert a is not None, "no schema text"
    return json.loads(a) == json.loads(b)


def _address(url: str) -> tuple[str, int]:
    parts = urllib.parse.urlsplit(url)
    return parts.hostname or "", parts.port or 80


def _path(url: str) -> str:
    return urllib.parse.urlsplit(url).path


# -- round trips with an independent client ---------------------------------------------


def test_what_kprod_registers_confluent_reads(schema_registry: str) -> None:
    ours, theirs = SchemaRegistryClient({"url": schema_registry}), TheirClient({"url": schema_registry})
    subject = _subject()
    schema_id = ours.register(subject, V1)
    assert _same(theirs.get_schema(schema_id).schema_str, V1)
    latest = theirs.get_latest_version(subject)
    assert (latest.schema_id, latest.version) == (schema_id, 1)
    assert theirs.lookup_schema(subject, Schema(V1, "AVRO")).schema_id == schema_id


def test_what_confluent_registers_kprod_reads(schema_registry: str) -> None:
    ours, theirs = SchemaRegistryClient({"url": schema_registry}), TheirClient({"url": schema_registry})
    subject = _subject()
    schema_id = theirs.register_schema(subject, Schema(V1, "AVRO"))
    found = ours.lookup(subject, V1)
    assert found is not None and found == RegisteredSchema(schema_id, subject, 1, found.schema_str, "AVRO")
    assert _same(found.schema_str, V1)
    latest = ours.latest(subject)
    assert (latest.id, latest.subject, latest.version, latest.schema_type) == (schema_id, subject, 1, "AVRO")
    by_id = ours.schema_by_id(schema_id)
    assert (by_id.id, by_id.subject, by_id.version) == (schema_id, None, None) and _same(by_id.schema_str, V1)
    # Registering what is there gives its id and no new version.
    assert ours.register(subject, V1) == schema_id
    assert theirs.get_latest_version(subject).version == 1


def test_json_schemas_round_trip_with_their_type(schema_registry: str) -> None:
    ours, theirs = SchemaRegistryClient({"url": schema_registry}), TheirClient({"url": schema_registry})
    subject = _subject("json")
    schema_id = ours.register(subject, JSON_SCHEMA, "JSON")
    read = theirs.get_schema(schema_id)
    assert read.schema_type == "JSON" and _same(read.schema_str, JSON_SCHEMA)
    assert ours.latest(subject).schema_type == "JSON"
    found = ours.lookup(subject, JSON_SCHEMA, "JSON")
    assert found is not None and found.schema_type == "JSON"
    other = _subject("json")
    their_id = theirs.register_schema(other, Schema(JSON_SCHEMA, "JSON"))
    assert SchemaRegistryClient({"url": schema_registry}).schema_by_id(their_id).schema_type == "JSON"


def test_a_compatible_change_is_version_2_and_an_incompatible_one_is_refused(schema_registry: str) -> None:
    """Apicurio's global level is BACKWARD (the fixture sets it, as Confluent's default): a
    new field with a default is accepted, a field's type changed is not."""
    ours, theirs = SchemaRegistryClient({"url": schema_registry}), TheirClient({"url": schema_registry})
    subject = _subject()
    first = ours.register(subject, V1)
    assert ours.compatible(subject, V2) == []
    second = ours.register(subject, V2)
    assert second != first
    assert theirs.get_latest_version(subject).version == 2
    assert [_same(theirs.get_schema(i).schema_str, s) for i, s in ((first, V1), (second, V2))] == [True, True]
    reasons = ours.compatible(subject, RETYPED)
    assert len(reasons) == 1 and "/fields/0/type" in reasons[0]
    with pytest.raises(IncompatibleSchemaError) as refused:
        ours.register(subject, RETYPED)
    error = refused.value
    assert error.subject == subject and error.status == 409
    assert subject in str(error) and schema_registry in str(error)
    assert "STRING not compatible with writer type: LONG at /fields/0/type" in str(error)  # Apicurio's words
    assert not theirs.test_compatibility(subject, Schema(RETYPED, "AVRO"))
    assert theirs.get_latest_version(subject).version == 2


def test_compatibility_levels_by_subject(schema_registry: str) -> None:
    """A field without a default added: not BACKWARD (new readers cannot read old records),
    but FORWARD. (Apicurio takes a subject's NONE as no rule of its own: the global level
    then applies, unlike Confluent's registry.)"""
    ours, theirs = SchemaRegistryClient({"url": schema_registry}), TheirClient({"url": schema_registry})
    subject = _subject()
    ours.register(subject, V1)
    added = _record({"name": "id", "type": "long"}, {"name": "note", "type": "string"})
    assert ours.compatible(subject, added) != []
    ours.set_compatibility("forward", subject)
    assert theirs.get_compatibility(subject) == "FORWARD"
    assert ours.compatible(subject, added) == []
    assert ours.register(subject, added) > 0
    assert theirs.get_compatibility() == "BACKWARD"  # the registry's own level is left alone


def test_what_is_not_there(schema_registry: str) -> None:
    ours = SchemaRegistryClient({"url": schema_registry})
    subject = _subject()
    assert ours.lookup(subject, V1) is None  # no subject
    assert ours.compatible(subject, RETYPED) == []  # nothing to be compatible with
    with pytest.raises(SchemaNotFoundError) as missing:
        ours.latest(subject)
    assert missing.value.error_code == RegistryErrorCode.SUBJECT_NOT_FOUND and subject in str(missing.value)
    ours.register(subject, V1)
    assert ours.lookup(subject, V2) is None  # a subject without that schema
    with pytest.raises(SchemaNotFoundError) as missing:
        ours.schema_by_id(2**31 - 1)
    assert missing.value.error_code == RegistryErrorCode.SCHEMA_NOT_FOUND and "2147483647" in str(missing.value)


def test_an_invalid_schema_is_refused_by_name(schema_registry: str) -> None:
    with pytest.raises(InvalidSchemaError) as refused:
        SchemaRegistryClient({"url": schema_registry}).register(_subject(), '{"type": "record"')
    assert refused.value.status == 422 and "INVALID_SCHEMA" in str(refused.value)


# -- caches -------------------------------------------------------------------------------


def test_ids_and_schemas_are_asked_once_and_the_latest_each_time(schema_registry: str) -> None:
    with Front(schema_registry) as front:
        ours = SchemaRegistryClient({"url": front.url})
        subject = _subject()
        schema_id = ours.register(subject, V1)
        assert ours.register(subject, V1) == schema_id
        assert ours.schema_by_id(schema_id).id == schema_id  # known from the registration
        found = [ours.lookup(subject, V1) for _ in range(2)]  # the second from the cache
        assert [(f.id, f.version) if f else None for f in found] == [(schema_id, 1)] * 2
        ours.latest(subject)
        ours.latest(subject)
        base = _path(schema_registry)
        assert front.requests == [("POST", f"{base}/subjects/{subject}/versions"), ("POST", f"{base}/subjects/{subject}"),
                                  ("GET", f"{base}/subjects/{subject}/versions/latest"),
                                  ("GET", f"{base}/subjects/{subject}/versions/latest")]


def test_the_caches_drop_the_least_recently_used(schema_registry: str) -> None:
    with Front(schema_registry) as front:
        ours = SchemaRegistryClient({"url": front.url, "cache.capacity": "2"})
        subjects = [_subject() for _ in range(3)]
        for subject in subjects:
            ours.register(subject, V1)
        ours.register(subjects[2], V1)  # kept
        ours.register(subjects[0], V1)  # dropped: asked again
        assert [path.rsplit("/", 2)[-2] for _, path in front.requests] == [*subjects, subjects[0]]


# -- retries and deadlines ------------------------------------------------------------------


def test_reset_connections_are_retried_until_one_answers(schema_registry: str) -> None:
    with FaultProxy(*_address(schema_registry)) as proxy:
        ours = SchemaRegistryClient({"url": f"http://127.0.0.1:{proxy.port}{_path(schema_registry)}",
                                     "max.retries": "3", "retries.wait.ms": "10"})
        proxy.reset_next(3)
        schema_id = ours.register(_subject(), V1)
        assert proxy.connections_reset == 3
    assert _same(TheirClient({"url": schema_registry}).get_schema(schema_id).schema_str, V1)


def test_a_refused_registry_that_comes_back_within_the_deadline(schema_registry: str,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """Nothing listens on the port until the client has logged its first refusal; then the
    registry comes up there (through a proxy), and the retry gets the answer."""
    port = free_port()
    started: list[FaultProxy] = []

    class ComeUpOnRefusal(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "connection refused" in record.getMessage() and not started:
                started.append(FaultProxy(*_address(schema_registry), port=port))

    handler = ComeUpOnRefusal()
    logger = logging.getLogger("spark_sink.registry")
    logger.addHandler(handler)
    try:
        with caplog.at_level(logging.INFO, logger="spark_sink.registry"):
            ours = SchemaRegistryClient({"url": f"http://127.0.0.1:{port}{_path(schema_registry)}"})
            subject = _subject()
            schema_id = ours.register(subject, V1)
    finally:
        logger.removeHandler(handler)
        for proxy in started:
            proxy.close()
    assert len(started) == 1
    assert TheirClient({"url": schema_registry}).get_latest_version(subject).schema_id == schema_id
    assert any("connection refused; retrying" in r.getMessage() for r in caplog.records)


def test_a_dead_registry_fails_naming_each_url_and_the_cause() -> None:
    dead = [f"http://127.0.0.1:{free_port()}/apis/ccompat/v7", f"http://localhost:{free_port()}"]
    ours = SchemaRegistryClient({"url": ",".join(dead), "max.retries": "3", "retries.wait.ms": "10",
                                 "timeout.ms": "3000"})
    with pytest.raises(RegistryUnavailableError) as failed:
        ours.register("t-value", V1)
    message = str(failed.value)
    assert all(f"{url}: connection refused" in message for url in dead), message
    assert "after 4 attempt(s) within timeout.ms=3000" in message


def _dead_registry(clock: MovedClock, **settings: int) -> SchemaRegistryClient:
    """A client of a URL nothing listens on, on ``clock``."""
    config = {"url": f"http://127.0.0.1:{free_port()}", **{k.replace("_", "."): str(v) for k, v in settings.items()}}
    return SchemaRegistryClient(config, clock)


def _check_waits(clock: MovedClock, failed: RegistryUnavailableError, wait_ms: int, max_wait_ms: int) -> int:
    """The waits between attempts were the test clock's sleeps, each the doubling backoff
    less its jitter; the number of attempts."""
    attempts = len(clock.slept) + 1
    assert f"after {attempts} attempt(s)" in str(failed)
    for k, slept in enumerate(clock.slept):
        nominal_s = min(max_wait_ms, wait_ms * 2 ** k) / 1000
        assert nominal_s / 2 <= slept <= nominal_s
    return attempts


def test_a_test_clock_moves_the_retry_waits_and_the_deadline() -> None:
    """The client's clock is its transport's: the waits between retries are the clock's
    sleeps (which move it rather than wait), and the deadline is on it: waits of 10 s and
    more, doubling, and a minute's timeout end after two or three attempts."""
    clock = MovedClock()
    ours = _dead_registry(clock, retries_wait_ms=20_000, retries_max_wait_ms=600_000, max_retries=100,
                          timeout_ms=60_000)
    with pytest.raises(RegistryUnavailableError) as failed:
        ours.latest("t-value")
    assert _check_waits(clock, failed.value, 20_000, 600_000) in (2, 3)
    assert sum(clock.slept) < 60
    # An ArrowSerializer's registry client runs on the clock it is given.
    serializer_clock = MovedClock()
    serializer = ArrowSerializer("avro", {"url": f"http://127.0.0.1:{free_port()}", "retries.wait.ms": "30000",
                                          "max.retries": "2", "timeout.ms": "600000"}, clock=serializer_clock)
    with pytest.raises(RegistryUnavailableError) as failed:
        serializer.prepare(pa.struct([pa.field("id", pa.int64(), False)]), "t")
    assert _check_waits(serializer_clock, failed.value, 30_000, 2_000) == 3


@settings(max_examples=40, deadline=None)
@given(wait_ms=st.integers(0, 120_000), max_wait_ms=st.integers(0, 600_000), max_retries=st.integers(0, 8),
       timeout_ms=st.integers(1, 3_600_000))
def test_retry_waits_on_a_test_clock_follow_the_settings(wait_ms: int, max_wait_ms: int, max_retries: int,
                                                         timeout_ms: int) -> None:
    clock = MovedClock()
    ours = _dead_registry(clock, retries_wait_ms=wait_ms, retries_max_wait_ms=max_wait_ms, max_retries=max_retries,
                          timeout_ms=timeout_ms)
    with pytest.raises(RegistryUnavailableError) as failed:
        ours.latest("t-value")
    assert _check_waits(clock, failed.value, wait_ms, max_wait_ms) <= max_retries + 1
    assert sum(clock.slept) * 1000 < timeout_ms  # no wait past the deadline


def test_a_registry_that_never_answers_fails_at_its_deadline(schema_registry: str) -> None:
    with FaultProxy(*_address(schema_registry)) as proxy:
        proxy.stall()
        ours = SchemaRegistryClient({"url": f"http://127.0.0.1:{proxy.port}", "timeout.ms": "1000"})
        with pytest.raises(RegistryUnavailableError) as failed:
            ours.latest("t-value")
        proxy.stall(False)
    assert f"http://127.0.0.1:{proxy.port}: no answer in time" in str(failed.value)
    assert "after 1 attempt(s) within timeout.ms=1000" in str(failed.value)  # no retry past the deadline


def test_the_next_url_answers_when_the_first_is_dead(schema_registry: str) -> None:
    ours = SchemaRegistryClient({"url": f"http://127.0.0.1:{free_port()},{schema_registry}",
                                 "retries.wait.ms": "10"})
    schema_id = ours.register(_subject(), V1)
    assert ours.schema_by_id(schema_id).id == schema_id


def test_server_errors_are_retried_and_refusals_are_not(schema_registry: str) -> None:
    with Front(schema_registry) as front:
        ours = SchemaRegistryClient({"url": front.url, "retries.wait.ms": "10", "max.retries": "3"})
        subject = _subject()
        front.fail_next(3, 503)
        schema_id = ours.register(subject, V1)
        assert len(front.requests) == 4
        assert TheirClient({"url": schema_registry}).get_schema(schema_id) is not None

        front.requests.clear()
        front.fail_next(10, 500)
        with pytest.raises(RegistryUnavailableError) as failed:
            ours.latest(subject)
        assert len(front.requests) == 4  # max.retries
        assert failed.value.status == 500 and "HTTP 500 Internal Server Error: injected" in str(failed.value)

        for status in (400, 404, 409, 422):  # a client's error: asked once
            front.requests.clear()
            front.fail_next(1, status)
            with pytest.raises(SchemaRegistryError) as refused:
                ours.latest(subject)
            assert len(front.requests) == 1 and refused.value.status == status
            assert not isinstance(refused.value, RegistryUnavailableError)
        front.fail_next(0)


# -- basic authentication -------------------------------------------------------------------


def test_basic_auth_from_the_setting_and_from_the_url(schema_registry: str) -> None:
    password = "p@ss:w/rd é"  # characters a URL must escape
    with Front(schema_registry, user_info=("alice", password)) as front:
        subject = _subject()
        by_setting = SchemaRegistryClient({"url": front.url, "basic.auth.user.info": f"alice:{password}"})
        schema_id = by_setting.register(subject, V1)
        escaped = urllib.parse.quote(password, safe="")
        in_url = front.url.replace("://", f"://alice:{escaped}@")
        by_url = SchemaRegistryClient({"url": in_url, "basic.auth.credentials.source": "URL"})
        assert by_url.latest(subject).id == schema_id
        found = SchemaRegistryClient({"url": in_url}).lookup(subject, V1)  # URL: the default
        assert found is not None and found.id == schema_id
        theirs = TheirClient({"url": front.url, "basic.auth.user.info": f"alice:{password}"})
        assert theirs.get_latest_version(subject).schema_id == schema_id


def test_a_wrong_password_is_an_auth_error_at_once(schema_registry: str) -> None:
    with Front(schema_registry, user_info=("alice", "right")) as front:
        ours = SchemaRegistryClient({"url": front.url, "basic.auth.user.info": "alice:wrong-secret"})
        with pytest.raises(RegistryAuthError) as refused:
            ours.register(_subject(), V1)
        assert len(front.requests) == 1  # not retried
        message = str(refused.value)
        assert refused.value.status == 401 and front.url in message and "basic.auth.user.info" in message
        assert "wrong-secret" not in message

        with pytest.raises(RegistryAuthError, match="no credentials are set"):
            SchemaRegistryClient({"url": front.url}).latest("x")


# -- TLS ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_tls_files(tmp_path_factory.mktemp("registry-tls"))


def test_tls_with_the_ca_of_ssl_ca_location(schema_registry: str, tls_files: TlsFiles) -> None:
    with Front(schema_registry, tls=server_context(str(tls_files.broker))) as front:
        assert front.url.startswith("https://")
        ours = SchemaRegistryClient({"url": front.url, "ssl.ca.location": str(tls_files.ca)})
        subject = _subject()
        schema_id = ours.register(subject, V1)
        theirs = TheirClient({"url": front.url, "ssl.ca.location": str(tls_files.ca)})
        assert theirs.get_latest_version(subject).schema_id == schema_id

        with pytest.raises(RegistryAuthError, match="not trusted.*ssl.ca.location"):
            SchemaRegistryClient({"url": front.url}).latest(subject)  # the system's CAs do not know it


def test_client_certificates_and_basic_auth_over_tls(schema_registry: str, tls_files: TlsFiles) -> None:
    context = server_context(str(tls_files.broker), ca=str(tls_files.ca))
    with Front(schema_registry, tls=context, user_info=("alice", "secret")) as front:
        settings = {"url": front.url, "ssl.ca.location": str(tls_files.ca), "basic.auth.user.info": "alice:secret"}
        ours = SchemaRegistryClient({**settings, "ssl.certificate.location": str(tls_files.client_cert),
                                     "ssl.key.location": str(tls_files.client_key)})
        subject = _subject()
        assert ours.lookup(subject, V1) is None
        schema_id = ours.register(subject, V1)
        assert ours.latest(subject).id == schema_id
        with pytest.raises(RegistryAuthError, match="ssl.certificate.location"):
            SchemaRegistryClient(settings).latest(subject)


# -- randomized ----------------------------------------------------------------------------------

# Subject names as topics and record names make them, and any other text (quoted in the
# path: "/", "%", "?", spaces, control characters, any script). Each gets a unique prefix,
# so that no example meets another's subject (nor is "." or "..").
_SUBJECT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=40)
_NAME = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True)
_TYPE = st.sampled_from(["int", "long", "float", "double", "boolean", "string", "bytes"])


@st.composite
def _versions(draw: st.DrawFn) -> list[str]:
    """A record schema and up to two BACKWARD-compatible changes of it: each adds fields
    with defaults. Written compactly or indented, at random."""
    names = draw(st.lists(_NAME, min_size=2, max_size=8, unique=True))
    first = draw(st.integers(1, len(names)))
    fields = []
    for name in names:
        kind = draw(_TYPE)
        fields.append({"name": name, "type": [kind, "null"] if draw(st.booleans()) else kind})
    # Later versions' fields get defaults: null first in a union, as Avro wants of a null default.
    later = [{"name": f["name"], "type": ["null", f["type"][0] if isinstance(f["type"], list) else f["type"]],
              "default": None} for f in fields[first:]]
    cuts = sorted(set(draw(st.lists(st.integers(0, len(later)), max_size=2))) | {len(later)})
    record = draw(_NAME)
    return [json.dumps({"type": "record", "name": record, "fields": fields[:first] + later[:cut]},
                       indent=draw(st.sampled_from([None, 1]))) for cut in cuts]


# Hand-picked: a subject that must be quoted in the path, with a second version that adds a
# field with a default; indented text.
_PICKED_VERSIONS = [_record({"name": "id", "type": "long"}),
                    json.dumps(json.loads(_record({"name": "id", "type": "long"},
                                                  {"name": "n", "type": ["null", "int"], "default": None})), indent=1)]


# A few examples in the suite (each registers up to three versions, through a front of its
# own); make soak tries 100 (the test below).
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subject=_SUBJECT, schemas=_versions())
@example(subject="a/b%2F c?d=é\x01", schemas=_PICKED_VERSIONS)
def test_any_subject_and_schemas_round_trip_and_are_cached(schema_registry: str, subject: str, schemas: list[str]) -> None:
    """Registered by kprod (one version each), read back by confluent-kafka and by kprod;
    each asked of the registry once."""
    _check_round_trip(schema_registry, subject, schemas)


@pytest.mark.soak
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(subject=_SUBJECT, schemas=_versions())
def test_any_subject_and_schemas_round_trip_and_are_cached_many(schema_registry: str, subject: str,
                                                                schemas: list[str]) -> None:
    _check_round_trip(schema_registry, subject, schemas)


def _check_round_trip(schema_registry: str, subject: str, schemas: list[str]) -> None:
    subject = f"{uuid.uuid4().hex[:6]}{subject}"
    with Front(schema_registry) as front:
        ours = SchemaRegistryClient({"url": front.url})
        ids = [ours.register(subject, schema) for schema in schemas]
        asked = len(front.requests)
        assert [ours.register(subject, schema) for schema in schemas] == ids
        assert [ours.schema_by_id(i).id for i in ids] == ids
        assert len(front.requests) == asked == len(schemas)
    theirs = TheirClient({"url": schema_registry})
    for schema_id, schema in zip(ids, schemas):
        assert _same(theirs.get_schema(schema_id).schema_str, schema)
        assert theirs.lookup_schema(subject, Schema(schema, "AVRO")).schema_id == schema_id
    latest = SchemaRegistryClient({"url": schema_registry}).latest(subject)
    assert (latest.subject, latest.id, latest.version) == (subject, ids[-1], len(schemas))
