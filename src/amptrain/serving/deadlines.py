"""A deadline on a request's headers, which uvicorn does not have: a client that opens a
connection and sends its request line and headers a byte at a time (or not at all) would
hold the connection, and a worker's file descriptor, for as long as it likes.

    config = uvicorn.Config(app, http=with_header_deadline(10.0))

uvicorn's own keep-alive timeout closes a connection idle after an answer; it stops at the
first byte of the next request. The deadline here runs from a connection's opening, and
from each answer, until the request's headers are whole (uvicorn has then started the
request's cycle); the body has its own deadline (`server.read_body`).
"""

from uvicorn.protocols.http.h11_impl import H11Protocol


def with_header_deadline(seconds):
    """uvicorn's HTTP/1.1 protocol class, closing a connection whose request headers have not
    all come within `seconds`."""

    class HeaderDeadline(H11Protocol):
        _deadline = None

        def connection_made(self, transport):
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self):
            self._arm()  # before: a pipelined request's headers, handled inside, disarm it
            super().on_response_complete()

        def handle_events(self):
            before = self.cycle
            super().handle_events()
            if self.cycle is not before:  # a request's headers came whole
                self._disarm()

        def connection_lost(self, exc):
            self._disarm()
            super().connection_lost(exc)

        def _arm(self):
            self._disarm()
            self._deadline = self.loop.call_later(seconds, self._late)

        def _disarm(self):
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _late(self):
            self._deadline = None
            waiting = self.cycle is None or self.cycle.response_complete
            if waiting and not self.transport.is_closing():
                self.transport.close()

    return HeaderDeadline
