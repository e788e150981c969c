"""A fault-injecting TCP proxy for tests: cut connections, add delay, stall traffic.

It forwards bytes unchanged between clients and one target. Put it in front of a broker
whose advertised address is the proxy's (a Kafka ``Listener`` with ``advertised_port``) and
every connection a client makes, bootstrap and leader alike, goes through it. It also
counts the requests clients send through it by API key, as the broker receives them.
"""

from __future__ import annotations

import collections
import contextlib
import queue
import socket
import struct
import threading
import time
from collections.abc import Iterator


class FaultProxy:
    """Forward 127.0.0.1:``port`` to ``target``, with faults switched on by the test."""

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self._target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._delay_s = (0.0, 0.0)  # client to broker, broker to client
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = False
        self.connections_accepted = 0
        self.connections_cut = 0
        self.closed_by_target = 0  # connections the target ended first (not the client, not a cut)
        self._reset_next = 0
        self.connections_reset = 0  # connections reset on arrival (reset_next)
        self._ended: set[socket.socket] = set()  # client sockets of connections one side ended
        self._cut = threading.Condition()
        self.requests: collections.Counter[int] = collections.Counter()  # by API key, client to broker
        threading.Thread(target=self._accept_loop, name=f"faultproxy-{self.port}", daemon=True).start()

    @property
    def open_connections(self) -> int:
        """Client connections forwarded now."""
        with self._lock:
            return len(self._pairs)

    # -- faults ---------------------------------------------------------------

    def cut_all(self) -> int:
        """Close every open connection on both sides; returns how many were cut."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for client, upstream in pairs:
            for s in (client, upstream):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        with self._cut:
            self.connections_cut += len(pairs)
            self._cut.notify_all()
        return len(pairs)

    def wait_for_cut(self, timeout: float = 10.0) -> None:
        """Block until at least one more connection has been cut (a test paces its sends
        on the cuts, so a fast run still meets several of them)."""
        with self._cut:
            before = self.connections_cut
            if not self._cut.wait_for(lambda: self.connections_cut > before, timeout):
                raise TimeoutError(f"no connection cut within {timeout} s")

    def reset_next(self, count: int) -> None:
        """Reset the next ``count`` connections as they arrive (a TCP RST, before anything
        is read or forwarded), as a restarting server or a middlebox would."""
        with self._lock:
            self._reset_next = count

    def set_delay(self, ms: float, replies_only: bool = False) -> None:
        """Deliver every forwarded chunk ``ms`` milliseconds after it arrived, as a longer
        link would: in order, without holding back the chunks behind it. With
        ``replies_only`` only the broker's side is delayed (one added round-trip latency)."""
        self._delay_s = (0.0 if replies_only else ms / 1000.0, ms / 1000.0)

    def stall(self, on: bool = True) -> None:
        """Stop (or resume) forwarding in both directions; connections stay open."""
        if on:
            self._flowing.clear()
        else:
            self._flowing.set()

    @contextlib.contextmanager
    def cutting(self, every_s: float) -> Iterator[None]:
        """Cut all connections every ``every_s`` seconds while the block runs."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every_s):
                self.cut_all()

        thread = threading.Thread(target=loop, name="faultproxy-cutter", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        """Stop accepting and cut everything."""
        self._closed = True
        self._flowing.set()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut_all()

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- forwarding -----------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                reset = self._reset_next > 0
                self._reset_next -= reset
                self.connections_reset += reset
            if reset:
                # Linger 0: close() sends RST, and the client's next read or write fails with ECONNRESET.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                client.close()
                continue
            try:
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._pairs.append((client, upstream))
            self.connections_accepted += 1
            for direction, (src, dst) in enumerate(((client, upstream), (upstream, client))):
                threading.Thread(target=self._pump, args=(src, dst, direction), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: int) -> None:
        late: queue.Queue[tuple[float, bytes] | None] = queue.Queue()
        deliverer: threading.Thread | None = None
        frames = RequestFrames(self.requests, self._lock) if direction == 0 else None
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    self._one_side_ended(src, dst, direction)
                    break
                if frames is not None:
                    frames.feed(data)
                self._flowing.wait()
                delay = self._delay_s[direction]
                if delay or deliverer is not None:
                    if deliverer is None:  # from the first delayed chunk on, all go in order through it
                        deliverer = threading.Thread(target=self._deliver_late, args=(late, dst), daemon=True)
                        deliverer.start()
                    late.put((time.monotonic() + delay, data))
                else:
                    dst.sendall(data)
        except OSError:
            pass
        finally:
            if deliverer is not None:
                late.put(None)
                deliverer.join(5)
            # One side ended: end the other too, as a real cut connection would.
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._pairs = [p for p in self._pairs if src not in p]
                self._ended.discard(src if direction == 0 else dst)

    def _one_side_ended(self, src: socket.socket, dst: socket.socket, direction: int) -> None:
        client = src if direction == 0 else dst
        with self._lock:
            if client in self._ended or not any(client in p for p in self._pairs):
                return  # the other side ended it first, or the proxy cut it
            self._ended.add(client)
            if direction == 1:
                self.closed_by_target += 1

    @staticmethod
    def _deliver_late(late: queue.Queue, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while (item := late.get()) is not None:
                due, data = item
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                dst.sendall(data)


class RequestFrames:
    """Kafka's request frames (a 4-byte size, then the request, whose header begins with
    its 2-byte API key) followed across one connection's chunks, each counted by API key.
    Only a plain Kafka listener's counts mean anything (a TLS or HTTP one's bytes are not
    these frames); a size no request can have stops the counting on that connection."""

    def __init__(self, counts: collections.Counter[int], lock: threading.Lock) -> None:
        self._counts = counts
        self._lock = lock
        self._head = b""  # the start of a frame whose size and API key are not all here yet
        self._skip = 0  # bytes of the current frame still to pass (-1: not Kafka's framing)

    def feed(self, data: bytes) -> None:
        view = memoryview(data)
        while view and self._skip >= 0:
            if self._skip:
                taken = min(self._skip, len(view))
                self._skip -= taken
                view = view[taken:]
                continue
            need = 6 - len(self._head)
            self._head += bytes(view[:need])
            view = view[need:]
            if len(self._head) == 6:
                size, api_key = struct.unpack(">ih", self._head)
                if size < 2:
                    self._skip = -1
                    return
                with self._lock:
                    self._counts[api_key] += 1
                self._skip = size - 2
                self._head = b""
