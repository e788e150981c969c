"""Cluster metadata: brokers, partition leaders, and the wait for a topic to be known.

The Sender thread fetches and applies updates; user threads only read (plain dict
lookups on the hot path) or wait on a condition for a topic they have not seen yet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.errors import KafkaTimeoutError, UnknownTopicError
from spark_sink.protocol.error_codes import (
    NO_ERROR,
    InvalidTopicException,
    KafkaError,
    TopicAuthorizationFailedError,
    UnknownTopicOrPartitionError,
    error_for_code,
)
from spark_sink.protocol.kmsg import MetadataRequest, MetadataRequestTopic, MetadataResponse

log = logging.getLogger(__name__)

# Errors a topic can report that will not go away by waiting.
_FATAL_TOPIC_ERRORS = (InvalidTopicException, TopicAuthorizationFailedError)

# Kafka answers UNKNOWN_TOPIC_OR_PARTITION to the very request that makes it create a topic
# on first use (auto.create.topics.enable), then LEADER_NOT_AVAILABLE until its leaders are
# elected: a topic still answered unknown this long after the first such answer does not
# exist and will not be created by asking. Java waits max.block.ms (60 s) instead.
UNKNOWN_TOPIC_GRACE_MS = 2_000

# A topic's authorized operations (KIP-430) are a bit field indexed by Kafka's AclOperation
# codes; WRITE is code 4. The broker leaves the field at int32's minimum when not asked.
ACL_WRITE_BIT = 1 << 4
OPERATIONS_UNKNOWN = -2147483648

# DescribeConfigs' resource type of a topic (Java's ConfigResource.Type.TOPIC).
TOPIC_RESOURCE = 2
MAX_MESSAGE_BYTES = "max.message.bytes"


class Metadata:
    """What the producer knows about the cluster."""

    def __init__(self, max_age_ms: int, refresh_backoff_ms: int, max_idle_ms: int = 300_000, *,
                 clock: Clock = now_ms) -> None:
        self._max_age_ms = max_age_ms
        self._clock = clock  # read by wait_for_topic; the Sender passes its ``now`` to the rest
        self._refresh_backoff_ms = refresh_backoff_ms
        self._max_idle_ms = max_idle_ms
        # topic -> when a record for it was last drained or waited for (metadata.max.idle.ms)
        self._last_used: dict[str, float] = {}
        self._cond = threading.Condition()
        self.nodes: dict[int, tuple[str, int]] = {}
        # topic -> leader node per partition (-1 while a partition has none). Replaced
        # whole by each change, never changed in place: the accumulator keeps its
        # partitions grouped by leader for as long as this object is the same.
        self.leaders: dict[str, list[int]] = {}
        self.topics: set[str] = set()
        self.topic_errors: dict[str, KafkaError] = {}
        # Topics the principal may describe but not write (the broker's authorizer says so).
        self.unwritable: frozenset[str] = frozenset()
        # topic -> its max.message.bytes (the broker's message.max.bytes where the topic has
        # no override), asked once per topic with DescribeConfigs; None where it could not
        # be learnt (no DescribeConfigs right, a broker without the API).
        self.message_limits: dict[str, int | None] = {}
        self.limits_wanted: set[str] = set()  # topics whose limit a caller waits for
        # topic -> monotonic time of the first of the answers in a row that said it is unknown
        self._unknown_since: dict[str, float] = {}
        self.version = 0
        self._need_update = True
        self._last_refresh_ms = 0.0  # when the last response was applied (now_ms)
        self._last_attempt_ms = -1e18

    # -- readers --------------------------------------------------------------

    def partition_count(self, topic: str) -> int | None:
        leaders = self.leaders.get(topic)
        return len(leaders) if leaders else None

    def writable(self, topic: str) -> bool:
        """False once the brokers said the principal may not write ``topic`` (true where
        they did not say: no authorizer, or a broker before Metadata v8)."""
        return topic not in self.unwritable

    def leader(self, tp: tuple[str, int]) -> int | None:
        leaders = self.leaders.get(tp[0])
        if leaders is None or tp[1] >= len(leaders):
            return None
        node = leaders[tp[1]]
        return node if node >= 0 else None

    def describe_leader(self, tp: tuple[str, int]) -> str:
        """The broker a partition's records wait for, in words, for error messages: which
        one to look at when they time out."""
        leader = self.leader(tp)
        if leader is None:
            return "the partition has no known leader"
        host, port = self.nodes.get(leader, ("unknown host", "?"))
        return f"its leader is broker {leader} at {host}:{port}"

    def available_partitions(self, topic: str) -> list[int]:
        return [p for p, node in enumerate(self.leaders.get(topic, ())) if node >= 0]

    def wait_for_topic(self, topic: str, max_block_ms: float, wakeup: Callable[[], None],
                       fatal: Callable[[], Exception | None] = lambda: None) -> int:
        """Partition count of ``topic``, fetching metadata and waiting up to max.block.ms;
        ``fatal()`` returning an error (failed authentication) ends the wait with it, and
        a topic the brokers kept answering unknown for UNKNOWN_TOPIC_GRACE_MS ends it with
        UnknownTopicError."""
        deadline = self._clock() + max_block_ms
        with self._cond:
            while True:
                count = self.partition_count(topic)
                if count:
                    return count
                failure = fatal()
                if failure is not None:
                    raise failure
                error = self.topic_errors.get(topic)
                if isinstance(error, _FATAL_TOPIC_ERRORS):
                    raise type(error)(f"topic {topic!r}: {error.message or error.name}")
                since = self._unknown_since.get(topic)
                if since is not None and self._last_refresh_ms - since >= UNKNOWN_TOPIC_GRACE_MS:
                    raise UnknownTopicError(f"topic {topic!r} does not exist (answered UNKNOWN_TOPIC_OR_PARTITION "
                                            f"for {UNKNOWN_TOPIC_GRACE_MS} ms)")
                if topic not in self.topics:
                    self.topics.add(topic)
                    # As Java's requestUpdateForNewTopics: a topic not asked for yet is asked
                    # for at once, not after retry.backoff.ms from the last request (the
                    # producer's first one, without topics, at start-up): 100 ms on every
                    # new producer's first send.
                    self._last_attempt_ms = -1e18
                self._last_used[topic] = self._clock()
                self._need_update = True
                wakeup()
                remaining = deadline - self._clock()
                if remaining <= 0:
                    detail = f" (last error: {error.name})" if error is not None else ""
                    raise KafkaTimeoutError(
                        f"topic {topic!r} not present in metadata after {max_block_ms:.0f} ms (max.block.ms){detail}")
                self._cond.wait(min(remaining / 1000.0, 0.1))

    def wait_for_message_limit(self, topic: str, max_block_ms: float, wakeup: Callable[[], None],
                               fatal: Callable[[], Exception | None] = lambda: None) -> int | None:
        """``topic``'s max.message.bytes (None where the brokers would not say), asking
        the Sender for it and waiting up to max.block.ms the first time only."""
        limits = self.message_limits
        if topic in limits:
            return limits[topic]
        deadline = self._clock() + max_block_ms
        with self._cond:
            while topic not in limits:
                failure = fatal()
                if failure is not None:
                    raise failure
                self.limits_wanted.add(topic)
                wakeup()
                remaining = deadline - self._clock()
                if remaining <= 0:
                    raise KafkaTimeoutError(f"the settings of topic {topic!r} (DescribeConfigs) not known after "
                                            f"{max_block_ms:.0f} ms (max.block.ms)")
                self._cond.wait(min(remaining / 1000.0, 0.1))
            return limits[topic]

    # -- the sender thread ----------------------------------------------------

    def set_message_limits(self, limits: dict[str, int | None]) -> None:
        """Learnt limits (see ``message_limits``); wakes the threads waiting for them."""
        with self._cond:
            self.message_limits.update(limits)
            self.limits_wanted.difference_update(limits)
            self._cond.notify_all()

    def request_update(self) -> None:
        self._need_update = True

    def due_in_ms(self, now: float) -> float:
        """0 if a refresh should be sent now, else how long until one is due."""
        since_attempt = now - self._last_attempt_ms
        if since_attempt < self._refresh_backoff_ms:
            return self._refresh_backoff_ms - since_attempt
        if self._need_update:
            return 0.0
        return max(0.0, self._last_refresh_ms + self._max_age_ms - now)

    def touch(self, topics: Iterable[str], now: float) -> None:
        """Records of ``topics`` were just sent (once per request: not per record)."""
        for topic in topics:
            self._last_used[topic] = now

    def request_body(self, now: float) -> MetadataRequest:
        """The next Metadata request: the topics used within metadata.max.idle.ms. A topic
        idle longer is forgotten, as Java's producer does, so that a job writing to many
        topics over time does not ask for all of them forever; its next record fetches
        its metadata again."""
        # Under the lock: a task's thread adds its topics (wait_for_topic) while the Sender
        # reads them here; iterating the set as it grows killed the Sender thread (break 57).
        with self._cond:
            self._last_attempt_ms = now
            idle = {t for t in self.topics if now - self._last_used.get(t, now) > self._max_idle_ms}
            if idle:
                self.topics -= idle
                self.leaders = {t: v for t, v in self.leaders.items() if t not in idle}
                for topic in idle:
                    self._last_used.pop(topic, None)
                    self.topic_errors.pop(topic, None)
                    self.message_limits.pop(topic, None)  # asked again on its next use
            names = sorted(self.topics)
        if idle:
            log.debug("metadata: forgetting topics idle past metadata.max.idle.ms: %s", sorted(idle))
        return MetadataRequest(topics=[MetadataRequestTopic(name=t) for t in names], allow_auto_topic_creation=True)

    @staticmethod
    def ask_operations(body: MetadataRequest, version: int | None) -> MetadataRequest:
        """``body`` asking for each topic's authorized operations where the version has
        the field (v8 on): a topic the principal may not write is then known before a
        record is sent to it."""
        body.include_topic_authorized_operations = version is not None and version >= 8
        return body

    def update(self, body: MetadataResponse, now: float) -> None:
        """Apply a Metadata response."""
        nodes = {b.node_id: (b.host, b.port) for b in body.brokers}
        leaders: dict[str, list[int]] = dict(self.leaders)
        errors: dict[str, KafkaError] = {}
        unwritable = set()
        need_update = False
        received = now
        for topic in body.topics:
            name = topic.name or ""  # null only for a topic asked for by id, which kprod does not do
            error = error_for_code(topic.error_code, f"metadata for topic {name!r}")
            if error is not None:
                errors[name] = error
                leaders.pop(name, None)
                need_update = need_update or error.retriable
                continue
            parts = sorted(topic.partitions, key=lambda p: p.partition_index)
            leader_list = [-1] * len(parts)
            for p in parts:
                leader_list[p.partition_index] = p.leader_id if p.error_code == NO_ERROR or p.leader_id >= 0 else -1
                if leader_list[p.partition_index] < 0:
                    need_update = True
            leaders[name] = leader_list
            ops = topic.topic_authorized_operations
            if ops != OPERATIONS_UNKNOWN and not ops & ACL_WRITE_BIT:
                unwritable.add(name)
        unknown = {name: self._unknown_since.get(name, received)
                   for name, error in errors.items() if isinstance(error, UnknownTopicOrPartitionError)}
        with self._cond:
            self.nodes = nodes
            self.leaders = leaders
            self.topic_errors = errors
            self.unwritable = frozenset(unwritable)
            self._unknown_since = unknown
            self._last_refresh_ms = received
            self.version += 1
            self._need_update = need_update
            self._cond.notify_all()
        log.debug("metadata v%s: %s brokers, topics %s", self.version, len(nodes), sorted(leaders))

    def failed_update(self, now: float) -> None:
        self._need_update = True
