"""A scripted network client for the Sender, as Java's MockClient and franz-go's kfake
control hooks: a test double of the network only, with the interface of NetworkClient
that the Sender uses (``spark_sink.producer.sender.KafkaClient``).

Metadata and InitProducerId are answered at once from what the test set up; Produce
requests stay in flight until the test answers them (``respond_produce``, with the error
it chooses per partition) or drops the connection they went on (``disconnect``: a lost
reply). Every request and answer goes through kprod's own codec both ways: a request is
encoded as NetworkClient would send it and decoded as a broker reads it (so the test sees
the producer id, epoch and sequence each batch carries on the wire), and each answer is
encoded as a broker writes it and decoded by the producer's decoder before the Sender gets
it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from spark_sink.client.connections import ClientResponse
from spark_sink.protocol import kmsg
from spark_sink.protocol.apis import (
    VERSIONS,
    ApiKey,
    decode_request_body,
    decode_response_body,
    encode_request_body,
    encode_response_body,
)
from spark_sink.protocol.error_codes import (
    NO_ERROR,
    InvalidProducerEpochError,
    KafkaConnectionError,
    KafkaError,
    NotLeaderOrFollowerError,
    OutOfOrderSequenceNumberError,
)
from spark_sink.protocol.records import RecordBatch, decode_record_batches
from spark_sink.protocol.schema import Request as KRequest

TopicPartition = tuple[str, int]
Reply = TypeVar("Reply")
Callback = Callable[[ClientResponse], None]


@dataclass
class Request:
    """One request the Sender sent: its body as a broker decodes it."""

    node: int
    api_key: int
    version: int
    correlation_id: int
    body: Any  # the request, an instance of its kmsg class
    callback: Callback | None
    expect_response: bool
    answered: bool = False

    def batches(self) -> dict[TopicPartition, RecordBatch]:
        """A Produce request's record batch per partition (one each, as the Sender sends)."""
        out = {}
        for topic in self.body.topic_data:
            for part in topic.partition_data:
                (batch,) = decode_record_batches(part.records)
                out[(topic.name, part.index)] = batch
        return out


