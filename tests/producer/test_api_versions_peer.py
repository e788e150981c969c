"""Bootstrap through a peer that refuses ApiVersions v3 the way librdkafka's mock cluster
does (UNSUPPORTED_VERSION in v3's layout), then hands the connection to Apache Kafka."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator

import pytest

from kprod_broker import KafkaCluster
from spark_sink.producer import KafkaProducer, ProducerRecord
from tests.brokers import consume_all, unique_topic

API_VERSIONS = 18
UNSUPPORTED_VERSION = 35


def _read_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return data


def _refusal_v3(correlation_id: int) -> bytes:
    """UNSUPPORTED_VERSION in ApiVersions v3's layout, listing ApiVersions 0-2: error_code,
    compact array (length + 1) of (api_key, min, max, tags), throttle_time_ms, tags."""
    body = struct.pack(">ih", correlation_id, UNSUPPORTED_VERSION) + b"\x02" + struct.pack(
        ">hhh", API_VERSIONS, 0, 2) + b"\x00" + struct.pack(">i", 0) + b"\x00"
    return struct.pack(">i", len(body)) + body


class RefusingPeer:
    """Answers each connection's first request, if it is ApiVersions above v2, itself;
    pipes everything else to ``upstream``. ``refused`` counts the refusals."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.refused = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._socks: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._socks.append(client)
        try:
            head = _read_exact(client, 4)
            frame = _read_exact(client, struct.unpack(">i", head)[0])
            api_key, version, correlation_id = struct.unpack_from(">hhi", frame)
            if api_key == API_VERSIONS and version > 2:
                self.refused += 1
                client.sendall(_refusal_v3(correlation_id))
                first = b""
            else:
                first = head + frame
            server = socket.create_connection(self.upstream)
            self._socks.append(server)
            server.sendall(first)
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()
            self._pipe(client, server)
        except OSError:
            client.close()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                sock.close()

    def close(self) -> None:
        for sock in self._socks:
            sock.close()


@pytest.fixture
def refusing_peer(kafka: KafkaCluster) -> Iterator[RefusingPeer]:
    host, port = kafka.bootstrap.split(",")[0].rsplit(":", 1)
    peer = RefusingPeer((host, int(port)))
    yield peer
    peer.close()


def test_bootstraps_through_a_peer_refusing_api_versions_v3_in_v3_layout(kafka: KafkaCluster,
                                                                         refusing_peer: RefusingPeer) -> None:
    topic = unique_topic("apiv")
    config = {"bootstrap.servers": f"127.0.0.1:{refusing_peer.port}", "max.block.ms": 20000}
    with KafkaProducer(config) as producer:
        assert producer.send(ProducerRecord(topic, b"through the peer")).result(30).offset >= 0
    assert refusing_peer.refused >= 1
    assert [m.value() for m in consume_all(kafka.bootstrap, topic, 1)] == [b"through the peer"]
