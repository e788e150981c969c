"""The delivery report of a microbatch replayed after a driver crash (written by the
skeptical review of branch ``break``).

README, Options: "kprod.deliveryReport.path: a file on the driver; each committed
microbatch (or batch write) appends one JSON line: batchId, records, bytes, per
topic-partition offset ranges"; task_reports.append_report: "a report line means the
batch was committed".

Run 1 of microbatch 0 dies after committing task 0's transaction, before its report
line. Run 2 (a new driver) replays it: task 0's new transaction is aborted (its rows are
already in Kafka, from run 1), task 1's committed. Its report line is the one line of
microbatch 0, yet its offset ranges are those run 2's tasks wrote, task 0's included:
records that were aborted, which no read_committed consumer will ever see, while the
offsets where run 1 committed task 0's rows are in no line. Fixed: the line leaves the
skipped tasks out and names them (``alreadyCommittedTasks``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, RowsDigest
from spark_sink.spark import exactly_once_names, writer
from spark_sink.spark.task_reports import KProdCommitMessage
from tests.brokers import consume_all, create_topic, unique_topic
from tests.spark.test_exactly_once_shapes import driver_dies_committing

if TYPE_CHECKING:
    from pyspark.sql.datasource import WriterCommitMessage
    from pyspark.sql.types import StructType


def _task(bootstrap: str, prefix: str, topic: str, partition: int, values: list[bytes], query: str
          ) -> KProdCommitMessage:
    """What write_task returns for ``values``: counts, offset ranges, transaction, digest."""
    table = pa.table({"key": pa.array(values, pa.binary()), "value": pa.array(values, pa.binary())})
    digest = RowsDigest()
    digest.add(table)
    with KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 0,
                        "transactional.id": exactly_once_names.transactional_id(prefix, partition)}) as p:
        exactly_once_names.fence_and_begin(p)
        future = p.send_arrow(table, topic)
        p.flush(30)
        result = future.result(30)
        txn = p.prepare_transaction()
    return KProdCommitMessage(partition_id=partition, attempt=0, records=result.records, bytes=result.bytes,
                              partitions=result.partitions, seconds=0.1, transaction=txn, query_id=query,
                              rows_digest=str(digest))


def test_the_report_of_a_replayed_microbatch_names_only_committed_records(kafka: KafkaCluster, tmp_path: Path) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("eos-report"), partitions=1)
    report = tmp_path / "report.jsonl"
    prefix = unique_topic("rep")
    options, _ = writer.plan_write({"kafka.bootstrap.servers": kafka.bootstrap, "topic": topic,
                                    "kprod.deliveryGuarantee": "exactly-once",
                                    "kprod.transactionalIdPrefix": prefix,
                                    "kprod.deliveryReport.path": str(report)},
                                   _schema(), streaming=True, check=False)
    query = unique_topic("query")
    rows = {0: [b"a%d" % i for i in range(5)], 1: [b"b%d" % i for i in range(5)]}

    def run() -> list[WriterCommitMessage | None]:
        return [_task(kafka.bootstrap, prefix, topic, p, v, query) for p, v in rows.items()]

    with driver_dies_committing(0):
        writer._commit(options, run(), 0)
    writer._commit(options, run(), 0)

    lines = [json.loads(line) for line in report.read_text().splitlines()]
    assert [line["batchId"] for line in lines] == [0]
    assert lines[0]["alreadyCommittedTasks"] == [0]
    visible = {m.offset() for m in consume_all(kafka.bootstrap, topic, 10, settle=1.0,
                                               overrides={"isolation.level": "read_committed"})}
    assert len(visible) == 10  # every row once
    reported = {o for r in lines[0]["partitions"] for o in range(r["firstOffset"], r["lastOffset"] + 1)}
    assert reported <= visible, (f"the report names offsets no read_committed consumer sees: "
                                 f"{sorted(reported - visible)}; committed rows at {sorted(visible - reported)} "
                                 f"are in no report line")


def _schema() -> StructType:
    from pyspark.sql.types import BinaryType, StructField, StructType

    return StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
