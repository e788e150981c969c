"""The queue of a transactional producer's requests to its coordinators.

Requests wait in order and go one at a time: the Sender takes the head when it is due,
finds its coordinator first (:class:`~spark_sink.client.coordinators.Coordinators`),
sends it, and hands the answer back. An answer ends a request, has it retried after
retry.backoff.ms (finding the coordinator again if it moved), or fails it for good, which
the TransactionManager turns into a failed transaction. The flow between requests is
written on them: a request names the one that follows it (``then``: AddOffsetsToTxn, then
the offsets themselves to the group's coordinator), and whether its answer settles its
result (``settles``: EndTxn's settles only once a new epoch, if one is needed, is in).

A request whose coordinator keeps answering a retriable error (COORDINATOR_NOT_AVAILABLE
while the group's or the transactions' internal topic is missing) is retried until the
caller's max.block.ms, as Java's producer does, but not silently: after
:data:`WARN_AFTER_MS` of such answers one WARNING names the request, its group or
transactional id, the error and what usually causes it, and a call that times out says
the same (:meth:`CoordinatorRequests.retrying`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Generic, TypeVar

from spark_sink.client.connections import ClientResponse
from spark_sink.client.coordinators import Client, Coordinators
from spark_sink.client.errors import KafkaTimeoutError, UnknownTopicError
from spark_sink.client.metadata import UNKNOWN_TOPIC_GRACE_MS
from spark_sink.producer.batch import TopicPartition
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import (
    CoordinatorNotAvailableError,
    OperationNotAttemptedError,
    UnknownTopicOrPartitionError,
    is_retriable,
)
from spark_sink.protocol.schema import Request
from spark_sink.protocol.txn_coordinator import GROUP_COORDINATOR

log = logging.getLogger(__name__)

Reply = TypeVar("Reply")

# How long the head request may meet the same retriable error before a WARNING says so:
# long enough for a new cluster to create its internal topic at the first use of a group
# or transactional id (which Kafka answers with COORDINATOR_NOT_AVAILABLE meanwhile).
WARN_AFTER_MS = 5000.0

# What usually makes a coordinator unavailable for longer than that, by key type.
_GROUP_UNAVAILABLE = ("Kafka answers so while the group coordinator's topic __consumer_offsets is missing or has no "
                      "leader: it creates that topic at the first use of a group, and cannot where "
                      "offsets.topic.replication.factor exceeds the live brokers")
_TXN_UNAVAILABLE = ("Kafka answers so while the transaction coordinator's topic __transaction_state is missing or "
                    "has no leader: it creates that topic at the first use of a transactional id, and cannot where "
                    "transaction.state.log.replication.factor exceeds the live brokers")


class TransactionalResult:
    """The outcome of one transaction call, which the application waits for."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self.error: Exception | None = None
        # A wait timed out before the outcome, and none has returned it since: the call is
        # to be retried, and the retry waits for this same result.
        self.retry_due = False

    def done(self, error: Exception | None = None) -> None:
        self.error = error
        self._done.set()

    def wait(self, timeout_s: float, what: str, why: Callable[[], str | None] = lambda: None) -> None:
        """Block until the outcome (raising its error), or ``timeout_s``; ``why`` says what
        held the call up, for the timeout's error."""
        if not self._done.wait(timeout_s):
            self.retry_due = True
            cause = why()
            raise KafkaTimeoutError(f"{what} did not finish within {timeout_s * 1000:.0f} ms (max.block.ms)"
                                    + (f": {cause}" if cause else "")
                                    + f"; the request goes on: call {what} again for its outcome")
        self.retry_due = False
        if self.error is not None:
            raise self.error


@dataclass(eq=False)
class TxnRequest:
    """A request to a coordinator, queued until the Sender can send it. Its body and the
    handling of its reply are a :class:`CoordinatorRequest`'s, of one API's types."""

    api_key: ApiKey
    coordinator: int  # TRANSACTION_COORDINATOR or GROUP_COORDINATOR
    key: str  # the transactional id or group id the coordinator is found by
    _: KW_ONLY
    result: TransactionalResult | None = None
    then: TxnRequest | None = None  # goes next once this one is done, and settles ``result``
    settles: bool = True  # False: ``handle`` settles ``result`` itself
    not_before: float = 0.0
    partitions: set[TopicPartition] = field(default_factory=set)  # AddPartitionsToTxn: the partitions it adds
    max_version: int | None = None  # the highest version it may go in (a transaction of protocol v1)

    def describe(self) -> str:
        kind = "group" if self.coordinator == GROUP_COORDINATOR else "transactional.id"
        return f"{self.api_key.name} for {kind} {self.key!r}"

    def send(self, client: Client, node: int, answered: Callable[[], None]) -> None:
        """Send the request to ``node``; ``answered`` runs once its outcome is in."""
        raise NotImplementedError

    def outcome(self) -> Exception | None:
        """The answer's error (or the one that prevented it); None when the request is done."""
        raise NotImplementedError


