"""A replay whose markers Kafka dropped, of a query whose earlier microbatches wrote no
marker (written by the skeptical review of branch ``break``, against main's 51b9c28,
which keeps the directory a year while the markers keep offsets.retention.minutes, and
refuses a replay that finds no marker only when the directory names an earlier
microbatch that wrote markers).

README, Guarantees, Time limits: "a query restarted later than that finds them gone
and fails with MarkersMissingError rather than risk writing a microbatch it replays
twice ... The one exception is microbatch 0".

A query that writes few rows (an alerting query: most microbatches filter every row
out) ran microbatch 0 with every task empty: no transaction, no marker. Its driver dies
in the middle of microbatch 1's commit, after committing task 0; it is restarted after
Kafka dropped the markers (7 days by default, a day on some clusters), the directory
still there. The replay of microbatch 1 finds no marker, and the directory knows no
earlier microbatch that wrote one: it takes the microbatch for one never committed and
wrote task 0's rows a second time. Fixed: the directory records when the microbatch's
commit started, and a replay later than offsets.retention.minutes after it is refused.
"""

from __future__ import annotations

import collections

from confluent_kafka.admin import AdminClient as ConfluentAdmin

from kprod_broker import KafkaCluster
from spark_sink.spark import exactly_once, exactly_once_abort, exactly_once_names
from spark_sink.spark.exactly_once import MarkersMissingError
from spark_sink.spark.options import ExactlyOnce
from tests.brokers import create_topic, unique_topic
from tests.clock import days_later
from tests.spark.readback import assert_nothing_left_open
from tests.spark.test_exactly_once_shapes import _prepared_tasks, driver_dies_committing


def test_a_replay_whose_markers_expired_after_microbatches_without_rows_writes_no_row_twice(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-expired-empty"), partitions=2)
    config = {"bootstrap.servers": kafka.bootstrap}
    query = unique_topic("query")
    eo = ExactlyOnce(None, topic)
    prefix = eo.prefix_for(query)
    # Microbatch 0: both tasks filtered every row out.
    exactly_once.commit(config, eo, _prepared_tasks(kafka.bootstrap, prefix, topic, {0: [], 1: []}, query), 0)
    rows = {0: [b"a%d" % i for i in range(5)], 1: [b"b%d" % i for i in range(5)]}
    with driver_dies_committing(0):
        exactly_once.commit(config, eo, _prepared_tasks(kafka.bootstrap, prefix, topic, rows, query), 1)
    # Days later: offsets.retention.minutes dropped the markers (the directory is kept).
    admin = ConfluentAdmin({"bootstrap.servers": kafka.bootstrap})  # kept: its futures need it
    groups = [exactly_once_names.transactional_id(prefix, p) for p in rows]
    for future in admin.delete_consumer_groups(groups).values():
        future.result(30)
    replay = _prepared_tasks(kafka.bootstrap, prefix, topic, rows, query)
    try:
        exactly_once.commit(config, eo, replay, 1, days_later(8))
        shown = rows[0] + rows[1]
    except MarkersMissingError:
        exactly_once_abort.abort(config, eo, replay)
        shown = rows[0]
    got = collections.Counter(assert_nothing_left_open(kafka.bootstrap, topic, 2))
    twice = sorted(k for k, n in got.items() if n > 1)
    assert not twice, f"visible twice: {twice}"
    assert got == collections.Counter(v.decode() for v in shown)
