"""Exceptions: one class per dcpx error code of ``include/dcpx.h``.

Every exception raised by this package for a failed libdcpx call is a
:class:`DcpxError` with ``code`` (the negative dcpx code, e.g. -1001) and
``message`` (``dcpx_strerror(code)``); ``str(e)`` adds what was being done.
Arguments refused by the package itself, before any work, raise the class
of the code libdcpx would have returned (``InvalidArgument``, ``RangeError``)
or its subclasses :class:`DtypeError` and :class:`DeviceError`.

Such a refusal does nothing at all: the rank does not fail, and the call
may be made again with good arguments (the call order still holds: a
push refused here is no push, so the next push is taken and a merge is
refused until it comes, with :class:`StateError`). Until it is made, the
rank's peers wait for it, for at most the group's timeout; then they fail
with a wait record that names this rank as the one awaited (``dcpxctl
records``). A call that libdcpx itself refuses fails the rank instead
(:class:`Failed` for its next calls until :meth:`Member.recover`), and its
peers stop at once: in C nothing else tells the engine that a call it may
have half enqueued did not happen.
"""

from __future__ import annotations

import errno
from typing import Any, Dict, Optional, Type

#: code -> exception class, for every DCPX_E_* of include/dcpx.h (each
#: class below enters itself: DcpxError.__init_subclass__).
ERRORS: Dict[int, Type["DcpxError"]] = {}


class DcpxError(Exception):
    """A dcpx error: ``code`` is the negative dcpx code, ``message`` its
    ``dcpx_strerror`` text, ``context`` what the package was doing,
    ``name`` the code's name (shown in ``str(e)``): its ``DCPX_E_*`` for
    a dcpx code, whatever class it was built with (``DcpxError(code=-22)``
    is ``DCPX_E_INVAL``), else the errno's for another negative errno
    (``EBADF`` for -9), else ``DCPX_E_UNKNOWN``."""

    code: int = -1
    name: str = "DCPX_E_UNKNOWN"

    def __init_subclass__(cls, code: Optional[int] = None,
                          name: Optional[str] = None, **kw: Any) -> None:
        """``class X(DcpxError, code=-2, name="DCPX_E_NOENT")``: the class
        of that code, its docstring ending in both, entered in
        :data:`ERRORS`. A subclass without them narrows its parent's code
        (DtypeError)."""
        super().__init_subclass__(**kw)
        if code is None:
            return
        cls.code, cls.name = code, name
        if cls.__doc__:  # None under python -OO
            cls.__doc__ += f" (``{name}``, {code})"
        ERRORS[code] = cls

    def __init__(self, message: Optional[str] = None, *,
                 code: Optional[int] = None,
                 context: Optional[str] = None) -> None:
        if code is not None:
            self.code = code
            if code != type(self).code or self.name == DcpxError.name:
                self.name = _name_of(code)  # not the class's own code
        if message is None:
            # the bare base class names no code (its -1 is also PERM's)
            message = "unknown dcpx error" if code is None and \
                type(self) is DcpxError else _strerror(self.code)
        self.message = message
        self.context = context
        text = f"{context}: {message}" if context else message
        super().__init__(f"{text} [{self.name} {self.code}]")

    def __reduce__(self):  # picklable across processes
        # the code as given (None for a bare DcpxError(): its -1 is the
        # class's, not DCPX_E_PERM)
        return (_rebuild, (type(self), self.message,
                           self.__dict__.get("code"), self.context))


def _rebuild(cls, message, code, context):
    return cls(message, code=code, context=context)


def _name_of(code: int) -> str:
    """The name of a code: DCPX_E_* for a dcpx code, the errno's for
    another negative errno, else DCPX_E_UNKNOWN."""
    cls = ERRORS.get(code)
    if cls is not None:
        return cls.name
    if isinstance(code, int) and code < 0:
        return errno.errorcode.get(-code, DcpxError.name)
    return DcpxError.name


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


class PermError(DcpxError, PermissionError, code=-1, name="DCPX_E_PERM"):
    """Operation not permitted (e.g. an operator command by a non-admin)."""


class NotFound(DcpxError, code=-2, name="DCPX_E_NOENT"):
    """No such group or file (a socket with no dcpxd behind it, or none
    at all, is :class:`ConnectionRefused`)."""


class Interrupted(DcpxError, code=-4, name="DCPX_E_INTR"):
    """A join or recovery stopped by ``dcpx_client_interrupt`` /
    ``dcpx_member_interrupt``. The package raises KeyboardInterrupt itself
    when Ctrl-C stops one; this class is for a code from elsewhere."""


class IoError(DcpxError, code=-5, name="DCPX_E_IO"):
    """Input/output error."""


class TryAgain(DcpxError, code=-11, name="DCPX_E_AGAIN"):
    """Try again: dcpxd asked a join to come back later (the group awaits
    its ranks' reattach after a dcpxd restart). libdcpx retries such a
    join itself until its join timeout; this class is for a code from
    elsewhere."""


class NoMemory(DcpxError, MemoryError, code=-12, name="DCPX_E_NOMEM"):
    """Out of memory (or a dcpxd memory cap)."""


