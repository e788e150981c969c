"""Coordinators: which node coordinates a transactional id or a group, found with
FindCoordinator and kept until a request to it says it moved.

One lookup for the two clients of coordinators: the TransactionManager (whose requests
the Sender sends) and the AdminClient. Each keeps its own instance beside its own
network client; one thread uses it at a time (the one doing that client's I/O).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeVar

from spark_sink.client.connections import ClientResponse
from spark_sink.protocol.apis import ApiKey
from spark_sink.protocol.error_codes import CoordinatorNotAvailableError, KafkaConnectionError, NotCoordinatorError
from spark_sink.protocol.kmsg import FindCoordinatorResponse
from spark_sink.protocol.schema import Request
from spark_sink.protocol.txn_coordinator import coordinator_error, find_coordinator_body

# The coordinator a request went to is not (or no longer) the one: find it again.
COORDINATOR_MOVED = (NotCoordinatorError, CoordinatorNotAvailableError, KafkaConnectionError)

Reply = TypeVar("Reply")


class Client(Protocol):
    """What a lookup needs of the network client (NetworkClient, or a scripted one)."""

    def ready(self, node_id: int, now: float) -> bool: ...
    def connection_failed(self, node_id: int) -> bool: ...
    def least_loaded_node(self, now: float) -> int | None: ...
    def send(self, node_id: int, api_key: int, body: Request[Reply],
             callback: Callable[[ClientResponse[Reply]], None] | None, expect_response: bool = True,
             max_version: int | None = None) -> None: ...
    def set_nodes(self, nodes: Mapping[int, tuple[str, int]]) -> None: ...


class Coordinators:
    """Coordinator node ids by (key type, key): TRANSACTION_COORDINATOR with a
    transactional id, GROUP_COORDINATOR with a group id."""

    def __init__(self) -> None:
        self._nodes: dict[tuple[int, str], int] = {}
        self._finding: set[tuple[int, str]] = set()  # FindCoordinator in flight for these

    def node(self, client: Client, key_type: int, key: str, now: float) -> int | None:
        """The coordinator's node id, if known. One whose connection failed is forgotten,
        to be found again, as Java's Sender does: its node may have died, and the new
        leader of its log taken over. Its connection is tried again first (once the
        reconnect backoff allows): a node whose connection broke earlier, when it died or
        was cut off, may be back and coordinating now, and nothing else may ever reconnect
        it (the other nodes answer FindCoordinator, its partitions may lead elsewhere)."""
        node = self._nodes.get((key_type, key))
        if node is not None and not client.ready(node, now) and client.connection_failed(node):
            del self._nodes[(key_type, key)]
            return None
        return node

    def find(self, client: Client, key_type: int, key: str, now: float,
             on_found: Callable[[Exception | None], None]) -> bool:
        """Ask any ready node for the coordinator of ``key`` (once at a time per key); the
        answer goes to ``on_found``: None once :meth:`node` knows it, else the error.
        Whether a FindCoordinator for ``key`` is in flight (False: no node is ready yet)."""
        if (key_type, key) in self._finding:
            return True
        any_node = client.least_loaded_node(now)
        if any_node is None or not client.ready(any_node, now):
            return False
        self._finding.add((key_type, key))
        client.send(any_node, ApiKey.FIND_COORDINATOR, find_coordinator_body(key_type, key),
                    lambda r: self._found(client, key_type, key, r, on_found))
        return True

    def _found(self, client: Client, key_type: int, key: str, response: ClientResponse[FindCoordinatorResponse],
               on_found: Callable[[Exception | None], None]) -> None:
        self._finding.discard((key_type, key))
        error = response.error
        if error is None:
            body = response.reply()
            error = coordinator_error(body, key)
        if error is None:
            node = body.node_id
            client.set_nodes({node: (body.host, body.port)})
            self._nodes[(key_type, key)] = node
        on_found(error)

    def failed(self, key_type: int, key: str, error: Exception) -> None:
        """A request to the coordinator of ``key`` failed with ``error``: if that says it
        moved (or is unreachable), it is found again before the next attempt."""
        if isinstance(error, COORDINATOR_MOVED):
            self._nodes.pop((key_type, key), None)
