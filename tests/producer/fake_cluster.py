"""An in-process Kafka cluster for a whole KafkaProducer, without a JVM: the scripted
client (tests/producer/scripted_client.py) answering Produce requests itself, as a broker
would, and safe for the producer's own threads, as franz-go's kfake and Java's MockClient
serve their clients' tests.

``KafkaProducer(config, network_client=FakeCluster(topics={"t": [0, 0]}))`` sends to it;
``cluster.values(("t", 0))`` reads what a partition's log holds. Faults are scripted: a
Produce answer lost after the broker wrote it (``lose_answers``), errors for the next
answers of a partition (``fail_next``). What only a broker decides (replication,
coordinator fail-over, the transaction log's timeouts) stays with the real-Kafka tests.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import KafkaError
from spark_sink.protocol.kmsg import DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult
from tests.producer.scripted_client import Callback, Request, ScriptedClient, TopicPartition

BROKER_MESSAGE_MAX_BYTES = 1048588  # Kafka's default message.max.bytes


@dataclass
class FakeCluster(ScriptedClient):
    """The scripted client with Produce answered at once, from the producer's threads."""

    # Produce answers to lose (the broker writes the batches, the connection drops).
    lose_answers: int = 0
    # Errors for a partition's next Produce answers, in order.
    fail_next: dict[TopicPartition, list[type[KafkaError]]] = field(default_factory=dict)
    authentication_error: Exception | None = None  # as NetworkClient's: none here
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _woken: bool = False

    def send(self, node_id: int, api_key: int, body: Any, callback: Callback | None,
             expect_response: bool = True, max_version: int | None = None) -> None:
        with self._cond:
            super().send(node_id, api_key, body, callback, expect_response, max_version)
            if api_key == ApiKey.DESCRIBE_CONFIGS:
                self._describe_configs(self.requests[-1])
            elif api_key == ApiKey.PRODUCE:
                if expect_response:
                    self._answer(self.requests[-1])
                else:
                    self.write(self.requests[-1])  # acks=0: the broker writes, and says nothing
            self._cond.notify_all()

    def _describe_configs(self, request: Request) -> None:
        """A topic's max.message.bytes as a broker without topic overrides answers it
        (its message.max.bytes, Kafka's default)."""
        self.respond(request, DescribeConfigsResponse(results=[
            DescribeConfigsResult(resource_type=r.resource_type, resource_name=r.resource_name,
                                  configs=[DescribeConfigsResourceResult(name=key, value=str(BROKER_MESSAGE_MAX_BYTES))
                                           for key in r.configuration_keys or ()])
            for r in request.body.resources]))

    def _answer(self, request: Request) -> None:
        if self.lose_answers:
            self.lose_answers -= 1
            self.write(request)
            self.disconnect(request.node)
            return
        errors = {tp: self.fail_next[tp].pop(0) for tp in request.batches() if self.fail_next.get(tp)}
        self.respond_produce(request, errors)

    def poll(self, timeout_ms: float) -> bool:
        with self._cond:  # an RLock: wait() takes it again
            self.wait(timeout_ms)
            completed, self._completed = self._completed, []
        # The callbacks run outside the lock, as NetworkClient's do outside its own: they
        # take the producer's locks (metadata's), whose holders call wakeup(), which takes
        # this one. Held across them, each thread would wait for the other's lock.
        for callback, response in completed:
            callback(response)
        return bool(completed)

    def wait(self, timeout_ms: float, io: bool = True) -> None:
        with self._cond:
            if not self._woken and not self._completed:
                self._cond.wait(min(timeout_ms, 50.0) / 1000.0)
            self._woken = False

    def wakeup(self) -> None:
        with self._cond:
            super().wakeup()
            self._woken = True
            self._cond.notify_all()

    def set_nodes(self, nodes: Mapping[int, tuple[str, int]]) -> None:
        with self._cond:
            super().set_nodes(nodes)

    def values(self, tp: TopicPartition) -> list[bytes]:
        with self._cond:
            return super().values(tp)

    def describe_bootstrap(self) -> str:
        return "the fake cluster"
