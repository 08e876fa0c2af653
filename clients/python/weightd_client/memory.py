"""How much of a device weightd holds, for an engine's own memory budget (its KV cache)."""

from __future__ import annotations

from typing import Optional

from .client import WeightdClient, find_socket
from .protocol import ProtocolError


def get_memory(global_rank: Optional[int] = None, device_uuid: Optional[str] = None, socket_dir: Optional[str] = None, socket_path: Optional[str] = None) -> int:
    """Bytes the daemon holds on the rank's device, from ``stats``: every version of every model
    it serves there (a written version's segments shared with its base counted once) and the
    processed layouts engines published beside them (``heldBytes``); from a daemon before it,
    the rank's current version's segments (``deviceBytes``; 0 once released).

    Name the rank, the device (its UUID, ``GPU-...``) or the socket. Raises ServeError
    (E_NO_SOCKET, E_CONNECT) when no daemon serves it: then weightd holds nothing there.
    """
    path = socket_path or find_socket(global_rank=global_rank, device_uuid=device_uuid, socket_dir=socket_dir)
    with WeightdClient(path) as client:
        stats = client.stats()
    held = stats.get("heldBytes", stats.get("deviceBytes"))
    if not isinstance(held, int) or isinstance(held, bool) or held < 0:
        raise ProtocolError("E_NO_DEVICE_BYTES", f"weightd at {path} does not report deviceBytes in stats (a daemon older than it); upgrade it, or count its segments' bytes from get_state")
    return held
