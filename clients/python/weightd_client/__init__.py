"""weightd_client: attach to a running weightd (the per-node GPU weight cache daemon).

See docs/protocol.md in the weightd repository for the wire protocol.
"""

from .client import Attached, Mismatch, WeightdClient, default_socket_dir, find_socket
from .protocol import PROTOCOL_VERSION, ProtocolError, ServeError, WeightdError

__all__ = [
    "Attached",
    "Mismatch",
    "WeightdClient",
    "default_socket_dir",
    "find_socket",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "ServeError",
    "WeightdError",
]
