"""A switch between versions made ready and not yet done (issue 31): what both mappings
(cuda.py, host.py) hand from ``prepare_remap`` to ``finish_remap``."""

from __future__ import annotations

from typing import Any, Dict, List


class PreparedRemap:
    """``state``: the new version's get_state reply. ``held``: by segment, what was made ready
    for each segment that changes (cuda: the imported allocation's handle; host: the new memfd
    mapped aside). ``skipped``: how many segments are the same memory in both versions and stay
    mapped as they are. ``against``: the state the mapping had when it was prepared, which the
    changed segments were computed from (a mapping that switched since refuses it)."""

    def __init__(self, mapping: Any, state: Dict[str, Any], skipped: int):
        self.mapping, self.state, self.skipped = mapping, state, skipped
        self.against = mapping.state
        self.held: Dict[int, Any] = {}

    @property
    def segments(self) -> List[int]:
        """The segments it will remap."""
        return sorted(self.held)

    def discard(self) -> None:
        """Gives back what it holds (a switch that will not happen); idempotent."""
        self.mapping.discard(self)
