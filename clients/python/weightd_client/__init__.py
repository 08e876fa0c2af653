"""weightd_client: attach to a running weightd (the per-node GPU weight cache daemon).

See docs/protocol.md in the weightd repository for the wire protocol.
"""

from .client import Attached, Mismatch, WeightdClient, default_socket_dir, find_socket
from .fingerprint import ExpectedFingerprint, FingerprintError, expected_fingerprint
from .memory import get_memory
from .protocol import PROTOCOL_VERSION, ProtocolError, ServeError, WeightdError
from .torch_load import LoadResult, load_into

__all__ = [
    "Attached",
    "Mismatch",
    "WeightdClient",
    "default_socket_dir",
    "ExpectedFingerprint",
    "FingerprintError",
    "expected_fingerprint",
    "find_socket",
    "get_memory",
    "LoadResult",
    "load_into",
    "PROTOCOL_VERSION",
    "ProtocolError",
    "ServeError",
    "WeightdError",
]
