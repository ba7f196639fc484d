"""Exceptions: one class per dcpx error code of ``include/dcpx.h``.

Every exception raised by this package for a failed libdcpx call is a
:class:`DcpxError` with ``code`` (the negative dcpx code, e.g. -1001) and
``message`` (``dcpx_strerror(code)``); ``str(e)`` adds what was being done.
Arguments refused by the package itself, before any work, raise the class
of the code libdcpx would have returned (``InvalidArgument``, ``RangeError``)
or its subclasses :class:`DtypeError` and :class:`DeviceError`.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type

__all__ = [
    "DcpxError", "PermError", "NotFound", "Interrupted", "IoError",
    "TryAgain", "NoMemory",
    "AccessDenied", "Busy", "Exists", "InvalidArgument", "RangeError",
    "NotSupported", "ProtocolError", "MessageTooLong", "ConnectionReset",
    "NotConnected", "TimedOut", "ConnectionRefused", "ShapeError",
    "DuplicateRank", "BadRank", "LimitError", "VersionError", "Aborted",
    "Failed", "TransportError", "CudaError", "NcclError", "StateError",
    "Recovering", "TooManyFds", "TextError", "DtypeError", "DeviceError",
    "ERRORS", "error_for", "check",
]


class DcpxError(Exception):
    """A dcpx error: ``code`` is the negative dcpx code, ``message`` its
    ``dcpx_strerror`` text, ``context`` what the package was doing."""

    code: int = -1
    name: str = "DCPX_E_UNKNOWN"

    def __init__(self, message: Optional[str] = None, *,
                 code: Optional[int] = None,
                 context: Optional[str] = None) -> None:
        if code is not None:
            self.code = code
        if message is None:
            # the bare base class names no code (its -1 is also PERM's)
            message = "unknown dcpx error" if code is None and \
                type(self) is DcpxError else _strerror(self.code)
        self.message = message
        self.context = context
        text = f"{context}: {message}" if context else message
        super().__init__(f"{text} [{self.name} {self.code}]")

    def __reduce__(self):  # picklable across processes
        return (_rebuild, (type(self), self.message, self.code, self.context))


def _rebuild(cls, message, code, context):
    return cls(message, code=code, context=context)


#: code -> dcpx_strerror's text, for every code of ERRORS, filled when
#: libdcpx is loaded (remember_texts): an error raised inside code that
#: torch.compile traces then builds its message without a ctypes call,
#: which Dynamo cannot trace (the dcpx error was lost for its own).
_TEXTS: Dict[int, str] = {}


def remember_texts(cdll: Any) -> None:
    for code in ERRORS:
        _TEXTS[code] = cdll.dcpx_strerror(code).decode("utf-8", "replace")


def _strerror(code: int) -> str:
    text = _TEXTS.get(code)
    if text is not None:
        return text
    try:
        from ._lib import lib
        return lib().dcpx_strerror(code).decode("utf-8", "replace")
    except ImportError:
        return f"dcpx error {code}"


class PermError(DcpxError, PermissionError):
    """Operation not permitted (e.g. an operator command by a non-admin).
    (``DCPX_E_PERM``, -1)"""
    code = -1
    name = "DCPX_E_PERM"


class NotFound(DcpxError):
    """No such group, socket or file. (``DCPX_E_NOENT``, -2)"""
    code = -2
    name = "DCPX_E_NOENT"


class Interrupted(DcpxError):
    """A join or recovery stopped by ``dcpx_client_interrupt`` /
    ``dcpx_member_interrupt``. (``DCPX_E_INTR``, -4) The package raises
    KeyboardInterrupt itself when Ctrl-C stops one; this class is for a
    code from elsewhere."""
    code = -4
    name = "DCPX_E_INTR"


class IoError(DcpxError):
    """Input/output error. (``DCPX_E_IO``, -5)"""
    code = -5
    name = "DCPX_E_IO"


class TryAgain(DcpxError):
    """Try again: dcpxd asked a join to come back later (the group awaits
    its ranks' reattach after a dcpxd restart). libdcpx retries such a
    join itself until its join timeout; this class is for a code from
    elsewhere. (``DCPX_E_AGAIN``, -11)"""
    code = -11
    name = "DCPX_E_AGAIN"


class NoMemory(DcpxError, MemoryError):
    """Out of memory (or a dcpxd memory cap). (``DCPX_E_NOMEM``, -12)"""
    code = -12
    name = "DCPX_E_NOMEM"


class AccessDenied(DcpxError, PermissionError):
    """Permission denied (the group belongs to another uid).
    (``DCPX_E_ACCES``, -13)"""
    code = -13
    name = "DCPX_E_ACCES"


class Busy(DcpxError):
    """Busy: a dcpxd bound was reached, or (libdcpx) a member's poll,
    health or recover ran while another of them did, or its push,
    push_list, merge or recover while another thread was inside one of
    them (nothing done). (``DCPX_E_BUSY``, -16)"""
    code = -16
    name = "DCPX_E_BUSY"


class Exists(DcpxError):
    """Already exists. (``DCPX_E_EXIST``, -17)"""
    code = -17
    name = "DCPX_E_EXIST"


class InvalidArgument(DcpxError, ValueError):
    """Invalid argument. (``DCPX_E_INVAL``, -22)"""
    code = -22
    name = "DCPX_E_INVAL"


class RangeError(DcpxError, ValueError):
    """Value out of range (rows > R, a row_end over max_local, a block
    outside the table). (``DCPX_E_RANGE``, -34)"""
    code = -34
    name = "DCPX_E_RANGE"


class NotSupported(DcpxError, NotImplementedError):
    """Not supported by this build of libdcpx (e.g. CUDA).
    (``DCPX_E_NOSYS``, -38)"""
    code = -38
    name = "DCPX_E_NOSYS"


class ProtocolError(DcpxError):
    """Protocol error. (``DCPX_E_PROTO``, -71)"""
    code = -71
    name = "DCPX_E_PROTO"


class MessageTooLong(DcpxError):
    """Message too long. (``DCPX_E_MSGSIZE``, -90)"""
    code = -90
    name = "DCPX_E_MSGSIZE"


class ConnectionReset(DcpxError, ConnectionError):
    """Connection to dcpxd reset. (``DCPX_E_CONNRESET``, -104)"""
    code = -104
    name = "DCPX_E_CONNRESET"


class NotConnected(DcpxError, ConnectionError):
    """Not connected to dcpxd (a reattach is under way).
    (``DCPX_E_NOTCONN``, -107)"""
    code = -107
    name = "DCPX_E_NOTCONN"


class TimedOut(DcpxError, TimeoutError):
    """Timed out (a join or a recovery). (``DCPX_E_TIMEDOUT``, -110)"""
    code = -110
    name = "DCPX_E_TIMEDOUT"


class ConnectionRefused(DcpxError, ConnectionError):
    """No dcpxd listens on the socket. (``DCPX_E_CONNREFUSED``, -111)"""
    code = -111
    name = "DCPX_E_CONNREFUSED"


class ShapeError(DcpxError):
    """The group's shape differs from the one this rank joined with.
    (``DCPX_E_SHAPE``, -1001)"""
    code = -1001
    name = "DCPX_E_SHAPE"


class DuplicateRank(DcpxError):
    """The rank has already joined the group. (``DCPX_E_DUPRANK``, -1002)"""
    code = -1002
    name = "DCPX_E_DUPRANK"


class BadRank(DcpxError):
    """Rank out of range for the group (rank >= world).
    (``DCPX_E_BADRANK``, -1003)"""
    code = -1003
    name = "DCPX_E_BADRANK"


class LimitError(DcpxError):
    """The shape exceeds dcpx limits. (``DCPX_E_LIMIT``, -1004)"""
    code = -1004
    name = "DCPX_E_LIMIT"


class VersionError(DcpxError):
    """dcpxd and libdcpx speak different protocol versions.
    (``DCPX_E_VERSION``, -1005)"""
    code = -1005
    name = "DCPX_E_VERSION"


class Aborted(DcpxError):
    """The group was aborted: call Member.recover(). (``DCPX_E_ABORTED``,
    -1006)"""
    code = -1006
    name = "DCPX_E_ABORTED"


class Failed(DcpxError):
    """This rank failed (a wait timed out, or it refused a call for its
    arguments): call Member.recover().
    (``DCPX_E_FAILED``, -1007)"""
    code = -1007
    name = "DCPX_E_FAILED"


class TransportError(DcpxError):
    """Transport not available (e.g. NCCL with the host backend).
    (``DCPX_E_TRANSPORT``, -1008)"""
    code = -1008
    name = "DCPX_E_TRANSPORT"


class CudaError(DcpxError):
    """CUDA error. (``DCPX_E_CUDA``, -1009)"""
    code = -1009
    name = "DCPX_E_CUDA"


class NcclError(DcpxError):
    """NCCL error. (``DCPX_E_NCCL``, -1010)"""
    code = -1010
    name = "DCPX_E_NCCL"


class StateError(DcpxError):
    """Operation not valid in the current state. (``DCPX_E_STATE``, -1011)"""
    code = -1011
    name = "DCPX_E_STATE"


class Recovering(DcpxError):
    """Reserved (the group is recovering); not raised by this version, where
    a call during a recovery raises Aborted. (``DCPX_E_RECOVER``,
    -1012)"""
    code = -1012
    name = "DCPX_E_RECOVER"


class TooManyFds(DcpxError):
    """Too many file descriptors in one message. (``DCPX_E_FDS``, -1013)"""
    code = -1013
    name = "DCPX_E_FDS"


class TextError(DcpxError):
    """A text field is not valid UTF-8 or holds a NUL. (``DCPX_E_TEXT``,
    -1014)"""
    code = -1014
    name = "DCPX_E_TEXT"

#: code -> exception class, for every DCPX_E_* of include/dcpx.h.
ERRORS: Dict[int, Type[DcpxError]] = {
    cls.code: cls for cls in (
        PermError, NotFound, Interrupted, IoError, TryAgain, NoMemory,
        AccessDenied,
        Busy, Exists,
        InvalidArgument, RangeError, NotSupported, ProtocolError,
        MessageTooLong, ConnectionReset, NotConnected, TimedOut,
        ConnectionRefused, ShapeError, DuplicateRank, BadRank, LimitError,
        VersionError, Aborted, Failed, TransportError, CudaError, NcclError,
        StateError, Recovering, TooManyFds, TextError,)}
#: code -> C name (DCPX_E_*).
NAMES: Dict[int, str] = {c: cls.name for c, cls in ERRORS.items()}


class DtypeError(InvalidArgument, TypeError):  # type: ignore[misc,valid-type]
    """An array of the wrong dtype (refused before any work)."""


class DeviceError(InvalidArgument):  # type: ignore[misc,valid-type]
    """An array on the wrong device for the member's backend (refused
    before any work)."""


def error_for(code: int, context: Optional[str] = None) -> DcpxError:
    """The exception for a negative dcpx code (a plain :class:`DcpxError`
    for an unknown one, e.g. another negative errno)."""
    cls = ERRORS.get(code)
    if cls is None:
        return DcpxError(code=code, context=context)
    return cls(code=code, context=context)


def check(code: int, context: Optional[str] = None) -> int:
    """Raises :func:`error_for` ``(code)`` if ``code < 0``; else returns it."""
    if code < 0:
        raise error_for(code, context)
    return code