class AccessDenied(DcpxError, PermissionError, code=-13, name="DCPX_E_ACCES"):
    """Permission denied (the group belongs to another uid)."""


class Busy(DcpxError, code=-16, name="DCPX_E_BUSY"):
    """Busy: a dcpxd bound was reached, or (libdcpx) a member's poll,
    health or recover ran while another of them did, or its push,
    push_list, merge or recover while another thread was inside one of
    them (nothing done)."""


class Exists(DcpxError, code=-17, name="DCPX_E_EXIST"):
    """Already exists."""


class InvalidArgument(DcpxError, ValueError, code=-22, name="DCPX_E_INVAL"):
    """Invalid argument."""


class RangeError(DcpxError, ValueError, code=-34, name="DCPX_E_RANGE"):
    """Value out of range (rows > R, a row_end over max_local, a block
    outside the table)."""


class NotSupported(DcpxError, NotImplementedError, code=-38,
                    name="DCPX_E_NOSYS"):
    """Not supported by this build of libdcpx (e.g. CUDA)."""


class ProtocolError(DcpxError, code=-71, name="DCPX_E_PROTO"):
    """Protocol error."""


class MessageTooLong(DcpxError, code=-90, name="DCPX_E_MSGSIZE"):
    """Message too long."""


class ConnectionReset(DcpxError, ConnectionError, code=-104,
                       name="DCPX_E_CONNRESET"):
    """Connection to dcpxd reset."""


class NotConnected(DcpxError, ConnectionError, code=-107,
                    name="DCPX_E_NOTCONN"):
    """Not connected to dcpxd (a reattach is under way)."""


class TimedOut(DcpxError, TimeoutError, code=-110, name="DCPX_E_TIMEDOUT"):
    """Timed out (a join or a recovery)."""


class ConnectionRefused(DcpxError, ConnectionError, code=-111,
                         name="DCPX_E_CONNREFUSED"):
    """No dcpxd listens on the socket."""


class ShapeError(DcpxError, code=-1001, name="DCPX_E_SHAPE"):
    """The group's shape differs from the one this rank joined with."""


class DuplicateRank(DcpxError, code=-1002, name="DCPX_E_DUPRANK"):
    """The rank has already joined the group."""


class BadRank(DcpxError, code=-1003, name="DCPX_E_BADRANK"):
    """Rank out of range for the group (rank >= world)."""


class LimitError(DcpxError, code=-1004, name="DCPX_E_LIMIT"):
    """The shape exceeds dcpx limits."""


class VersionError(DcpxError, code=-1005, name="DCPX_E_VERSION"):
    """dcpxd and libdcpx speak different protocol versions."""


class Aborted(DcpxError, code=-1006, name="DCPX_E_ABORTED"):
    """The group was aborted: call Member.recover()."""


class Failed(DcpxError, code=-1007, name="DCPX_E_FAILED"):
    """This rank failed (a wait timed out, or it refused a call for its
    arguments): call Member.recover()."""


class TransportError(DcpxError, code=-1008, name="DCPX_E_TRANSPORT"):
    """Transport not available (e.g. NCCL with the host backend)."""


class CudaError(DcpxError, code=-1009, name="DCPX_E_CUDA"):
    """CUDA error."""


class NcclError(DcpxError, code=-1010, name="DCPX_E_NCCL"):
    """NCCL error."""


class StateError(DcpxError, code=-1011, name="DCPX_E_STATE"):
    """Operation not valid in the current state."""


class Recovering(DcpxError, code=-1012, name="DCPX_E_RECOVER"):
    """Reserved (the group is recovering); not raised by this version, where
    a call during a recovery raises Aborted."""


class TooManyFds(DcpxError, code=-1013, name="DCPX_E_FDS"):
    """Too many file descriptors in one message."""


class TextError(DcpxError, code=-1014, name="DCPX_E_TEXT"):
    """A text field is not valid UTF-8 or holds a NUL."""


#: code -> C name (DCPX_E_*).
NAMES: Dict[int, str] = {c: cls.name for c, cls in ERRORS.items()}


class DtypeError(InvalidArgument, TypeError):  # type: ignore[misc,valid-type]
    """An array of the wrong dtype (refused before any work)."""


class DeviceError(InvalidArgument):  # type: ignore[misc,valid-type]
    """An array on the wrong device for the member's backend (refused
    before any work)."""


def error_for(code: int, context: Optional[str] = None) -> DcpxError:
    """The exception for a negative dcpx code (a plain :class:`DcpxError`
    for an unknown one, e.g. another negative errno, named as that errno:
    ``[EBADF -9]``)."""
    cls = ERRORS.get(code)
    if cls is None:
        return DcpxError(code=code, context=context)
    return cls(code=code, context=context)


def check(code: int, context: Optional[str] = None) -> int:
    """Raises :func:`error_for` ``(code)`` if ``code < 0``; else returns it."""
    if code < 0:
        raise error_for(code, context)
    return code


__all__ = ["DcpxError", *(cls.__name__ for cls in ERRORS.values()),
           "DtypeError", "DeviceError", "ERRORS", "error_for", "check"]
