"""Kafka errors by name: one class per code, from one table that matches Kafka's own."""

from __future__ import annotations

import pickle
import shutil
import subprocess
from pathlib import Path

import pytest

import spark_sink.protocol.error_codes as errors
from spark_sink.protocol.error_codes import (
    ERRORS_BY_CODE,
    DuplicateSequenceNumberError,
    KafkaError,
    KProdError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceNumberError,
    UnknownErrorCode,
    error_for_code,
)


def test_every_class_is_exported_under_the_name_it_has() -> None:
    for code, cls in ERRORS_BY_CODE.items():
        assert cls.code == code
        assert getattr(errors, cls.__name__) is cls, f"row for {cls.name} is bound to another name"
        assert cls.__name__ in errors.__all__
        assert issubclass(cls, KafkaError) and issubclass(cls, KProdError)


def test_class_names_follow_the_protocol_names() -> None:
    assert NotLeaderOrFollowerError.name == "NOT_LEADER_OR_FOLLOWER"
    assert errors.InvalidTopicException.name == "INVALID_TOPIC_EXCEPTION"  # no doubled suffix
    assert errors.KafkaStorageError.name == "KAFKA_STORAGE_ERROR"
    assert (NotLeaderOrFollowerError.retriable, NotLeaderOrFollowerError.invalid_metadata) == (True, True)
    assert not OutOfOrderSequenceNumberError.retriable


def test_error_for_code_gives_the_class_and_keeps_the_message() -> None:
    assert error_for_code(0) is None
    error = error_for_code(DuplicateSequenceNumberError.code, "t-0")
    assert type(error) is DuplicateSequenceNumberError
    assert str(error) == "[DUPLICATE_SEQUENCE_NUMBER (46)] t-0"
    assert str(error_for_code(NotLeaderOrFollowerError.code)) == "[NOT_LEADER_OR_FOLLOWER (6)]"


def test_an_unknown_code_is_kept_and_not_retriable() -> None:
    error = error_for_code(32000, "from a newer broker")
    assert isinstance(error, UnknownErrorCode)
    assert (error.code, error.name, error.retriable) == (32000, "UNKNOWN_CODE_32000", False)
    assert type(error_for_code(32000)) is type(error)  # one class per unknown code
    assert type(error)("again").code == 32000  # re-raised with another message, as the producer does


def test_errors_survive_pickling() -> None:
    """Spark ships exceptions between processes."""
    for error in (OutOfOrderSequenceNumberError("t-1: seq 5"), error_for_code(32001, "x")):
        assert error is not None
        copy = pickle.loads(pickle.dumps(error))
        assert type(copy) is type(error) and str(copy) == str(error) and copy.code == error.code


_DUMP_ERRORS = """
import org.apache.kafka.common.errors.*;
import org.apache.kafka.common.protocol.Errors;

public class DumpErrors {
    public static void main(String[] args) {
        for (Errors e : Errors.values()) {
            ApiException x = e.exception();
            System.out.println(e.code() + " " + e.name() + " " + (x instanceof RetriableException)
                + " " + (x instanceof InvalidMetadataException));
        }
    }
}
"""


@pytest.mark.jvm  # runs java: make unit, which promises no JVM, leaves it out
def test_the_table_is_kafkas_own(tmp_path: Path) -> None:
    """Codes, names and flags are those of the kafka-clients jar the test broker runs (Java's
    exception classes decide the flags: RetriableException, InvalidMetadataException)."""
    from kprod_broker import cache_dir, kafka_classpath

    java = shutil.which("java")
    if java is None or not (cache_dir()).exists():
        pytest.skip("needs Java and the Kafka jars (fetched by the broker fixtures)")
    source = tmp_path / "DumpErrors.java"
    source.write_text(_DUMP_ERRORS)
    # Java's single-file launcher compiles and runs it (Java 11 and later).
    out = subprocess.run([java, "-cp", kafka_classpath(), str(source)], capture_output=True, text=True, timeout=120,
                         check=True).stdout
    kafka = {}
    for line in out.splitlines():
        code, name, retriable, invalid_metadata = line.split()
        if int(code):
            kafka[int(code)] = (name, retriable == "true", invalid_metadata == "true")
    ours = {code: (cls.name, cls.retriable, cls.invalid_metadata) for code, cls in ERRORS_BY_CODE.items()}
    assert ours == kafka
