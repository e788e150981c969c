"""AdminClient: the coordinator requests that run outside a producer, in the calling thread.

Two-phase commit across processes needs them: a process other than the one that wrote a
transaction ends it (EndTxn with the transactional id, producer id and epoch the writer
reported), and a writer reads back the offsets earlier transactions committed under a
group (OffsetFetch, waiting for pending transactional offsets to settle). Each call blocks
until every answer is in or its timeout passes, retrying what Kafka says may be retried
and finding a coordinator again when it moved. Requests to one coordinator are pipelined:
ending a hundred transactions costs a few round trips, not a hundred. Where the cluster
speaks transaction protocol v2 (transaction.version 2), so does the AdminClient: EndTxn
v5 (which bumps the epoch) and TxnOffsetCommit v5 without AddOffsetsToTxn; elsewhere
protocol v1's versions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Generic, TypeVar

from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.config import ClientConfig
from spark_sink.client.connections import ClientResponse
from spark_sink.client.coordinators import Coordinators
from spark_sink.client.errors import IllegalStateError, KafkaTimeoutError
from spark_sink.client.network import NetworkClient
from spark_sink.protocol import kmsg
from spark_sink.protocol.apis import V1_MAX_VERSIONS, ApiKey
from spark_sink.protocol.error_codes import TransactionalIdNotFoundError, error_for_code, is_retriable
from spark_sink.protocol.schema import Request
from spark_sink.protocol.txn_coordinator import (
    GROUP_COORDINATOR as GROUP,
)
from spark_sink.protocol.txn_coordinator import (
    TRANSACTION_COORDINATOR as TRANSACTION,
)
from spark_sink.protocol.txn_coordinator import (
    PreparedTransaction,
    TransactionState,
    add_offsets_body,
    by_topic,
    end_txn_body,
    ended_by,
    partition_error,
    txn_offset_commit_body,
)

log = logging.getLogger(__name__)

Offsets = dict[tuple[str, int], tuple[int, "str | None"]]  # (topic, partition) -> (offset, metadata)
_BROKER_RESOURCE = 4  # DescribeConfigs' resource type of one broker's settings
_ANY_BROKER = -1  # a _Call's key type for a request any broker answers (or the one it names)


_LAST_OFFSET_COMMIT_WITH_RETENTION = 4  # OffsetCommit's RetentionTimeMs is in v2-v4


Reply = TypeVar("Reply")


def _reply_error(body: object, what: str) -> Exception | None:
    """The error an answer carries for its one resource: at its top (where it has one),
    for a partition (offset commits and fetches), or in its one listed result."""
    error: Exception | None = None
    if isinstance(body, (kmsg.EndTxnResponse, kmsg.InitProducerIdResponse, kmsg.AddOffsetsToTxnResponse,
                         kmsg.OffsetFetchResponse, kmsg.ListTransactionsResponse)):
        error = error_for_code(body.error_code, what)
    if error is None and isinstance(body, (kmsg.OffsetFetchResponse, kmsg.TxnOffsetCommitResponse,
                                           kmsg.OffsetCommitResponse)):
        error = partition_error(body, what)
    listed: list[kmsg.DescribeTransactionsResponseTransactionState] | list[kmsg.DescribeConfigsResult] = []
    if isinstance(body, kmsg.DescribeTransactionsResponse):
        listed = body.transaction_states
    elif isinstance(body, kmsg.DescribeConfigsResponse):
        listed = body.results
    return error or next((error_for_code(r.error_code, what) for r in listed if r.error_code), None)


class _Call(Generic[Reply]):
    """One request to a coordinator (or a broker), sent again until it is answered for good."""

    __slots__ = ("key_type", "key", "api_key", "body", "result", "error", "not_before", "in_flight", "done",
                 "accept", "max_version", "node")

    def __init__(self, key_type: int, key: str, api_key: ApiKey,
                 body: Request[Reply] | Callable[[int], Request[Reply]], accept: frozenset[type] = frozenset(),
                 max_version: int | None = None, node: int | None = None) -> None:
        # A body may depend on the node it goes to (a broker's own settings are asked of it).
        self.key_type, self.key, self.api_key, self.body = key_type, key, api_key, body
        self.result: Reply | None = None  # the reply (None: not yet, or an accepted error)
        self.error: Exception | None = None  # the last error (retriable ones are tried again)
        self.not_before = 0.0
        self.in_flight = False
        self.done = False
        self.accept = accept  # errors that are answers: the call is done, its result kept
        self.max_version = max_version  # the newest version the body may go in (None: any)
        self.node = node  # the broker it goes to (key type _ANY_BROKER; None: the least loaded)

    def reply(self) -> Reply:
        """The reply of a call that succeeded."""
        if self.result is None:
            raise IllegalStateError(f"{self.api_key.name} for {self.key}: no reply")
        return self.result


class AdminClient:
    """Connections to the cluster for coordinator requests; one thread at a time.

    ``config``: the client settings (bootstrap.servers, security, timeouts); a mapping may
    hold a producer's settings too, whose other keys the admin client leaves alone.
    """

    def __init__(self, config: Mapping[str, Any] | ClientConfig, *, clock: Clock = now_ms) -> None:
        self._config = ClientConfig.of(config)
        self._clock = clock  # of its deadlines and retry backoffs, and its NetworkClient's
        self._client = NetworkClient(self._config, clock=clock)
        self._coordinators = Coordinators()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- public calls ---------------------------------------------------------

    def end_transactions(self, transactions: Iterable[PreparedTransaction], commit: bool,
                         timeout_ms: float | None = None) -> None:
        """Commit (or abort) each prepared transaction; raises the first error that is not
        retriable, or KafkaTimeoutError naming the transactions still open after
        ``timeout_ms`` (default request.timeout.ms x 2). Ending a transaction that is
        already ended the same way succeeds, so a lost answer is safe to retry. Under
        transaction protocol v2 the coordinator bumps the epoch as it ends each one
        (:meth:`ended_by_us`)."""
        calls = [_Call(TRANSACTION, t.transactional_id, ApiKey.END_TXN,
                       end_txn_body(t.transactional_id, t.producer_id, t.producer_epoch, commit)) for t in transactions]
        self._run(calls, timeout_ms, "commit" if commit else "abort")

    @property
    def transaction_version(self) -> int:
        """The transaction protocol the cluster speaks, as the brokers connected so far say
        (0 before any connection)."""
        return self._client.transaction_version

    def ended_by_us(self, transaction: PreparedTransaction, state: TransactionState) -> bool:
        """Whether ``state`` (from :meth:`describe_transactions`) is ``transaction``'s id as
        this client's EndTxn left it (see :func:`ended_by`)."""
        return ended_by(transaction, state, self.transaction_version)

    def fence_transactions(self, transactional_ids: Iterable[str], timeout_ms: float | None = None,
                           transaction_timeout_ms: int = 60000) -> None:
        """Fence every producer of each transactional id, as a new producer's
        init_transactions() would (Java's Admin.fenceProducers): the epoch is bumped and a
        transaction left open under the id is aborted. One still being committed is
        committed first. ``transaction_timeout_ms`` stays with each id only until its next
        producer's init_transactions() sets its own."""
        calls = [_Call(TRANSACTION, tid, ApiKey.INIT_PRODUCER_ID, kmsg.InitProducerIdRequest(
            transactional_id=tid, transaction_timeout_ms=transaction_timeout_ms,
            producer_id=-1, producer_epoch=-1)) for tid in transactional_ids]
        self._run(calls, timeout_ms, "fence transactional ids")

    def commit_offsets(self, group_id: str, offsets: Offsets, timeout_ms: float | None = None, *,
                       retention_ms: int | None = None) -> None:
        """Commit ``offsets`` for ``group_id`` at once, outside any transaction, as a client
        that is no member of the group (the group must have no active members).

        ``retention_ms``: keep them that long rather than the broker's
        offsets.retention.minutes after this commit (OffsetCommit v2-v4 carry a retention
        of their own, which Kafka's group coordinators still honour; the request is then
        sent at v4 at most)."""
        topics: dict[str, list[kmsg.OffsetCommitRequestPartition]] = {}
        for (topic, partition), (offset, metadata) in offsets.items():
            topics.setdefault(topic, []).append(kmsg.OffsetCommitRequestPartition(
                partition_index=partition, committed_offset=offset, committed_metadata=metadata))
        body = kmsg.OffsetCommitRequest(group_id=group_id, topics=[
            kmsg.OffsetCommitRequestTopic(t, ps) for t, ps in topics.items()])
        max_version = None
        if retention_ms is not None:
            body.retention_time_ms, max_version = retention_ms, _LAST_OFFSET_COMMIT_WITH_RETENTION
        self._run([_Call(GROUP, group_id, ApiKey.OFFSET_COMMIT, body, max_version=max_version)], timeout_ms,
                  f"commit offsets of {group_id}")

    def committed_offsets(self, partitions_by_group: Mapping[str, Iterable[tuple[str, int]]],
                          timeout_ms: float | None = None) -> dict[str, Offsets]:
        """Per group, the offset and metadata committed for each of its partitions
        (``(-1, None)`` where none is), read once no transaction holds a pending commit for
        them (require_stable). The groups are asked at once."""
        calls = {group: _Call(GROUP, group, ApiKey.OFFSET_FETCH, kmsg.OffsetFetchRequest(
            group_id=group, require_stable=True,
            topics=[kmsg.OffsetFetchRequestTopic(t, ps) for t, ps in by_topic(partitions).items()]))
            for group, partitions in partitions_by_group.items()}
        self._run(list(calls.values()), timeout_ms, "fetch committed offsets")
        return {group: {(t.name, p.partition_index):
                        (p.committed_offset, p.metadata if p.committed_offset >= 0 else None)
                        for t in call.reply().topics for p in t.partitions}
                for group, call in calls.items()}

    def send_offsets_to_transactions(self, items: Iterable[tuple[PreparedTransaction, str, Offsets]],
                                     timeout_ms: float | None = None) -> None:
        """Add offsets to open transactions, as each one's producer would with
        send_offsets_to_transaction: ``(transaction, group id, {(topic, partition):
        (offset, metadata)})``. They become visible when the transaction commits."""
        items = list(items)
        if not items:
            return
        if self._cluster_transaction_version(timeout_ms) < 2:
            # Protocol v1: each group's offsets partition joins the transaction first (under
            # v2, TxnOffsetCommit v5 adds it itself).
            self._run([_Call(TRANSACTION, t.transactional_id, ApiKey.ADD_OFFSETS_TO_TXN,
                             add_offsets_body(t.transactional_id, t.producer_id, t.producer_epoch, group))
                       for t, group, _ in items],
                      timeout_ms, "add offsets to transactions")
        self._run([_Call(GROUP, group, ApiKey.TXN_OFFSET_COMMIT, txn_offset_commit_body(
            t.transactional_id, group, t.producer_id, t.producer_epoch, offsets)) for t, group, offsets in items],
            timeout_ms, "commit offsets in transactions")

    def describe_transactions(self, transactional_ids: Iterable[str], timeout_ms: float | None = None
                              ) -> dict[str, TransactionState]:
        """Each id's transaction as its coordinator holds it, asked of every coordinator at
        once. An id the coordinator does not know has state None."""
        calls = {tid: _Call(TRANSACTION, tid, ApiKey.DESCRIBE_TRANSACTIONS,
                            kmsg.DescribeTransactionsRequest([tid]),
                            accept=frozenset({TransactionalIdNotFoundError}))
                 for tid in transactional_ids}
        self._run(list(calls.values()), timeout_ms, "describe transactions")
        states = {}
        for tid, call in calls.items():
            found = call.result.transaction_states if call.result is not None else []
            s = found[0] if found and not found[0].error_code else None
            states[tid] = TransactionState(tid, None) if s is None else TransactionState(
                tid, s.transaction_state, s.producer_id, s.producer_epoch, s.transaction_timeout_ms,
                s.transaction_start_time_ms)
        return states

    def list_transactions(self, states: Iterable[str] = ("Ongoing",), timeout_ms: float | None = None
                          ) -> set[str]:
        """The transactional ids whose transaction is in one of ``states``, on every
        broker's transaction coordinator (ListTransactions to each broker of the cluster,
        found with a Metadata request)."""
        brokers = _Call(_ANY_BROKER, "cluster", ApiKey.METADATA, kmsg.MetadataRequest(topics=[]))
        self._run([brokers], timeout_ms, "list the brokers")
        nodes = {b.node_id: (b.host, b.port) for b in brokers.reply().brokers}
        self._client.set_nodes(nodes)
        calls = [_Call(_ANY_BROKER, f"broker {node}", ApiKey.LIST_TRANSACTIONS,
                       kmsg.ListTransactionsRequest(state_filters=list(states)), node=node) for node in sorted(nodes)]
        self._run(calls, timeout_ms, "list transactions")
        return {t.transactional_id for call in calls for t in call.reply().transaction_states}

    def coordinator_config(self, transactional_id: str, names: Iterable[str], timeout_ms: float | None = None
                           ) -> dict[str, str | None]:
        """Settings of the broker that coordinates ``transactional_id`` (DescribeConfigs of
        that broker, asked of itself: static settings are known only there), by name."""
        names = list(names)
        call = _Call(TRANSACTION, transactional_id, ApiKey.DESCRIBE_CONFIGS, lambda node: kmsg.DescribeConfigsRequest(
            resources=[kmsg.DescribeConfigsResource(resource_type=_BROKER_RESOURCE, resource_name=str(node),
                                                    configuration_keys=names)],
            include_synonyms=False, include_documentation=False))
        self._run([call], timeout_ms, f"describe the settings of {transactional_id}'s coordinator")
        return {c.name: c.value for r in call.reply().results for c in r.configs}

    def _cluster_transaction_version(self, timeout_ms: float | None) -> int:
        """The cluster's transaction protocol, connecting to a broker first if none has
        said yet (the request to send depends on it)."""
        client = self._client
        timeout_ms = 2 * self._config.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = self._clock() + timeout_ms
        while not client.features_known:
            now = self._clock()
            if now >= deadline:
                raise KafkaTimeoutError(f"no broker answered within {timeout_ms:.0f} ms: "
                                        f"{client.describe_bootstrap()}")
            if client.authentication_error is not None:
                raise client.authentication_error
            node = client.least_loaded_node(now)
            if node is not None:
                client.ready(node, now)
            client.poll(min(20.0, deadline - now))
        return client.transaction_version

    # -- the loop -------------------------------------------------------------

    def _run(self, calls: Sequence[_Call[Reply]], timeout_ms: float | None, what: str) -> None:
        timeout_ms = 2 * self._config.request_timeout_ms if timeout_ms is None else timeout_ms
        deadline = self._clock() + timeout_ms
        client = self._client
        while True:
            now = self._clock()
            pending = [c for c in calls if not c.done]
            if not pending:
                # Every call ran to its end, so one refusal left none of the others undone.
                # A call without a result ended in _failed, which set its error.
                failed = [(c.key, c.error) for c in calls if c.result is None and c.error is not None]
                if failed:
                    error = failed[0][1]
                    if len(failed) > 1:
                        error.add_note(f"{what}: {len(failed)} of {len(calls)} request(s) failed: " + "; ".join(
                            f"{key}: {e}" for key, e in failed[:10]))
                    raise error
                return
            if now >= deadline:
                last = next((c.error for c in pending if c.error is not None), None)
                raise KafkaTimeoutError(
                    f"{what}: {len(pending)} of {len(calls)} request(s) unanswered after {timeout_ms:.0f} ms "
                    f"(for {', '.join(c.key for c in pending[:5])}); last error: {last}")
            if client.authentication_error is not None:
                raise client.authentication_error
            wait = max(0.0, deadline - now)
            for call in pending:
                if call.in_flight:
                    continue
                if now < call.not_before:
                    wait = min(wait, call.not_before - now)
                    continue
                node = self._coordinator(call, now)
                if node is not None and client.ready(node, now):
                    call.in_flight = True
                    body = call.body if isinstance(call.body, Request) else call.body(node)
                    # Protocol v1 stops below v2's versions (EndTxn v5, TxnOffsetCommit v5).
                    limit = V1_MAX_VERSIONS.get(call.api_key) if client.transaction_version < 2 else None
                    if call.max_version is not None:
                        limit = call.max_version if limit is None else min(limit, call.max_version)
                    client.send(node, call.api_key, body, partial(self._answered, call), max_version=limit)
                else:
                    wait = min(wait, 20.0)  # connecting, or its coordinator being found
            client.poll(wait)

    def _coordinator(self, call: _Call[Reply], now: float) -> int | None:
        """The coordinator's node id for ``call`` if known, else asks for it (once at a
        time per key) and returns None. A call to a broker of its own: that broker."""
        if call.key_type == _ANY_BROKER:
            return call.node if call.node is not None else self._client.least_loaded_node(now)
        node = self._coordinators.node(self._client, call.key_type, call.key, now)
        if node is None:
            self._coordinators.find(self._client, call.key_type, call.key, now, partial(self._found, call))
        return node

    def _found(self, call: _Call[Reply], error: Exception | None) -> None:
        if error is not None:
            self._failed(call, error)

    def _answered(self, call: _Call[Reply], response: ClientResponse[Reply]) -> None:
        call.in_flight = False
        error = response.error
        if error is None:
            error = _reply_error(response.body, f"{call.api_key.name} for {call.key}")
        if error is not None and type(error) in call.accept:
            error = None  # an answer, not a failure (a transactional id its coordinator never heard of)
        if error is None:
            call.result, call.done = response.body, True
            return
        self._failed(call, error)

    def _failed(self, call: _Call[Reply], error: Exception) -> None:
        """Retriable: try again after retry.backoff.ms (finding the coordinator anew if it
        moved); otherwise the whole call fails with the broker's error."""
        call.error = error
        self._coordinators.failed(call.key_type, call.key, error)
        if not is_retriable(error):
            call.done = True  # _run raises it: callbacks must not
            return
        log.debug("%s for %s: %s; retrying", call.api_key.name, call.key, error)
        call.not_before = self._clock() + self._config.retry_backoff_ms

