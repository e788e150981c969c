"""A streaming query idle longer than Kafka keeps its markers (a file source that gets a
drop a month, a topic quiet over a holiday), found by the skeptical review of branch
``break``: Kafka dropped the directory's and the markers' offsets 7 days after the last
microbatch's commit, and the query's next microbatch, no replay, failed with
MarkersMissingError and stopped the query.

The directory is now committed with a retention of its own (a year), so the next
microbatch is known for a new one; a replay whose markers are all gone is still refused.
The first tests drop the marker groups as offsets.retention.minutes does (deleting them),
then the broker expires a directory committed with a short retention of its own; the
last (make soak) lets a broker with offsets.retention.minutes=1 expire the markers (a
minute's wait) and keep the directory.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable

import pytest

from kprod_broker import KafkaCluster
from spark_sink.admin import AdminClient
from spark_sink.client.clock import SYSTEM_TIME, Time
from spark_sink.producer import PreparedTransaction
from spark_sink.spark import exactly_once, exactly_once_names
from spark_sink.spark.exactly_once import MarkersMissingError
from spark_sink.spark.options import ExactlyOnce
from tests.brokers import create_topic, start_kafka, unique_topic
from tests.clock import days_later
from tests.spark.test_exactly_once_shapes import _Crash
from tests.spark.test_exactly_once_time import _committed_values, _prepare


def _commit(bootstrap: str, eo: ExactlyOnce, topic: str, batch: int, *, crash: bool = False,
            clock: Time = SYSTEM_TIME) -> None:
    """Microbatch ``batch`` of a one-task query: its row ``<batch>`` committed (or, with
    ``crash``, its driver dying after the directory's write, before any EndTxn), on the
    driver's ``clock``."""
    tid = exactly_once_names.transactional_id(eo.prefix_for(None), 0)
    producer, message = _prepare(bootstrap, tid, topic, [b"%d" % batch])
    producer.close()
    config = {"bootstrap.servers": bootstrap}
    if not crash:
        exactly_once.commit(config, eo, [message], batch, clock)
        return
    real_end = AdminClient.end_transactions

    def die(self: AdminClient, transactions: Iterable[PreparedTransaction], commit: bool,
            timeout_ms: float | None = None) -> None:
        raise _Crash()

    AdminClient.end_transactions = die  # type: ignore[method-assign]  # the driver dies at its EndTxn
    try:
        with pytest.raises(_Crash):
            exactly_once.commit(config, eo, [message], batch)
    finally:
        AdminClient.end_transactions = real_end  # type: ignore[method-assign]
        exactly_once._fenced.clear()  # a new driver process


def _drop_markers(bootstrap: str, eo: ExactlyOnce) -> None:
    """What offsets.retention.minutes does to the marker groups of an idle query."""
    from confluent_kafka.admin import AdminClient as ConfluentAdmin

    admin = ConfluentAdmin({"bootstrap.servers": bootstrap})
    for future in admin.delete_consumer_groups([exactly_once_names.transactional_id(eo.prefix_for(None), 0)]).values():
        future.result(30)


def test_a_query_idle_longer_than_the_markers_retention_goes_on(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-idle"), partitions=1)
    eo = ExactlyOnce(unique_topic("idle"), topic)
    for batch in (0, 1):
        _commit(kafka.bootstrap, eo, topic, batch)
    _drop_markers(kafka.bootstrap, eo)
    _commit(kafka.bootstrap, eo, topic, 2)
    assert collections.Counter(_committed_values(kafka.bootstrap, topic, 3)) == collections.Counter(["0", "1", "2"])


def test_a_replay_whose_markers_may_have_expired_is_refused(kafka: KafkaCluster) -> None:
    """Microbatch 1's driver died after recording in the directory that its commit started;
    the query is restarted 8 days later, after the markers expired: whether microbatch 1
    was committed in part cannot be known, so it is refused, naming the way on."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-idle"), partitions=1)
    eo = ExactlyOnce(unique_topic("idle"), topic)
    _commit(kafka.bootstrap, eo, topic, 0)
    _commit(kafka.bootstrap, eo, topic, 1, crash=True)
    _drop_markers(kafka.bootstrap, eo)
    with pytest.raises(MarkersMissingError, match="kprod.missingMarkers=ignore"):
        _commit(kafka.bootstrap, eo, topic, 1, clock=days_later(8))
    ignoring = ExactlyOnce(eo.prefix_for(None), topic, missing_markers="ignore")
    _commit(kafka.bootstrap, ignoring, topic, 1)
    assert sorted(_committed_values(kafka.bootstrap, topic, 2)) == ["0", "1"]


def test_a_replay_within_the_markers_retention_finds_nothing_committed_and_commits(kafka: KafkaCluster) -> None:
    """The same replay a day later: the markers cannot have expired, none is there, so
    nothing of microbatch 1 was committed, and the replay commits it."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-idle"), partitions=1)
    eo = ExactlyOnce(unique_topic("idle"), topic)
    _commit(kafka.bootstrap, eo, topic, 0)
    _commit(kafka.bootstrap, eo, topic, 1, crash=True)
    _commit(kafka.bootstrap, eo, topic, 1)
    assert sorted(_committed_values(kafka.bootstrap, topic, 2)) == ["0", "1"]


