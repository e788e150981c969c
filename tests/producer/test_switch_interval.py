"""The GIL switch interval is lowered only while send_arrow (or a Spark task) encodes, and
restored afterwards, whatever happens in between."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import ColumnError, KafkaProducer
from spark_sink.producer import producer as producer_module
from spark_sink.producer.arrow_input import TopicRows, plan_arrow_send
from spark_sink.producer.switch_interval import SWITCH_INTERVAL_S, short_switch_interval
from tests.brokers import create_topic, unique_topic


@pytest.fixture(autouse=True)
def default_interval() -> Iterator[None]:
    saved = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(saved)


def test_lowered_inside_and_restored_after() -> None:
    with short_switch_interval():
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_nested_blocks_restore_at_the_outermost_exit() -> None:
    with short_switch_interval():
        with short_switch_interval():
            pass
        assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_overlapping_threads_restore_when_the_last_leaves() -> None:
    entered, release = threading.Event(), threading.Event()

    def other() -> None:
        with short_switch_interval():
            entered.set()
            release.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert entered.wait(10)
    with short_switch_interval():
        pass
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)  # the other thread is still inside
    release.set()
    t.join(10)
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_a_change_made_meanwhile_is_kept() -> None:
    with short_switch_interval():
        sys.setswitchinterval(0.002)
    assert sys.getswitchinterval() == pytest.approx(0.002)


def test_a_shorter_interval_is_left_alone() -> None:
    sys.setswitchinterval(0.0001)
    with short_switch_interval():
        assert sys.getswitchinterval() == pytest.approx(0.0001)
    assert sys.getswitchinterval() == pytest.approx(0.0001)


def test_restored_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), short_switch_interval():
        raise RuntimeError("boom")
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_send_arrow_lowers_it_while_it_runs_and_restores_it_after_success_and_errors(
        kafka: KafkaCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []

    # the real planner, with the interval it ran under noted
    def observed_plan(*args: Any, **kwargs: Any) -> list[TopicRows]:
        seen.append(sys.getswitchinterval())
        return plan_arrow_send(*args, **kwargs)

    monkeypatch.setattr(producer_module, "plan_arrow_send", observed_plan)
    topic = create_topic(kafka.bootstrap, unique_topic("switch"), partitions=2)
    with KafkaProducer({"bootstrap.servers": kafka.bootstrap}) as producer:
        future = producer.send_arrow(pa.table({"value": [b"a", b"b"]}), topic=topic)
        assert sys.getswitchinterval() == pytest.approx(0.005)
        assert future.result(30).records == 2
        with pytest.raises(ColumnError, match="colour"):
            producer.send_arrow(pa.table({"value": [b"a"], "colour": [1]}), topic=topic)
        assert sys.getswitchinterval() == pytest.approx(0.005)
    assert seen == [pytest.approx(SWITCH_INTERVAL_S)] * 2
