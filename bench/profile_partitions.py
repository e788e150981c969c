"""Where kprod's cost per partition goes, in one process: a Spark task's sends without Spark.

    python bench/profile_partitions.py                       # 512 partitions: CPU per M rows
    python bench/profile_partitions.py --cprofile 30         # and the sending thread's profile
    python bench/profile_partitions.py --py-spy 30           # and py-spy of the Sender thread
    python bench/profile_partitions.py --partitions 8 --rounds 5
    python bench/profile_partitions.py --topics 16 --partitions 64   # a topic column, 16 topics
    python bench/profile_partitions.py --rounds 8 --call-shapes 100000:4:8,200000:2:16  # A B A B
    PYTHONPATH=/tmp/main-tree python bench/profile_partitions.py   # another tree, same script

One producer with the sink's settings (batch.size 1000000, the rest at their defaults)
sends ``--rows`` keyed rows (10-byte keys, 100-byte values) to one topic of
``--partitions`` partitions (with ``--topics T``, to T such topics through a ``topic``
column, row i to topic i % T as bench_partitions.py's frame does) in send_arrow calls
sized as a task's (at most 200,000 rows
and half of buffer.memory, 16 MiB at most: spark/writer.py's SEND_ROWS and send_bytes_for),
settling the futures as a task does, then flushes. The first round writes into the new
topic untimed (a broker's first write to a partition costs it several times what later
ones do: bench/RESULTS.md, issue 55); each later round is timed.

Per round: CPU seconds per million rows of the whole process, of the sending thread (the
task's: it encodes, and does the Sender's work while it sends: Sender.run_in_caller) and
of the Sender thread (from /proc/self/task), and of the broker (its JVM, from /proc; a
local one is started unless --bootstrap-servers is given). The machine is shared: compare
two trees by alternating runs of this script, not against figures of another day.

--cprofile N profiles the sending thread over the timed rounds (cProfile sees only the
thread it is enabled in) and prints the N functions of most own time; --py-spy N samples
the Sender thread with py-spy (its record command, only samples holding the GIL) over the
timed rounds and prints its N functions of most own and of most total samples.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import os
import pstats
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from statistics import median

import pyarrow as pa

from spark_sink import KafkaProducer

SEND_ROWS = 200_000  # spark/writer.py's, which imports PySpark: not imported here
SEND_BYTES = 16 << 20
SEND_CALLS_PER_BUFFER = 2
SINK_SETTINGS = {"batch.size": "1000000"}  # spark/options.py's SINK_PRODUCER_DEFAULTS


def _proc_cpu(path: str) -> float:
    """User plus system CPU seconds of /proc/<pid>[/task/<tid>]/stat."""
    try:
        with open(path) as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _table(rows: int, topics: list[str]) -> pa.Table:
    keys = pa.array([b"%010d" % (i % 100_000) for i in range(rows)], pa.binary())
    values = pa.array([b"%0100d" % i for i in range(rows)], pa.binary())
    columns = {"key": keys, "value": values}
    if len(topics) > 1:
        columns["topic"] = pa.array([topics[i % len(topics)] for i in range(rows)], pa.string())
    return pa.table(columns)


def _calls(table: pa.Table, buffer_memory: int, shape: tuple[int, ...] | None = None) -> list[pa.Table]:
    """The task's send_arrow inputs: SEND_ROWS rows or writer.send_bytes_for's bytes at most
    (``shape``: (rows, calls per buffer.memory, MiB) at most instead)."""
    most_rows, calls_per_buffer, most_mib = shape or (SEND_ROWS, SEND_CALLS_PER_BUFFER, SEND_BYTES >> 20)
    per_row = max(1, table.nbytes // max(1, table.num_rows))
    rows = max(1, min(most_rows, min(most_mib << 20, buffer_memory // calls_per_buffer) // per_row))
    return [table.slice(i, rows) for i in range(0, table.num_rows, rows)]


def _send(producer: KafkaProducer, calls: list[pa.Table], topic: str | None) -> int:
    """What a task does with its tables (writer._TaskWrite): send, settle what is done, flush."""
    pending: collections.deque = collections.deque()
    sent = 0
    for table in calls:
        pending.append(producer.send_arrow(table, topic))
        while pending and pending[0].done():
            sent += pending.popleft().result(120).records
    producer.flush(300)
    while pending:
        sent += pending.popleft().result(120).records
    return sent


class _PySpy:
    """``py-spy record --gil --threads`` of this process while running, in raw (collapsed) form."""

    def __init__(self) -> None:
        exe = os.path.join(os.path.dirname(sys.executable), "py-spy")
        self.out = tempfile.NamedTemporaryFile(prefix="kprod-pyspy-", suffix=".txt", delete=False).name
        self.process = subprocess.Popen(
            [exe if os.path.exists(exe) else "py-spy", "record", "--gil", "--threads", "--nonblocking",
             "--rate", "250", "--format", "raw", "--output", self.out, "--pid", str(os.getpid())],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(1.0)  # attached before the rounds start

    def stop(self) -> dict[str, int]:
        """Collapsed stacks (``thread;frame;frame``) and their sample counts."""
        self.process.send_signal(signal.SIGINT)
        _, err = self.process.communicate(timeout=120)
        stacks: dict[str, int] = {}
        with open(self.out) as f:
            for line in f:
                stack, _, count = line.rstrip("\n").rpartition(" ")
                if stack:
                    stacks[stack] = stacks.get(stack, 0) + int(count)
        os.unlink(self.out)
        if not stacks:
            print(f"py-spy recorded nothing: {err.decode(errors='replace')[-500:]}")
        return stacks


def _print_pyspy(stacks: dict[str, int], native_id: int, top: int) -> None:
    """The Sender thread's samples: functions (line numbers dropped) by own and by total samples."""
    mark = f"({native_id})"
    own: collections.Counter = collections.Counter()
    total: collections.Counter = collections.Counter()
    samples = 0
    for stack, count in stacks.items():
        frames = stack.split(";")
        if not frames or mark not in frames[0]:
            continue
        frames = [re.sub(r":\d+\)$", ")", frame) for frame in frames[1:]]
        samples += count
        if frames:
            own[frames[-1]] += count
        for frame in set(frames):
            total[frame] += count
    print(f"\npy-spy --gil, the Sender thread: {samples} samples holding the GIL")
    for title, counter in (("own", own), ("total", total)):
        print(f"  by {title} samples:")
        for frame, count in counter.most_common(top):
            print(f"    {count:6d} {100 * count / max(1, samples):5.1f}%  {frame}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--partitions", type=int, default=512, help="partitions of each topic (default: %(default)s)")
    ap.add_argument("--topics", type=int, default=1, help="topics, chosen per row by a topic column (default: 1)")
    ap.add_argument("--rows", type=int, default=1_000_000, help="rows per round (default: %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds (default: %(default)s)")
    ap.add_argument("--bootstrap-servers", help="a running broker (default: start a local one)")
    ap.add_argument("--broker-pid", type=int, help="its process, for the broker's CPU")
    ap.add_argument("--producer-prop", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--cprofile", type=int, default=0, metavar="N", help="the sending thread's top N functions")
    ap.add_argument("--py-spy", type=int, default=0, metavar="N", help="the Sender thread's top N functions")
    ap.add_argument("--call-shapes", default="", metavar="ROWS:PER_BUFFER:MIB,...",
                    help="rounds alternate between these call sizes (at most ROWS rows, buffer.memory / "
                         "PER_BUFFER and MIB MiB a call; e.g. 100000:4:8,200000:2:16); default: the writer's")
    args = ap.parse_args(argv)
    if args.topics < 1 or args.partitions < 1:
        ap.error(f"--topics and --partitions must be at least 1, got {args.topics} and {args.partitions}")
    shapes: list[tuple[int, ...] | None] = [None]  # the writer's
    try:
        shapes = [tuple(int(n) for n in s.split(":")) for s in args.call_shapes.split(",") if s] or shapes
    except ValueError:
        shapes = []
    if not shapes or any(s is not None and (len(s) != 3 or min(s) < 1) for s in shapes):
        ap.error(f"--call-shapes: expected ROWS:PER_BUFFER:MIB,... of positive integers, got {args.call_shapes!r}")

    cluster = None
    broker_pid = args.broker_pid
    bootstrap = args.bootstrap_servers
    if bootstrap is None:
        from kprod_broker import start_local_kafka

        cluster = start_local_kafka()
        bootstrap = cluster.bootstrap
        broker_pid = cluster.nodes[0].pid
    settings = {"bootstrap.servers": bootstrap, **SINK_SETTINGS}
    settings.update(p.split("=", 1) for p in args.producer_prop)  # type: ignore[misc]
    prefix = f"profile-{args.partitions}-{uuid.uuid4().hex[:8]}"
    names = [prefix] if args.topics == 1 else [f"{prefix}-{i}" for i in range(args.topics)]
    topic = prefix if args.topics == 1 else None  # None: the table's topic column
    try:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": bootstrap})
        for done in admin.create_topics([NewTopic(t, num_partitions=args.partitions, replication_factor=1)
                                         for t in names]).values():
            done.result(60)
        del admin  # its thread would go on calling a broker stopped at the end
        table = _table(args.rows, names)
        with KafkaProducer(settings) as producer:
            plans = [_calls(table, producer.config.buffer_memory, shape) for shape in shapes]
            calls = plans[0]
            for name in names:
                while len(producer.partitions_for(name)) != args.partitions:
                    time.sleep(0.1)
            _send(producer, calls, topic)  # the first write into new partitions: untimed
            sender = next(t for t in threading.enumerate() if t.name.startswith("kprod-sender"))
            sender_stat = f"/proc/self/task/{sender.native_id}/stat"
            profile = cProfile.Profile() if args.cprofile else None
            spy = _PySpy() if args.py_spy else None
            columns = ("process", "sending thread", "Sender thread", "broker")
            shape = f"{args.topics} topics x {args.partitions}" if args.topics > 1 else str(args.partitions)
            print(f"{shape} partitions, {args.rows:,} rows a round in "
                  f"{' / '.join(str(len(p)) for p in plans)} send_arrow calls; "
                  f"CPU s per M rows ({', '.join(columns)}), rows/s")
            figures: list[tuple[float, ...]] = []
            for i in range(args.rounds):
                calls = plans[i % len(plans)]
                before = (time.process_time(), time.thread_time(), _proc_cpu(sender_stat),
                          _proc_cpu(f"/proc/{broker_pid}/stat") if broker_pid else 0.0)
                totals = producer.metric_totals()
                started = time.perf_counter()
                if profile is not None:
                    profile.enable()
                sent = _send(producer, calls, topic)
                if profile is not None:
                    profile.disable()
                elapsed = time.perf_counter() - started
                after = (time.process_time(), time.thread_time(), _proc_cpu(sender_stat),
                         _proc_cpu(f"/proc/{broker_pid}/stat") if broker_pid else 0.0)
                assert sent == args.rows, f"{sent} rows acknowledged of {args.rows}"
                per_m = tuple((a - b) * 1e6 / sent for a, b in zip(after, before))
                figures.append(per_m + (sent / elapsed,))
                done = producer.metric_totals().since(totals)
                # batches from the metrics' average batch size (its last 30 s), roughly
                batches = done.bytes_sent / max(1.0, producer.metrics().get("batch-size-avg", 0.0) or 1.0)
                print(f"  round {i + 1}: " + "  ".join(f"{v:.3f}" for v in per_m) + f"  {sent / elapsed:,.0f}"
                      f"  ({done.requests} Produce requests, ~{batches:,.0f} record batches, "
                      f"{len(calls)} calls)")
            for k, plan in enumerate(plans):
                mine = figures[k::len(plans)]
                if mine:
                    print(f"  median ({len(plan)} calls):  " + "  ".join(
                        f"{median(col):.3f}" for col in list(zip(*mine))[:4]) + f"  {median(f[4] for f in mine):,.0f}")
            stacks = spy.stop() if spy is not None else None
            sender_id = sender.native_id
        if profile is not None:
            print(f"\ncProfile, the sending thread over {args.rounds} rounds, by own time:")
            pstats.Stats(profile).sort_stats("tottime").print_stats(args.cprofile)
        if stacks is not None:
            _print_pyspy(stacks, sender_id, args.py_spy)
    finally:
        if cluster is not None:
            cluster.stop()
        else:  # a broker that outlives the run: its partitions' files would pile up run after run
            _delete_topics(bootstrap, names)
    return 0


def _delete_topics(bootstrap: str, topics: list[str]) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})  # alive until the answers came
    for topic, done in admin.delete_topics(topics).items():
        try:
            done.result(60)
        except Exception as exc:  # the run's own error, if any, matters more
            print(f"topic {topic} not deleted: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
