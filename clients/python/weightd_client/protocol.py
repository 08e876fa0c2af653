"""The weightd serving protocol (docs/protocol.md): framing and the connection that speaks it.

This is the only module that knows the wire format. A frame is a 10-byte header, then a UTF-8
JSON payload::

    0..3  magic b"WGTD"   4..5  frame version (u16, big-endian)   6..9  payload length (u32, big-endian)

A reply may carry descriptors (get_segment_fds): SCM_RIGHTS on pieces of its frame, at most 250
per piece, each batch on the first byte of a piece of its own. Such a reply is read with recvmsg
until the frame is complete, collecting the fds of every call in order.
"""

from __future__ import annotations

import itertools
import json
import os
import select
import socket
import struct
import time
import array
import contextlib
from typing import Any, Callable, Dict, List, Optional, Tuple

MAGIC = b"WGTD"
FRAME_VERSION = 1
PROTOCOL_VERSION = 1
HEADER = struct.Struct(">4sHI")
MAX_REQUEST_BYTES = 1 << 20
MAX_RESPONSE_BYTES = 256 << 20
# The kernel's SCM_MAX_FD: no recvmsg can bring more, so the control buffer is sized for it.
MAX_FDS_PER_RECV = 253


class WeightdError(Exception):
    """Base class: every error carries a stable ``code``."""

    def __init__(self, code: str, message: str, details: Optional[Dict[str, Any]] = None):
        super().__init__(message)
        self.code = code
        self.details = details or {}


class ProtocolError(WeightdError):
    """A malformed frame or reply, or a peer that does not speak the protocol."""


class ServeError(WeightdError):
    """The daemon refused a request (its ``code``: E_LEASE_HELD, E_RELEASED, ...) or is unreachable."""


