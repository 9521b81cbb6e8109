"""A TCP connection pool that proves each new connection accepted by this user's listener before anything is sent on
it (:func:`~ddslurm.runtime._listeners.check_own_peer`).

Looking at a port's listener before connecting (:func:`~ddslurm.runtime._listeners.check_own_listener`) leaves a
window: a replica that dies between the look and the connection frees its port, another user on the node binds it,
and the connection (with the attempt's token in its first request) goes to them. A sampling of the proxy's
``/metrics`` scrape under a busy CPU did exactly that. The kernel attributes the accepting end of a connection to
the listener's owner, so the connection itself is checked once it is made, and closed unused when it is not this
user's: the pool never hands it out.
"""

from __future__ import annotations

import errno

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.tracing import Trace

from ddslurm.runtime._listeners import ListenerNotOursError, NothingListensError, check_own_peer


class _NotOurs(OSError):
    """What aiohttp's :class:`aiohttp.ClientConnectorError` carries for a new connection accepted by another user's
    listener, or by no socket of this node (closed, nothing sent on it): ``failure``, the check's own error (a
    :class:`~ddslurm.runtime._listeners.NothingListensError` for the second). Read it with :func:`disowned`."""

    def __init__(self, failure: ListenerNotOursError) -> None:
        super().__init__(errno.EACCES, failure.message)
        self.failure = failure


def disowned(exc: BaseException) -> ListenerNotOursError | None:
    """The check's error when ``exc`` is a request's failure because its new connection was not this user's."""
    if isinstance(exc, aiohttp.ClientConnectorError) and isinstance(exc.os_error, _NotOurs):
        return exc.os_error.failure
    return None


class OwnPeerConnector(aiohttp.TCPConnector):
    """:class:`aiohttp.TCPConnector` whose new connections are each proved this user's before the pool uses them
    (a failure is the request's :class:`aiohttp.ClientConnectorError`: :func:`disowned` reads it)."""

    async def _create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> ResponseHandler:
        handler = await super()._create_connection(req, traces, timeout)
        transport = handler.transport
        try:
            if transport is None:
                raise NothingListensError("the connection closed as it was made; nothing was sent on it")
            check_own_peer(transport.get_extra_info("sockname"), transport.get_extra_info("peername"))
        except ListenerNotOursError as exc:
            handler.close()
            raise aiohttp.ClientConnectorError(req.connection_key, _NotOurs(exc)) from None
        return handler
