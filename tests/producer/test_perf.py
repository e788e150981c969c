"""kprod-perf, the benchmark behind the README's figures.

kprod's records are read back: each exactly once per round, intact, on Java's partition
for its key. With --compare the peers' deliveries are checked by the script itself (a
delivery callback or errback per record, and no figure for a run with a failure); they
are not read back here, which is not kprod's to test.

kprod-perf is also a command people keep: progress on a terminal only, peers imported only
with --compare, one line and exit status 2 for a mistake, producers closed on every path.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from collections import Counter

import pytest

from kprod_broker import KAFKA_VERSION, KafkaCluster
from spark_sink import perf
from spark_sink.producer.partitioner import partition_for_key
from tests.brokers import consume_all, create_topic, free_port, subprocess_env, unique_topic

N = 2000


def test_kprod_delivers_every_record_it_times(kafka: KafkaCluster, capsys: pytest.CaptureFixture[str]) -> None:
    topic = create_topic(kafka.bootstrap, unique_topic("perf-arrow"), 3)
    assert perf.main(["--bootstrap-servers", kafka.bootstrap, "--topic", topic, "--num-records", str(N),
                      "--mode", "arrow", "--repeat", "2"]) == 0
    out, err = capsys.readouterr()
    assert "kprod send_arrow " in out and "best of 2 rounds" in out, out
    # Not a terminal: no progress line rewritten in place, one plain line per run.
    assert "\r" not in err and err.count(f"kprod arrow: {N:,} records sent in ") == 2, err

    table = perf.make_data(N, 100, 10)
    sent = Counter(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))
    messages = consume_all(kafka.bootstrap, topic, 2 * N, settle=0.5)
    assert Counter((m.key(), m.value()) for m in messages) == Counter({row: 2 * n for row, n in sent.items()})
    assert all(m.partition() == partition_for_key(m.key(), 3) for m in messages)


def test_compare_reports_every_client(kafka: KafkaCluster, capsys: pytest.CaptureFixture[str]) -> None:
    """One round (each round starts a Java producer's JVM): the rounds' figures are
    test_report_gives_each_clients_best_round_and_ratios_per_round's, from made-up results."""
    topic = create_topic(kafka.bootstrap, unique_topic("perf-record"), 3)
    assert perf.main(["--bootstrap-servers", kafka.bootstrap, "--topic", topic, "--num-records", str(N),
                      "--mode", "record", "--compare"]) == 0
    out = capsys.readouterr().out
    java = f"Java producer {KAFKA_VERSION}"
    for client in ("kprod send ", "confluent-kafka produce ", "kafka-python send ", java + " "):
        assert client in out, out
    for peer in ("confluent-kafka produce", "kafka-python send", java):
        assert f"kprod send / {peer}: " in out, out
    # Client CPU per record, for the clients that run in this process (not Java's).
    for peer in ("confluent-kafka produce", "kafka-python send"):
        assert f"CPU per record, kprod send / {peer}: " in out, out
    assert f"CPU per record, kprod send / {java}" not in out, out
    # Java's CPU is a figure (its whole JVM's, said so), never nan.
    assert "nan" not in out.lower(), out
    (java_line,) = [line for line in out.splitlines() if line.startswith(java + " ")]
    assert java_line.endswith("*") and float(java_line.split()[-1].rstrip("*")) > 0, java_line
    assert "* its whole JVM's CPU over the run" in out, out
    # Every client's records are on the broker: kprod's and the Python clients', and the
    # Java producer's, counted by the script itself before it printed a figure.
    assert perf._high_watermarks(kafka.bootstrap, topic) == 4 * N


def _result(client: str, seconds: float, cpu_seconds: float | None, whole_process: bool = False) -> perf.Result:
    return perf.Result(client, 1000, seconds, 100_000, [1.0, 3.0], cpu_seconds=cpu_seconds,
                       whole_process=whole_process)


def test_report_gives_each_clients_best_round_and_ratios_per_round() -> None:
    """Rates: kprod 1000/s then 2000/s, the peer 500/s then 4000/s; CPU per record: kprod
    1000 then 3000 us, the peer 2000 then 1000 us. Java's CPU (its whole JVM's) gets no ratio."""
    rounds = [[_result("kprod send", 1.0, 1.0), _result("peer", 2.0, 2.0), _result("Java", 1.0, 9.0, True)],
              [_result("kprod send", 0.5, 3.0), _result("peer", 0.25, 1.0), _result("Java", 2.0, 9.0, True)]]
    text = perf.report(rounds)
    best = {line[:26].strip(): float(line[26:40].replace(",", "")) for line in text.splitlines()[1:4]}
    assert best == {"kprod send": 2000.0, "peer": 4000.0, "Java": 1000.0}, text
    assert "kprod send / peer: 0.50x (per round 0.50-2.00x)" in text, text
    assert "kprod send / Java: 2.00x (per round 1.00-4.00x)" in text, text
    # the median of the per-round CPU ratios: 0.5 and 3.0
    assert "CPU per record, kprod send / peer: 1.75x (median of 2 rounds, per round 0.50-3.00x)" in text, text
    assert "CPU per record, kprod send / Java" not in text and "* its whole JVM's CPU" in text, text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("mode", ["arrow", "record"])
def test_progress_on_a_terminal_counts_exactly(kafka: KafkaCluster, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str], mode: str) -> None:
    """On a terminal the progress line counts the records handed over so far: never more
    than there are, all of them at the end (2,500 is no multiple of any step)."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setattr(perf.Progress, "interval", 0.0)  # every update shows
    topic = create_topic(kafka.bootstrap, unique_topic("perf-tty"), 3)
    assert perf.main(["--bootstrap-servers", kafka.bootstrap, "--topic", topic, "--num-records", "2500",
                      "--mode", mode]) == 0
    shown = [int(line.split(": ", 1)[1].split("/", 1)[0].replace(",", ""))
             for line in terminal.getvalue().split("\r") if "/2,500 records sent" in line]
    assert shown and shown[-1] == 2500 and all(n <= 2500 for n in shown) and shown == sorted(shown), shown
    assert ": 2,500 records sent in " in terminal.getvalue()


def test_without_compare_no_peer_is_imported(kafka: KafkaCluster) -> None:
    """A run without --compare needs only kprod: neither confluent-kafka nor kafka-python
    is imported (they are the bench extra's)."""
    topic = create_topic(kafka.bootstrap, unique_topic("perf-alone"), 1)
    code = ("import sys; from spark_sink import perf; "
            f"code = perf.main(['--bootstrap-servers', '{kafka.bootstrap}', '--topic', '{topic}', "
            "'--num-records', '100']); "
            "print(code, sorted(m for m in ('confluent_kafka', 'kafka') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], env=subprocess_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout + done.stderr


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kprod-perf: "), err
    return lines[0]


def test_compare_without_the_bench_extra_names_it(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)  # what an import finds when it is not installed
    assert perf.main(["--bootstrap-servers", "127.0.0.1:1", "--compare", "--num-records", "10"]) == 2
    line = _one_line_error(capsys)
    assert "confluent-kafka" in line and "pip install -e '.[bench]' in a clone of kprod" in line, line


@pytest.mark.parametrize("argv, says", [
    (["--num-records", "many"], "--num-records: invalid int value: 'many'"),
    (["--num-records", "0"], "--num-records must be at least 1, got 0"),
    (["--repeat", "0"], "--repeat must be at least 1, got 0"),
    (["--producer-props", "linger.ms"], "--producer-props: expected key=value, got 'linger.ms'"),
    (["--producer-props", "no.such.setting=1"], "no.such.setting"),
    (["--mode", "fast"], "--mode: invalid choice: 'fast'"),
])
def test_command_line_mistakes_end_with_one_line_and_status_2(capsys: pytest.CaptureFixture[str], argv: list[str],
                                                              says: str) -> None:
    assert perf.main(["--bootstrap-servers", "127.0.0.1:1", *argv]) == 2
    line = _one_line_error(capsys)
    assert line.startswith("kprod-perf: error: ") and says in line, line


def _senders() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("kprod-sender-")]


def test_unreachable_address_ends_with_one_line_and_status_2_and_no_producer_left(
        capsys: pytest.CaptureFixture[str]) -> None:
    address = f"127.0.0.1:{free_port()}"
    assert perf.main(["--bootstrap-servers", address, "--num-records", "10",
                      "--producer-props", "max.block.ms=1500"]) == 2
    line = _one_line_error(capsys)
    assert line.startswith("kprod-perf: error: ") and address in line, line
    assert _senders() == []


def test_failed_run_ends_with_one_line_and_status_1_and_no_producer_left(kafka: KafkaCluster,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Records larger than max.request.size fail the kprod run: one line, status 1, and
    the producer is closed."""
    topic = create_topic(kafka.bootstrap, unique_topic("perf-fail"), 1)
    assert perf.main(["--bootstrap-servers", kafka.bootstrap, "--topic", topic, "--num-records", "10",
                      "--record-size", "2000", "--mode", "record", "--producer-props", "max.request.size=1000"]) == 1
    line = _one_line_error(capsys)
    assert line.startswith("kprod-perf: run failed: "), line
    assert _senders() == []