def encode_frame(message: Dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode("utf-8")
    if len(body) > MAX_REQUEST_BYTES:
        raise ProtocolError("E_FRAME_TOO_LARGE", f"request of {len(body)} bytes exceeds {MAX_REQUEST_BYTES}")
    return HEADER.pack(MAGIC, FRAME_VERSION, len(body)) + body


#: What a frame no request asked for is about (docs/protocol.md, Events).
EVENTS = ("model_ready", "model_dropping", "lease_revoked", "model_stale")


def is_event(frame: Any) -> bool:
    """Whether a frame is an event (id null, ok true, a known ``event``) rather than a reply."""
    return isinstance(frame, dict) and frame.get("id") is None and frame.get("ok") is True and frame.get("event") in EVENTS


class _ClosedBeforeReply(ServeError):
    """The connection ended before any byte of the reply: the daemon never read the request."""


def _recv_into_with_fds(sock: socket.socket, view: memoryview, fds: List[int]) -> int:
    """One recvmsg into ``view``; the descriptors that came with it are appended to ``fds``."""
    k, ancdata, flags, _addr = sock.recvmsg_into([view], socket.CMSG_SPACE(MAX_FDS_PER_RECV * array.array("i").itemsize), socket.MSG_CMSG_CLOEXEC)
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(data[: len(data) - len(data) % got.itemsize])
            fds.extend(got)
    if flags & socket.MSG_CTRUNC:
        raise ProtocolError("E_FD_RECV", f"descriptors were cut off (more than {MAX_FDS_PER_RECV} on one piece): the daemon does not batch them as the protocol says")
    return k


def _recv_exact(sock: socket.socket, n: int, deadline: float, what: str, fds: Optional[List[int]] = None) -> bytearray:
    """``n`` bytes; with ``fds``, read by recvmsg, collecting every descriptor that comes with them."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ServeError("E_TIMEOUT", f"no complete {what} from weightd in time")
        sock.settimeout(left)
        try:
            k = sock.recv_into(view[got:], n - got) if fds is None else _recv_into_with_fds(sock, view[got:], fds)
        except socket.timeout:
            continue
        if k == 0:
            cls = _ClosedBeforeReply if what == "reply header" and got == 0 else ServeError
            raise cls("E_DISCONNECTED", f"weightd closed the connection before sending the {what}")
        got += k
    return buf  # not copied into bytes: a manifest is megabytes


def read_payload(sock: socket.socket, deadline: float, max_bytes: int = MAX_RESPONSE_BYTES, fds: Optional[List[int]] = None) -> bytearray:
    """One frame's payload; with ``fds``, the descriptors it carries are appended there."""
    magic, version, length = HEADER.unpack(_recv_exact(sock, HEADER.size, deadline, "reply header", fds))
    if magic != MAGIC:
        raise ProtocolError("E_FRAME_MAGIC", f"reply does not start with b'WGTD' (got {magic!r}); not a weightd socket")
    if version != FRAME_VERSION:
        raise ProtocolError("E_FRAME_VERSION", f"frame version {version} is not supported (this client speaks {FRAME_VERSION})")
    if length > max_bytes:
        raise ProtocolError("E_FRAME_TOO_LARGE", f"reply of {length} bytes exceeds the limit of {max_bytes}")
    return _recv_exact(sock, length, deadline, "reply", fds)


def read_frame(sock: socket.socket, deadline: float, max_bytes: int = MAX_RESPONSE_BYTES, fds: Optional[List[int]] = None) -> Any:
    """One reply; with ``fds``, the descriptors it carries are appended there (the caller closes them)."""
    payload = read_payload(sock, deadline, max_bytes, fds)
    try:
        return json.loads(payload.decode("utf-8"))
    except ValueError as err:
        raise ProtocolError("E_FRAME_JSON", f"reply is not valid JSON: {err}") from err


class Connection:
    """One connection to a rank's socket: one request at a time, replies checked by id.

    The daemon closes idle connections (only ever between requests); a request that meets such
    a close before any reply byte is sent again on a new connection, which cannot apply it
    twice, since the daemon never read it.
    """

    def __init__(self, socket_path: str, timeout: float = 30.0):
        self.socket_path = socket_path
        self.timeout = timeout
        self._sock: Optional[socket.socket] = None
        self._ids = itertools.count(1)
        #: Event frames read so far and not yet taken (poll_events).
        self.events: List[Dict[str, Any]] = []
        #: Why the daemon closed the connection, when it said (E_EVENTS_NOT_READ): poll_events raises it.
        self._dropped: Optional[ServeError] = None
        #: Run before each request (WeightdClient: waits for what its retirer still lets go of).
        self.before_request: Optional[Callable[[], None]] = None

    def _open(self) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(self.timeout)
            sock.connect(self.socket_path)
            # A socket served by another user could hand us someone else's memory: refuse it.
            pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
            if uid != os.getuid():
                raise ServeError("E_PEER", f"socket {self.socket_path} is served by uid {uid} (pid {pid}), not by this user (uid {os.getuid()}); refusing it")
        except OSError as err:
            sock.close()
            raise ServeError(
                "E_CONNECT",
                f"cannot connect to weightd socket {self.socket_path}: {err}; the daemon is not serving this device (load from disk)",
            ) from err
        except BaseException:
            sock.close()
            raise
        return sock

    def _read_unasked(self, timeout: float) -> None:
        """Reads the frames that came with nothing asked into ``events``: the first within
        ``timeout`` seconds when there are none yet, then every one already there. A frame saying
        why the daemon closed the connection (id null, an error) closes it and is kept for
        poll_events; a read that fails closes it and raises."""
        deadline = time.monotonic() + timeout
        while self._sock is not None:
            wait = 0.0 if self.events else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self._sock], [], [], wait)
            if not readable:
                return
            try:
                frame = read_frame(self._sock, time.monotonic() + self.timeout)
            except (OSError, WeightdError):
                self.close()
                raise
            if is_event(frame):
                self.events.append(frame)
                continue
            self.close()
            err = frame.get("error") if isinstance(frame, dict) and frame.get("id") is None and frame.get("ok") is False else None
            if not isinstance(err, dict):
                raise ProtocolError("E_BAD_REPLY", f"a frame no request asked for is not an event: {str(frame)[:200]}")
            # The daemon dropped the connection and said why (E_EVENTS_NOT_READ: events left
            # unread too long).
            self._dropped = ServeError(str(err.get("code", "E_UNKNOWN")), f"weightd ({self.socket_path}) closed this connection: {err.get('message', frame)}", err.get("details"))

    def request(self, cmd: str, **body: Any) -> Dict[str, Any]:
        return self._request(cmd, body, None)

    def request_fds(self, cmd: str, **body: Any) -> Tuple[Dict[str, Any], List[int]]:
        """A request whose reply carries descriptors (get_segment_fds): the reply and its fds, in
        the order sent, the caller's to close. On any failure every received fd is closed."""
        fds: List[int] = []
        try:
            return self._request(cmd, body, fds), fds
        except BaseException:
            close_fds(fds)
            raise

    def _request(self, cmd: str, body: Dict[str, Any], fds: Optional[List[int]]) -> Dict[str, Any]:
        if self.before_request is not None:
            self.before_request()
        message = {"id": 0, "cmd": cmd, **{k: v for k, v in body.items() if v is not None}}
        if self._sock is not None:
            try:
                # Events that came since the last request are kept, and a connection the daemon
                # closed (idle, or dropped saying why) is found before the request is sent on it.
                self._read_unasked(0.0)
            except (OSError, WeightdError):
                pass  # closed: the request goes on a new connection
        reused = self._sock is not None
        try:
            reply = self._exchange(message, fds)
        except (_ClosedBeforeReply, ConnectionResetError, BrokenPipeError) as err:
            # The daemon closed an idle connection just as we sent: it closes only between
            # requests, so it never read this one, and sending it again on a new one is safe.
            if not reused:
                if isinstance(err, WeightdError):
                    raise
                raise ServeError("E_DISCONNECTED", f"weightd closed the connection on {self.socket_path} before replying to {cmd} ({err})") from err
            reply = self._exchange(message, fds)
        if reply.get("ok") is not True:
            err = reply.get("error") or {}
            raise ServeError(
                str(err.get("code", "E_UNKNOWN")),
                f"weightd ({self.socket_path}) refused {cmd}: {err.get('message', reply)}",
                err.get("details"),
            )
        return reply

    def _exchange(self, message: Dict[str, Any], fds: Optional[List[int]] = None) -> Dict[str, Any]:
        if self._sock is None:
            self._sock = self._open()
        message["id"] = rid = next(self._ids)
        deadline = time.monotonic() + self.timeout
        try:
            try:
                self._sock.sendall(encode_frame(message))
            except (BrokenPipeError, ConnectionResetError) as err:
                # The daemon closed at once, perhaps saying why first (a refusal at its
                # connection cap, id null): that is the answer; without one, the send's failure is.
                try:
                    refusal = read_frame(self._sock, time.monotonic() + 1.0)
                except (OSError, WeightdError):
                    raise err from None
                if is_event(refusal) or not isinstance(refusal, dict) or refusal.get("id") is not None:
                    raise err from None
                return refusal
            reply = read_frame(self._sock, deadline, fds=fds)
            # Events of a watch may come before the reply: kept for poll_events.
            while is_event(reply):
                self.events.append(reply)
                reply = read_frame(self._sock, deadline, fds=fds)
            # One request at a time, and a connection that failed is never reused: the reply is
            # to this request (id null: the daemon could not read one, as for a protocol error).
            if not isinstance(reply, dict) or reply.get("id") not in (rid, None):
                raise ProtocolError("E_BAD_REPLY", f"reply to {message['cmd']} is not a reply to request {rid}: {str(reply)[:200]}")
            if reply.get("ok") is True and type(reply.get("packed")) is int:
                # Its packed manifest is the next frame, not JSON (docs/spec/manifest-packed.md §1).
                # Its lease was granted: whatever stops the manifest, the error names the lease, so
                # the caller gives it back (WeightdClient.get_state; a map lease follows the process).
                lease = {"leaseId": reply["leaseId"]} if isinstance(reply.get("leaseId"), str) else {}
                try:
                    packed = read_payload(self._sock, deadline)
                except (OSError, WeightdError) as err:
                    if not lease:
                        raise
                    raise ProtocolError(getattr(err, "code", None) or "E_DISCONNECTED", f"the packed manifest of the reply to {message['cmd']} did not arrive: {err}", lease) from err
                if len(packed) != reply["packed"]:
                    raise ProtocolError("E_BAD_REPLY", f"the packed manifest is {len(packed)} bytes, but its reply announced {reply['packed']}", lease)
                reply["packed"] = packed
            return reply
        except (OSError, WeightdError):
            self.close()
            raise

    def poll_events(self, timeout: float = 0.0) -> List[Dict[str, Any]]:
        """Takes the events received so far; when there are none, waits up to ``timeout`` seconds
        for the first, then takes every one already there. Raises ServeError with the daemon's
        code when it closed the connection saying why (E_EVENTS_NOT_READ: read events at least
        every ``WEIGHTD_SERVE_EVENT_READ_TIMEOUT_MS``, 60 s by default; the connection's watches
        ended with it), also when a request found it so and went on a new connection; the events
        read before that come with the next call. A connection closed without a reason while
        events wait (a request's new connection closed as idle, say) gives those events first and
        its error at the next call: which of the two a call saw must not depend on timing."""
        if self._dropped is None:
            try:
                self._read_unasked(timeout)
            except (OSError, WeightdError) as err:
                if not self.events:
                    raise
                self._dropped = err
                out, self.events = self.events, []
                return out
        if self._dropped is not None:
            dropped, self._dropped = self._dropped, None
            raise dropped
        out, self.events = self.events, []
        return out

    @property
    def connected(self) -> bool:
        """Whether a connection is open (a request opens one when none is, so a watch made on the
        one before is gone)."""
        return self._sock is not None

    def interrupt(self) -> None:
        """Wakes a thread that waits for events on this connection (it finds the connection
        closed): for another thread to stop it."""
        sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def close_fds(fds: List[int]) -> None:
    """Closes every descriptor in ``fds`` (and empties it), whatever each close says."""
    while fds:
        try:
            os.close(fds.pop())
        except OSError:
            pass