def test_the_directory_is_kept_for_its_own_retention_not_the_brokers(kafka: KafkaCluster,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The suite's form of the next test (a minute's wait, in make soak): the directory's
    commit gives a retention of its own, which the broker keeps in place of
    offsets.retention.minutes. Made 2 s, it ends the directory within seconds on the
    suite's broker, which keeps offsets 7 days (and looks for expired ones every 500 ms:
    tests/conftest.py), while the markers, committed without one, stay. What expired
    markers then mean for a query is tested above, with the groups deleted."""
    topic = create_topic(kafka.bootstrap, unique_topic("eos-idle"), partitions=1)
    eo = ExactlyOnce(unique_topic("idle"), topic)
    monkeypatch.setattr(exactly_once, "DIRECTORY_RETENTION_MS", 2000)
    _commit(kafka.bootstrap, eo, topic, 0)
    prefix = eo.prefix_for(None)
    directory, markers = exactly_once_names.directory_group(prefix), exactly_once_names.transactional_id(prefix, 0)
    partition = (eo.marker_topic, exactly_once_names.MARKER_PARTITION)
    with AdminClient({"bootstrap.servers": kafka.bootstrap}) as admin:
        def committed(group: str) -> int:
            return admin.committed_offsets({group: [partition]})[group].get(partition, (-1,))[0]

        assert committed(directory) == 0 and committed(markers) >= 0
        deadline = time.monotonic() + 30
        while committed(directory) >= 0:
            assert time.monotonic() < deadline, "the directory outlived the retention its commit gave"
            time.sleep(0.2)
        assert committed(markers) >= 0, "the markers expired with the directory"


@pytest.mark.soak
def test_the_broker_keeps_the_directory_past_offsets_retention() -> None:
    """On a broker with offsets.retention.minutes=1, the marker groups expire a minute after
    their commit; the directory, committed with a retention of its own, does not: the idle
    query goes on, and the replay is refused. (About 80 s, most of it the minute: in make
    soak; the test above is its quick form in the suite.)"""
    cluster = start_kafka(config={"offsets.retention.minutes": "1", "offsets.retention.check.interval.ms": "500"})
    try:
        bootstrap = cluster.bootstrap
        idle = ExactlyOnce(unique_topic("idle"), create_topic(bootstrap, unique_topic("eos-idle"), partitions=1))
        crashed = ExactlyOnce(unique_topic("idle"), create_topic(bootstrap, unique_topic("eos-idle"), partitions=1))
        for eo in (idle, crashed):
            _commit(bootstrap, eo, eo.marker_topic, 0)
        _commit(bootstrap, crashed, crashed.marker_topic, 1, crash=True)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        marker = (idle.marker_topic, exactly_once_names.MARKER_PARTITION)
        groups = {exactly_once_names.transactional_id(eo.prefix_for(None), 0): eo for eo in (idle, crashed)}
        deadline = time.monotonic() + 180
        while any(admin.committed_offsets({g: [(eo.marker_topic, 0)]})[g].get((eo.marker_topic, 0), (-1,))[0] >= 0
                  for g, eo in groups.items()):
            assert time.monotonic() < deadline, "the marker groups never expired"
            time.sleep(1)
        directory = exactly_once_names.directory_group(idle.prefix_for(None))
        assert admin.committed_offsets({directory: [marker]})[directory][marker][0] == 0, "the directory expired"
        admin.close()
        _commit(bootstrap, idle, idle.marker_topic, 1)
        assert sorted(_committed_values(bootstrap, idle.marker_topic, 2)) == ["0", "1"]
        with pytest.raises(MarkersMissingError):
            _commit(bootstrap, crashed, crashed.marker_topic, 1)
    finally:
        cluster.stop()
