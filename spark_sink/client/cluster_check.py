"""One look at the cluster before anything is sent: can a broker be reached and
authenticated with, and do the topics exist? For a caller (the Spark driver) that wants a
clear error at once rather than a timeout per task: one Metadata request, on the calling
thread, over its own NetworkClient."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from spark_sink.client.clock import Clock, now_ms
from spark_sink.client.config import ClientConfig
from spark_sink.client.connections import ClientResponse
from spark_sink.client.errors import BrokersUnreachableError, UnknownTopicError
from spark_sink.client.metadata import UNKNOWN_TOPIC_GRACE_MS
from spark_sink.client.network import NetworkClient
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import (
    NO_ERROR,
    LeaderNotAvailableError,
    UnknownTopicOrPartitionError,
    failure_for_code,
)
from spark_sink.protocol.kmsg import MetadataRequest, MetadataRequestTopic, MetadataResponse

# Errors of a topic that exists (or is being created on first use): a write would go on.
_TOPIC_EXISTS = frozenset({NO_ERROR, LeaderNotAvailableError.code})

# A topic is unknown only if it still is when asked again over this long (see metadata).
_UNKNOWN_TOPIC_GRACE_MS = UNKNOWN_TOPIC_GRACE_MS


def bootstrap_text(config: ClientConfig) -> str:
    """The bootstrap servers as the user wrote them, for error messages."""
    return ",".join(f"{host}:{port}" for host, port in config.bootstrap_servers)


def unknown_topic_message(topic: str, config: ClientConfig, waited: str | None = None) -> str:
    """The error text for a topic the cluster does not have (the same from the producer
    and from the check)."""
    after = f" (waited {waited})" if waited else ""
    return (f"topic {topic!r} does not exist on the cluster at {bootstrap_text(config)}{after}: create it "
            "first, or enable auto.create.topics.enable on the brokers")


def check_cluster(config: Mapping[str, Any] | ClientConfig, topics: Iterable[str], timeout_ms: float, *,
                  clock: Clock = now_ms) -> dict[str, int]:
    """The partition count of each of ``topics`` (0 for one being created, whose
    partitions have no leader yet), from one Metadata request that may create topics where
    the brokers allow it, as the producer's own requests do (asked again for up to 2 s
    while a topic is unknown: it may be being created).

    Raises, without retrying what cannot change by waiting: BrokersUnreachableError once
    every bootstrap address failed (or ``timeout_ms`` passed), naming
    each and what happened; SslAuthenticationError or SaslAuthenticationError;
    UnknownTopicError; the broker's error for a topic (TopicAuthorizationFailedError, ...).
    """
    config = ClientConfig.of(config)
    topics = list(dict.fromkeys(topics))
    deadline = clock() + timeout_ms
    grace_end = min(deadline, clock() + _UNKNOWN_TOPIC_GRACE_MS)
    client = NetworkClient(config, clock=clock)
    try:
        while True:
            response = _metadata(client, config, topics, deadline, timeout_ms, clock)
            if clock() >= grace_end or all(
                    t.error_code != UnknownTopicOrPartitionError.code for t in response.topics):
                break
            client.poll(config.retry_backoff_ms)
    finally:
        client.close()
    counts = {}
    for entry in response.topics:
        name, code = entry.name or "", entry.error_code
        if code == UnknownTopicOrPartitionError.code:
            raise UnknownTopicError(unknown_topic_message(name, config))
        if code not in _TOPIC_EXISTS:
            raise failure_for_code(code, f"topic {name!r} on the cluster at {bootstrap_text(config)}")
        counts[name] = len(entry.partitions)
    return counts


def _metadata(client: NetworkClient, config: ClientConfig, topics: list[str], deadline: float,
              timeout_ms: float, clock: Clock) -> MetadataResponse:
    """The Metadata response for ``topics`` from whichever bootstrap server is up first:
    every address is tried at once, so one dead address costs no time."""
    body = MetadataRequest(topics=[MetadataRequestTopic(name=t) for t in topics], allow_auto_topic_creation=True)
    answers: list[ClientResponse[MetadataResponse]] = []
    sent = False
    nodes = client.bootstrap_nodes()
    while True:
        now = clock()
        if client.authentication_error is not None:
            raise client.authentication_error
        if answers:
            if answers[0].error is None:
                return answers[0].reply()
            answers.clear()  # the connection broke before the answer: ask again
            sent = False
        if not sent:
            ready = [n for n in nodes if client.ready(n, now)]  # starts connecting where none is
            if ready:
                client.send(ready[0], ApiKey.METADATA, body, answers.append)
                sent = True
            elif all(client.connection_failed(n) for n in nodes):
                raise BrokersUnreachableError(
                    f"cannot reach any bootstrap server of {bootstrap_text(config)}: {client.describe_bootstrap()}")
        if now >= deadline:
            raise BrokersUnreachableError(
                f"no broker of {bootstrap_text(config)} answered within {timeout_ms:.0f} ms: "
                f"{client.describe_bootstrap()}")
        client.poll(min(50.0, deadline - now))