@dataclass
class ScriptedClient:
    """Brokers ``nodes`` (id -> host, port) leading the partitions of ``topics`` (name ->
    leader per partition)."""

    nodes: dict[int, tuple[str, int]] = field(default_factory=lambda: {0: ("scripted", 9092)})
    topics: dict[str, list[int]] = field(default_factory=dict)
    producer_id: int = 4000
    producer_epoch: int = 0
    # InitProducerId answers to give, in order, before the default (a new id each time):
    # an error class, or (producer id, epoch).
    init_producer_id_script: list[type[KafkaError] | tuple[int, int]] = field(default_factory=list)
    # EndTxn answers to give, in order, before success: an error class each.
    end_txn_script: list[type[KafkaError]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)
    # What a broker appended: per partition, the batches answered with success, in order.
    log: dict[TopicPartition, list[RecordBatch]] = field(default_factory=dict)
    down: set[int] = field(default_factory=set)  # nodes not ready (no connection)
    coordinator: int = 0  # the node FindCoordinator names for every transaction
    transactional_ids: set[str] = field(default_factory=set)  # initialised by InitProducerId
    wakeups: int = 0
    transaction_version: int = 1  # the cluster's transaction protocol (v1: AddPartitionsToTxn before Produce)
    closed: bool = False
    _completed: list[tuple[Callback, ClientResponse]] = field(default_factory=list)
    _correlation_id: int = 0

    # -- the Sender's side (KafkaClient) --------------------------------------

    def wakeup(self) -> None:
        self.wakeups += 1

    def wait(self, timeout_ms: float, io: bool = True) -> None:
        """Nothing to wait for: the test drives every round."""

    def poll(self, timeout_ms: float) -> bool:
        """Deliver the answers given since the last poll, as NetworkClient does."""
        completed, self._completed = self._completed, []
        for callback, response in completed:
            callback(response)
        return bool(completed)

    def next_timeout_ms(self, now: float) -> float:
        return float("inf")  # requests never time out here: the test decides their fate

    def ready(self, node_id: int, now: float) -> bool:
        return node_id in self.nodes and node_id not in self.down and not self.closed

    def connection_failed(self, node_id: int) -> bool:
        """A node the test took down counts as a failed connection (its leader unreachable)."""
        return node_id in self.down

    def connection_delay_ms(self, node_id: int, now: float) -> float:
        return 0.0

    @property
    def authentication_error(self) -> Exception | None:
        return None  # no SASL here

    def describe_bootstrap(self) -> str:
        return "the scripted brokers " + ", ".join(f"{host}:{port}" for host, port in self.nodes.values())

    def least_loaded_node(self, now: float) -> int | None:
        return next((n for n in sorted(self.nodes) if self.ready(n, now)), None)

    def api_version(self, node_id: int, api_key: int) -> int | None:
        """The version ``send`` would use: kprod's highest."""
        return VERSIONS[ApiKey(api_key)][1]

    def send(self, node_id: int, api_key: int, body: KRequest[Reply],
             callback: Callable[[ClientResponse[Reply]], None] | None,
             expect_response: bool = True, max_version: int | None = None) -> None:
        if not self.ready(node_id, 0.0):
            raise KafkaConnectionError(f"node {node_id} is not ready")
        version = min(VERSIONS[ApiKey(api_key)][1], 1 << 15 if max_version is None else max_version)
        wire = encode_request_body(api_key, version, body)
        self._correlation_id += 1
        request = Request(node_id, api_key, version, self._correlation_id,
                          decode_request_body(api_key, version, wire), callback, expect_response)
        self.requests.append(request)
        if not expect_response:
            self._complete(request, None, None)  # acks=0: done once written
        elif api_key == ApiKey.METADATA:
            self.respond(request, self._metadata_body(request.body))
        elif api_key == ApiKey.INIT_PRODUCER_ID:
            self.respond(request, self._init_producer_id_body(request.body))
        elif api_key == ApiKey.FIND_COORDINATOR:
            host, port = self.nodes[self.coordinator]
            self.respond(request, kmsg.FindCoordinatorResponse(
                error_code=NO_ERROR, node_id=self.coordinator, host=host, port=port))
        elif api_key == ApiKey.ADD_PARTITIONS_TO_TXN:
            self.respond(request, kmsg.AddPartitionsToTxnResponse(results_by_topic_v3_and_below=[
                kmsg.AddPartitionsToTxnTopicResult(t.name, [
                    kmsg.AddPartitionsToTxnPartitionResult(partition_index=i, partition_error_code=NO_ERROR)
                    for i in t.partitions])
                for t in request.body.v3_and_below_topics]))
        elif api_key == ApiKey.ADD_OFFSETS_TO_TXN:
            self.respond(request, kmsg.AddOffsetsToTxnResponse(error_code=NO_ERROR))
        elif api_key == ApiKey.TXN_OFFSET_COMMIT:
            self.respond(request, kmsg.TxnOffsetCommitResponse(topics=[
                kmsg.TxnOffsetCommitResponseTopic(t.name, [
                    kmsg.TxnOffsetCommitResponsePartition(partition_index=p.partition_index, error_code=NO_ERROR)
                    for p in t.partitions])
                for t in request.body.topics]))
        elif api_key == ApiKey.END_TXN:
            error = self.end_txn_script.pop(0) if self.end_txn_script else None
            if error is not None or request.version < 5:
                self.respond(request, kmsg.EndTxnResponse(error_code=error.code if error else NO_ERROR))
            else:  # transaction protocol v2: the coordinator bumps the epoch and says so
                self.producer_epoch += 1
                self.respond(request, kmsg.EndTxnResponse(
                    error_code=NO_ERROR, producer_id=self.producer_id, producer_epoch=self.producer_epoch))

    def set_nodes(self, nodes: Mapping[int, tuple[str, int]]) -> None:
        self.nodes.update(nodes)  # as NetworkClient: learnt nodes are added, none forgotten

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            for node in list(self.nodes):
                self.disconnect(node)
            self.poll(0)

    # -- the test's side ------------------------------------------------------

    def in_flight(self, api_key: int = ApiKey.PRODUCE) -> list[Request]:
        """Requests of ``api_key`` not answered yet, oldest first."""
        return [r for r in self.requests if r.api_key == api_key and r.expect_response and not r.answered]

    def respond(self, request: Request, body: Any) -> None:
        """Answer ``request`` with ``body``; the Sender sees it on its next poll."""
        wire = encode_response_body(request.api_key, request.version, body)
        self._complete(request, decode_response_body(request.api_key, request.version, wire), None)

    def respond_produce(self, request: Request, errors: Mapping[TopicPartition, type[KafkaError]] | None = None
                        ) -> None:
        """Answer a Produce request: the error chosen for a partition, NOT_LEADER_OR_FOLLOWER
        if the request's node no longer leads it, a sequence error as a broker checks them,
        else success at the end of its log; a batch the log already holds (same producer id, epoch
        and sequence) is answered with the offset it got then, as a broker does for its
        last five batches per producer."""
        errors = errors or {}
        responses = []
        for tp, batch in request.batches().items():
            error = errors.get(tp)
            if error is None and self.topics[tp[0]][tp[1]] != request.node:
                error = NotLeaderOrFollowerError  # leadership moved since the request went
            part = kmsg.PartitionProduceResponse(index=tp[1], base_offset=-1)
            log = self.log.setdefault(tp, [])
            if error is None:
                part.base_offset = self._offset_of(log, batch)
                if part.base_offset < 0:
                    error = self._sequence_error(log, batch)
            if error is None and part.base_offset < 0:
                part.base_offset = sum(len(b.records) for b in log)
                log.append(batch)
            part.error_code = NO_ERROR if error is None else error.code
            responses.append(kmsg.TopicProduceResponse(tp[0], [part]))
        self.respond(request, kmsg.ProduceResponse(responses))

    def write(self, request: Request) -> None:
        """Append a Produce request's batches to the log without answering: with
        ``disconnect`` after it, a request the broker handled whose answer was lost."""
        for tp, batch in request.batches().items():
            self.log.setdefault(tp, []).append(batch)

    def disconnect(self, node: int) -> None:
        """Drop the connection to ``node``: every request in flight on it fails, whether the
        broker handled it or not (a lost reply)."""
        for request in self.requests:
            if request.node == node and request.expect_response and not request.answered:
                self._complete(request, None, KafkaConnectionError(f"connection to node {node} lost"))

    @staticmethod
    def _offset_of(log: list[RecordBatch], batch: RecordBatch) -> int:
        """The base offset of ``batch`` if ``log`` holds it already (idempotent), else -1."""
        offset = 0
        for written in log:
            if batch.base_sequence >= 0 and (written.producer_id, written.producer_epoch, written.base_sequence) == (
                    batch.producer_id, batch.producer_epoch, batch.base_sequence):
                return offset
            offset += len(written.records)
        return -1

    @staticmethod
    def _sequence_error(log: list[RecordBatch], batch: RecordBatch) -> type[KafkaError] | None:
        """What a broker says of ``batch``'s producer epoch and sequence, given the last
        batch of its producer id in ``log``: with none, any sequence is taken; a newer epoch
        must start at 0; an older epoch is refused; otherwise the sequence must follow."""
        if batch.producer_id < 0:
            return None
        last = next((b for b in reversed(log) if b.producer_id == batch.producer_id), None)
        if last is None:
            return None
        if batch.producer_epoch < last.producer_epoch:
            return InvalidProducerEpochError
        if batch.producer_epoch > last.producer_epoch:
            return None if batch.base_sequence == 0 else OutOfOrderSequenceNumberError
        expected = (last.base_sequence + len(last.records)) & 0x7FFFFFFF
        return None if batch.base_sequence == expected else OutOfOrderSequenceNumberError

    def values(self, tp: TopicPartition) -> list[bytes]:
        """The record values of ``tp``'s log, in offset order (the tests send no null one)."""
        values: list[bytes] = []
        for batch in self.log.get(tp, []):
            for r in batch.records:
                assert r.value is not None
                values.append(r.value)
        return values

    # -- answers ----------------------------------------------------------------

    def _complete(self, request: Request, body: Any, error: Exception | None) -> None:
        request.answered = True
        if request.callback is not None:
            self._completed.append((request.callback, ClientResponse(
                request.node, request.api_key, request.version, request.correlation_id, body, error, 0.0)))

    def _metadata_body(self, request: kmsg.MetadataRequest) -> kmsg.MetadataResponse:
        # As a broker: null asks for every topic, an empty list for none.
        names = list(self.topics) if request.topics is None else [t.name for t in request.topics]
        return kmsg.MetadataResponse(
            brokers=[kmsg.MetadataResponseBroker(node_id=n, host=h, port=p)
                     for n, (h, p) in sorted(self.nodes.items())],
            controller_id=min(self.nodes),
            topics=[kmsg.MetadataResponseTopic(
                error_code=NO_ERROR, name=name,
                partitions=[kmsg.MetadataResponsePartition(error_code=NO_ERROR, partition_index=i, leader_id=leader,
                                                           replica_nodes=[leader], isr_nodes=[leader])
                            for i, leader in enumerate(self.topics[name])],
            ) for name in names if name in self.topics],
        )

    def _init_producer_id_body(self, request: kmsg.InitProducerIdRequest) -> kmsg.InitProducerIdResponse:
        if request.transactional_id is not None and not self.init_producer_id_script:
            # A transaction coordinator keeps one producer id per transactional id and
            # bumps its epoch at every initialisation.
            first = request.transactional_id not in self.transactional_ids
            self.transactional_ids.add(request.transactional_id)
            self.producer_epoch = 0 if first else self.producer_epoch + 1
            return kmsg.InitProducerIdResponse(
                error_code=NO_ERROR, producer_id=self.producer_id, producer_epoch=self.producer_epoch)
        if self.init_producer_id_script:
            answer = self.init_producer_id_script.pop(0)
            if not isinstance(answer, tuple):
                return kmsg.InitProducerIdResponse(error_code=answer.code)
            self.producer_id, self.producer_epoch = answer
        else:
            self.producer_id, self.producer_epoch = self.producer_id + 1, 0  # a new id starts at epoch 0
        return kmsg.InitProducerIdResponse(
            error_code=NO_ERROR, producer_id=self.producer_id, producer_epoch=self.producer_epoch)
