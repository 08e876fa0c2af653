"""Whether a process still runs: a pid plus, where /proc has it, its start time, since pids are
reused. The rule and its test vectors: docs/spec/liveness.md, test/vectors/liveness.json."""

from __future__ import annotations

import os
from typing import Any, Optional


def start_time_from_stat(line: str) -> Optional[str]:
    """Field 22 of a /proc/<pid>/stat line, counted after the command name's last ')'."""
    close = line.rfind(")")
    if close < 0:
        return None
    fields = line[close + 2 :].rstrip("\n").split(" ")
    return fields[19] if len(fields) > 19 else None


def start_time_of(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat", encoding="latin-1") as f:
            return start_time_from_stat(f.read())
    except OSError:
        return None


def is_process_alive(pid: Any, start_time: Optional[str] = None) -> bool:
    # bool is an int to Python; True is no pid.
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        pass  # it exists, as another user's process
    except OSError:
        return False
    return start_time is None or start_time_of(pid) == start_time
