"""An httpx transport whose new TCP connections are each proved accepted by this user's listener before anything is
sent on them (:func:`~ddslurm.runtime._listeners.check_own_peer`): the controller's readiness and liveness probes,
as :mod:`ddslurm.runtime._peer_connector` is the proxy's.

The probes looked at a port's listener (:func:`~ddslurm.runtime._listeners.check_own_listener`) and then connected:
a replica that died between the two left its port to whoever bound it next, and the next probe (``/v1/models``,
with the attempt's token) went there. httpx takes no network backend of its own; its transport's connection pool
(httpcore's) does, and this one checks the accepting end of every connection it opens and closes one that is not
this user's unused.
"""

from __future__ import annotations

from collections.abc import Iterable

import httpcore
import httpx

from ddslurm.runtime._listeners import NothingListensError, check_own_peer


class OwnPeerBackend(httpcore.SyncBackend):
    """httpcore's blocking backend, whose new TCP connection another user's listener accepted raises
    :class:`~ddslurm.runtime._listeners.ListenerNotOursError` (closed, nothing sent on it), and one that no socket
    of this node accepted (it closed as it was made) is a failed connection (``httpcore.ConnectError``)."""

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        stream = super().connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )
        try:
            sock = stream.get_extra_info("socket")
            local, peer = sock.getsockname(), sock.getpeername()
        except OSError as exc:  # not connected any more: nothing was sent on it
            stream.close()
            raise httpcore.ConnectError(str(exc)) from None
        try:
            check_own_peer(local, peer)
        except NothingListensError as exc:
            stream.close()
            raise httpcore.ConnectError(exc.message) from None
        except BaseException:  # another user's (ListenerNotOursError), or the kernel's tables unreadable: unused
            stream.close()
            raise
        return stream


def own_peer_transport() -> httpx.HTTPTransport:
    """httpx's transport (plain HTTP to this allocation's listeners) whose every new TCP connection is proved this
    user's: another user's listener raises :class:`~ddslurm.runtime._listeners.ListenerNotOursError` from the
    request, before it is sent. httpx's transport builds its httpcore pool itself, with no backend to give: its
    pool is replaced by one with httpx's default limits and :class:`OwnPeerBackend` (``_pool``, httpx 0.28's; the
    stale-look test of ``test_listeners`` fails if a release stops using it)."""
    transport = httpx.HTTPTransport()
    transport._pool = httpcore.ConnectionPool(  # httpx's default limits
        max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0, network_backend=OwnPeerBackend()
    )
    return transport
