"""kprod-perf, the benchmark behind the README's figures: every client's records really
reach the topic, each exactly once, intact and on Java's partition for its key, and the
report has a line for each client and ratio."""

from __future__ import annotations

from collections import Counter

import pytest

from spark_sink import perf
from spark_sink.producer.partitioner import partition_for_key
from tests.brokers import consume_all, create_topic, unique_topic

N = 2000
CLIENTS = ("kprod", "confluent-kafka produce", "kafka-python send")


@pytest.mark.parametrize(("mode", "rounds"), [("arrow", 1), ("record", 2)])
def test_every_client_delivers_every_record_it_times(tansu, capsys, mode, rounds):
    topic = create_topic(tansu.bootstrap, unique_topic(f"perf-{mode}"), 3)
    assert perf.main(["--bootstrap-servers", tansu.bootstrap, "--topic", topic, "--num-records", str(N),
                      "--mode", mode, "--compare", "--repeat", str(rounds)]) == 0
    out = capsys.readouterr().out
    kprod = "kprod send_arrow" if mode == "arrow" else "kprod send"
    for line in (kprod, *CLIENTS[1:], f"{kprod} / confluent-kafka produce:", f"{kprod} / kafka-python send:"):
        assert line in out, out
    assert ("per round" in out) == (rounds > 1) and ("best of 2 rounds" in out) == (rounds > 1), out

    table = perf.make_data(N, 100, 10)
    sent = Counter(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))
    messages = consume_all(tansu.bootstrap, topic, rounds * len(CLIENTS) * N, settle=0.5)
    assert Counter((m.key(), m.value()) for m in messages) == Counter(
        {row: n * rounds * len(CLIENTS) for row, n in sent.items()})
    assert all(m.partition() == partition_for_key(m.key(), 3) for m in messages)
