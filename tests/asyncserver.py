"""An asyncio server on an event loop of its own thread: what the test proxies listen with."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from collections.abc import Awaitable, Callable, Iterable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class BackgroundServer:
    """Listens on 127.0.0.1:``port`` (0: any free port, then in ``.port``) from construction
    until ``close()``; ``handle`` runs on the server's loop for each connection."""

    def __init__(self, handle: Handler, port: int, ssl_context: ssl.SSLContext | None, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._server = self.loop.run_until_complete(asyncio.start_server(handle, "127.0.0.1", port, ssl=ssl_context))
        self.port: int = self._server.sockets[0].getsockname()[1]
        self._thread = threading.Thread(target=self.loop.run_forever, name=f"{name}-{self.port}", daemon=True)
        self._thread.start()

    def close(self, connections: Iterable[asyncio.Task] = ()) -> None:
        """Stop listening, cancel ``connections`` (tasks of the loop) and stop the loop."""
        async def stop() -> None:
            self._server.close()
            for task in list(connections):
                task.cancel()
            await self._server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()
