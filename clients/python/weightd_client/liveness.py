"""Whether a process still runs: a pid plus, where /proc has it, its start time, since pids are
reused; a zombie (exited, not yet reaped) is not running. The rule and its test vectors:
docs/spec/liveness.md, test/vectors/liveness.json."""

from __future__ import annotations

import os
from typing import Any, List, Optional

# States of a process that has exited: Z, a zombie its parent has not reaped; X, dead.
EXITED_STATES = frozenset({"Z", "X"})


def _fields_after_name(line: str) -> Optional[List[str]]:
    """Fields 3, 4, ... of a /proc/<pid>/stat line, counted after the command name's last ')'."""
    close = line.rfind(")")
    if close < 0:
        return None
    return line[close + 2 :].rstrip("\n").split(" ")


def start_time_from_stat(line: str) -> Optional[str]:
    """Field 22 of a /proc/<pid>/stat line."""
    fields = _fields_after_name(line)
    return fields[19] if fields is not None and len(fields) > 19 else None


def state_from_stat(line: str) -> Optional[str]:
    """Field 3 of a /proc/<pid>/stat line, the process state (R, S, D, Z, ...)."""
    fields = _fields_after_name(line)
    return fields[0] if fields and fields[0] else None


def _read_stat(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat", encoding="latin-1") as f:
            return f.read()
    except OSError:
        return None


def start_time_of(pid: int) -> Optional[str]:
    line = _read_stat(pid)
    return None if line is None else start_time_from_stat(line)


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
    line = _read_stat(pid)
    if line is not None and state_from_stat(line) in EXITED_STATES:
        return False
    return start_time is None or (line is not None and start_time_from_stat(line) == start_time)