@dataclass(eq=False)
class CoordinatorRequest(TxnRequest, Generic[Reply]):
    """A TxnRequest with its body, and what its reply means: ``handle`` gives the reply's
    error, None when done (it may settle ``result`` itself, see ``settles``)."""

    body: Request[Reply]
    handle: Callable[[Reply], Exception | None]
    response: ClientResponse[Reply] | None = field(default=None, init=False)

    def send(self, client: Client, node: int, answered: Callable[[], None]) -> None:
        def on_response(response: ClientResponse[Reply]) -> None:
            self.response = response
            answered()

        self.response = None
        client.send(node, self.api_key, self.body, on_response, max_version=self.max_version)

    def outcome(self) -> Exception | None:
        response = self.response
        if response is None:
            raise RuntimeError(f"{self.describe()} has no answer yet")
        if response.error is not None:
            return response.error
        return self.handle(response.reply())


@dataclass(eq=False)
class Retrying:
    """The head request's run of retriable errors of one kind."""

    request: TxnRequest
    error: Exception
    since_ms: float
    answers: int = 1
    last_ms: float = 0.0
    warned: bool = False

    def describe(self) -> str:
        text = (f"{self.request.describe()} met {self.error} {self.answers} time(s) over "
                f"{(self.last_ms - self.since_ms) / 1000:.1f} s, retried every retry.backoff.ms")
        if isinstance(self.error, CoordinatorNotAvailableError):
            text += f" ({_GROUP_UNAVAILABLE if self.request.coordinator == GROUP_COORDINATOR else _TXN_UNAVAILABLE})"
        return text


class CoordinatorRequests:
    """The requests waiting for their coordinators, the head one at most in flight."""

    def __init__(self, retry_backoff_ms: float) -> None:
        self._queue: deque[TxnRequest] = deque()
        self._retry_backoff_ms = retry_backoff_ms
        self.in_flight = False  # the head was sent (or its coordinator is being found)
        self.coordinators = Coordinators()
        self._retrying: Retrying | None = None

    def append(self, request: TxnRequest) -> None:
        self._queue.append(request)

    def push_first(self, request: TxnRequest) -> None:
        """``request`` goes before every waiting one."""
        self._queue.appendleft(request)

    def holds(self, api_key: ApiKey) -> bool:
        return any(r.api_key == api_key for r in self._queue)

    @property
    def head(self) -> TxnRequest | None:
        return self._queue[0] if self._queue else None

    def pop_head(self) -> TxnRequest:
        return self._queue.popleft()

    def due(self, now: float) -> TxnRequest | None:
        """The head, if it may be sent now."""
        head = self.head
        return None if self.in_flight or head is None or now < head.not_before else head

    def answered(self, request: TxnRequest, now: float) -> Exception | None:
        """``request``'s answer is in: None when it is done or to be retried, else the
        error that failed it (it leaves the queue)."""
        self.in_flight = False
        error = request.outcome()
        if error is not None:
            return self.failed(request, error, now)
        self._retrying = None
        self._queue.remove(request)
        if request.then is not None:
            self._queue.appendleft(request.then)
        elif request.result is not None and request.settles:
            request.result.done()
        return None

    def failed(self, request: TxnRequest, error: Exception, now: float) -> Exception | None:
        """``request`` (or finding its coordinator) failed with ``error``: None when it is
        to be retried, else ``error`` (it leaves the queue)."""
        self.in_flight = False
        self.coordinators.failed(request.coordinator, request.key, error)
        if is_retriable(error) or isinstance(error, OperationNotAttemptedError):
            run = self._note_retry(request, error, now)
            if isinstance(error, UnknownTopicOrPartitionError) and now - run.since_ms >= UNKNOWN_TOPIC_GRACE_MS:
                # As the metadata's wait for a topic: a coordinator still answering
                # unknown this long after the first such answer names a topic that does
                # not exist (a new one is known within that), and retrying until
                # max.block.ms would only delay the same answer.
                error = UnknownTopicError(f"{request.describe()}: {error.message or error.name}: no such topic "
                                          f"(the coordinator answered UNKNOWN_TOPIC_OR_PARTITION for "
                                          f"{UNKNOWN_TOPIC_GRACE_MS} ms)")
            else:
                log.debug("%s for %s: %s; retrying", request.api_key.name, request.key, error)
                request.not_before = now + self._retry_backoff_ms
                return None
        self._retrying = None
        self._queue.remove(request)
        return error

    def _note_retry(self, request: TxnRequest, error: Exception, now: float) -> Retrying:
        """Count ``request``'s retriable ``error``; one WARNING once a run of them has
        lasted WARN_AFTER_MS. Returns the run."""
        run = self._retrying
        if run is None or run.request is not request or type(run.error) is not type(error):
            run = self._retrying = Retrying(request, error, now, last_ms=now)
        else:
            run.error, run.answers, run.last_ms = error, run.answers + 1, now
        if not run.warned and now - run.since_ms >= WARN_AFTER_MS:
            run.warned = True
            log.warning("%s; still retrying until the call's max.block.ms", run.describe())
        return run

    def retrying(self) -> str | None:
        """What the queue's head has been meeting, if it is being retried."""
        run = self._retrying
        return run.describe() if run is not None and run.request is self.head else None
