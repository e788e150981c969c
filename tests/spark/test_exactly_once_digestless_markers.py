"""A replay under kprod.replayMatch=rows of a microbatch whose committed markers carry no
rows digest: written by a run under kprod.replayMatch=tasks, or by kprod before markers
carried digests (an upgrade after a driver crash). Written by the skeptical review of
branch ``break``.

README, Guarantees: "A replay split differently (another task count, or as many tasks
with rows dealt otherwise) still skips a microbatch committed whole, but one committed in
part then fails the query with PartlyCommittedError ... rather than risk writing rows
twice or losing some"; kprod.replayMatch=rows (the default) finds the committed tasks
"by task number and rows digest".

A marker without a digest was matched by the task count alone (exactly_once.py), which
the README did not say: the replay, under the default rows, dealt otherwise, skipped the
committed task's number although its rows were elsewhere. Fixed: a marker without a
digest matches no task that has one (the refusal names kprod.replayMatch=tasks).
"""

from __future__ import annotations

import dataclasses

from kprod_broker import KafkaCluster
from spark_sink.spark import exactly_once
from spark_sink.spark.options import ExactlyOnce
from tests.brokers import create_topic, unique_topic
from tests.spark.test_exactly_once_replay_split import REPLAYS, RUN1, _replay
from tests.spark.test_exactly_once_shapes import _prepared_tasks, assert_visible_once, driver_dies_committing


def test_a_replay_under_rows_of_markers_without_a_digest_writes_no_row_twice(kafka: KafkaCluster) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-nodigest"), partitions=2)
    query = unique_topic("query")
    eo = ExactlyOnce(None, topic)

    # Run 1, under kprod.replayMatch=tasks (or an older kprod): its tasks report no digest.
    run1 = [dataclasses.replace(m, rows_digest=None)
            for m in _prepared_tasks(kafka.bootstrap, eo.prefix_for(query), topic, RUN1, query)]
    with driver_dies_committing(1):
        exactly_once.commit({"bootstrap.servers": kafka.bootstrap}, eo, run1, 0)
    refused = _replay(kafka, topic, eo, query, REPLAYS["interleaved"]) is not None
    assert_visible_once(kafka, topic, RUN1[1] if refused else RUN1[0] + RUN1[1])
