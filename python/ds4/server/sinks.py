"""Where a job's response goes. The worker writes through a sink and learns from it whether the
client is still there (a failed write, or ``failed`` set on a disconnect, stops the job).

* :class:`Sink`: raw HTTP/1.1 bytes to a byte writer (tests drive the worker with it);
* :class:`QueueSink`: messages to the ASGI request coroutine over its event loop (the server).
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from . import shapes

__all__ = ["Sink", "QueueSink"]


class Sink:
    """Where a job's response goes: a byte writer plus the HTTP framing upstream uses.

    ``write`` is any callable that sends all bytes or raises OSError. After the first failed write
    the sink is dead and every later send returns False (the worker then stops the job)."""

    def __init__(self, write: Callable[[bytes], Any], api: str = "openai") -> None:
        self._write = write
        self.api = api  # error bodies take this API's shape
        self.headers_sent = False
        self.failed = False

    def send(self, data: bytes) -> bool:
        if self.failed:
            return False
        try:
            self._write(data)
            return True
        except (OSError, ValueError):
            self.failed = True
            return False

    def response(self, status: int, body: bytes = b"", content_type: str | None = "application/json") -> bool:
        reason = {200: "OK", 204: "No Content", 400: "Bad Request", 404: "Not Found", 409: "Conflict",
                  500: "Internal Server Error"}.get(status, "Error")
        head = f"HTTP/1.1 {status} {reason}\r\nContent-Length: {len(body)}\r\n"
        if content_type:
            head += f"Content-Type: {content_type}\r\n"
        head += "Connection: close\r\n\r\n"
        self.headers_sent = True
        return self.send(head.encode() + body)

    def error(self, status: int, message: str, param: str | None = None, code: str | None = None) -> bool:
        return self.response(status, shapes.error_body(message, self.api, status, param, code))

    def sse_headers(self) -> bool:
        if self.headers_sent:
            return True
        self.headers_sent = True
        head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n"
        return self.send(head.encode())

    def close(self) -> None:
        """The job is over (nothing more will be sent)."""


class QueueSink:
    """A job's response, written by the worker thread and read by the request's coroutine.

    Items: ``("full", status, body, content_type)`` for a whole response, ``("sse",)`` for the
    head of an event stream, ``("data", bytes)`` for stream bytes, ``("end",)`` once the job is
    over. ``cancel()`` (the client went away) makes every later write return False, which is how
    the worker learns to stop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, api: str = "openai") -> None:
        self._loop = loop
        self._queue: asyncio.Queue = asyncio.Queue()
        self.api = api
        self.headers_sent = False
        self.failed = False

    def _put(self, item: tuple, force: bool = False) -> bool:
        if self.failed and not force:
            return False
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.failed = True
            return False
        return True

    def send(self, data: bytes) -> bool:
        return self._put(("data", data))

    def response(self, status: int, body: bytes = b"", content_type: str | None = "application/json") -> bool:
        self.headers_sent = True
        return self._put(("full", status, body, content_type))

    def error(self, status: int, message: str, param: str | None = None, code: str | None = None) -> bool:
        return self.response(status, shapes.error_body(message, self.api, status, param, code))

    def sse_headers(self) -> bool:
        if self.headers_sent:
            return not self.failed
        self.headers_sent = True
        return self._put(("sse",))

    def close(self) -> None:
        self._put(("end",), force=True)

    def cancel(self) -> None:
        self.failed = True

    async def get(self) -> tuple:
        return await self._queue.get()
