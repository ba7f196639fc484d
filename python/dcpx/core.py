"""The pythonic dcpx API: Shape, JoinOptions, Health, Client, Member.

Arrays: logits are bf16 bit patterns ``[rows][len]`` (numpy ``uint16`` or
``int16``, torch ``bfloat16``, ``int16`` or ``uint16``), every index array
is ``int32``. A member of the host backend takes numpy arrays and CPU torch
tensors; a member of the CUDA backend takes torch CUDA tensors on its
device and enqueues on ``torch.cuda.current_stream()`` (or ``stream=``).
Everything is checked (dtype, device, shape, contiguity, alignment to the
element) before any work.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
import warnings
import enum
import itertools
import operator
import weakref
from dataclasses import dataclass, field, fields
from typing import (Any, Callable, Dict, List, NamedTuple, Optional,
                    Sequence, Tuple)

from . import _arrays as A
from ._lib import (DcpxAsyncErrorC, DcpxHealthInfoC, DcpxJoinOptsC,
                   DcpxListsC, DcpxRefInC,
                   DcpxRefStatsC, DcpxShapeC, call_in, lib, merge_out)
from .errors import (Aborted, Busy, DcpxError, DtypeError, Failed,
                     Interrupted, InvalidArgument, RangeError, StateError,
                     TextError, TimedOut, check)

__all__ = ["Backend", "Transport", "Shape", "JoinOptions", "Health",
           "MergeResult", "RefStats", "Client", "Member", "PreparedCall",
           "connect",
           "auto_local_topk", "version", "strerror", "ref_call",
           "ref_local_list", "MAX_WORLD", "MAX_TOPK", "MAX_LOCAL",
           "MAX_ROWS", "GROUP_NAME_MAX", "DEFAULT_SOCKET"]

MAX_WORLD = 16
MAX_TOPK = 4096
MAX_LOCAL = 1 << 17
MAX_ROWS = 4096
_U64 = (1 << 64) - 1
GROUP_NAME_MAX = 63
DEFAULT_SOCKET = "/run/dcpx/dcpxd.sock"


class Backend(enum.IntEnum):
    """Where push and merge run (``DCPX_BACKEND_*``)."""
    HOST = 0
    CUDA = 1


class Transport(enum.IntEnum):
    """How candidates travel (``DCPX_TRANSPORT_*``)."""
    AUTO = 0
    LL = 1
    NCCL = 2


def version() -> str:
    """libdcpx's version string (``dcpx_version``)."""
    return lib().dcpx_version().decode()


def strerror(code: int) -> str:
    """The text of a dcpx code (``dcpx_strerror``); codes are int32."""
    code = _ranged(code, -(1 << 31), (1 << 31) - 1, "strerror: code")
    return lib().dcpx_strerror(code).decode("utf-8", "replace")


def auto_local_topk(world: int, topk: int) -> int:
    """The N that ``local_topk=0`` gets (``dcpx_shape_auto_local_topk``);
    0 for W or K out of range; InvalidArgument for a non-integer."""
    for x, what in ((world, "world"), (topk, "topk")):
        if A.not_int(x):
            raise InvalidArgument(context=f"auto_local_topk: {what} {x!r} "
                                  "is not an integer")
    w, k = operator.index(world), operator.index(topk)
    if not (0 <= w <= 0xFFFFFFFF and 0 <= k <= 0xFFFFFFFF):
        return 0  # out of range (a uint32 would wrap it into range)
    return int(lib().dcpx_shape_auto_local_topk(w, k))


@dataclass
class Shape:
    """A group's shape (``dcpx_shape``); every rank joins with the same.

    ``local_topk=0`` lets the library choose N
    (:func:`auto_local_topk`, ``dcpx_shape_auto_local_topk``).
    """
    world: int = 1          #: W, 1..16
    rows: int = 1           #: R, the most rows of one call, 1..4096
    topk: int = 2           #: K, 2..4096
    local_topk: int = 0     #: N, 1 <= N < K; 0: the library chooses
    block_size: int = 1     #: B, KV positions per block-table entry
    interleave: int = 1     #: I, the DCP KV interleave
    max_local: int = 1      #: bound on any row_end, 1..2^17

    def resolved(self) -> "Shape":
        """This shape with ``local_topk=0`` replaced by the library's N;
        :class:`InvalidArgument` naming a field that is not an integer of
        its C type."""
        self._c()  # the field named, not auto_local_topk's argument
        # plain ints: a field of a type with only __index__ (or one whose
        # value changes) would not stay what was checked
        s = Shape(**{f.name: operator.index(getattr(self, f.name))
                     for f in fields(self)})
        if s.local_topk:
            return s
        s.local_topk = auto_local_topk(s.world, s.topk)
        if not s.local_topk and (s.world > MAX_WORLD or s.topk > MAX_TOPK):
            s.local_topk = 1  # so that the check names the limit (as C)
        return s

    def _c(self) -> DcpxShapeC:
        v: Dict[str, int] = {}
        for f in fields(self):
            x = getattr(self, f.name)
            if A.not_int(x):
                raise InvalidArgument(
                    context=f"Shape.{f.name} must be an integer, got "
                            f"{type(x).__name__} {x!r}")
            v[f.name] = operator.index(x)  # numpy integers too
            if not 0 <= v[f.name] <= 0xFFFFFFFF:
                raise InvalidArgument(
                    context=f"Shape.{f.name} must be in 0..2^32-1, got "
                            f"{v[f.name]}")
        return DcpxShapeC(ctypes.sizeof(DcpxShapeC), v["world"], v["rows"],
                          v["topk"], v["local_topk"], v["block_size"],
                          v["interleave"], v["max_local"])

    def check(self) -> None:
        """Raises :class:`LimitError` / :class:`InvalidArgument` if the
        shape (after resolving ``local_topk=0``) is not within dcpx limits
        (``dcpx_shape_explain``: the message names the field and the
        rule)."""
        c = self.resolved()._c()
        why = ctypes.create_string_buffer(200)
        r = lib().dcpx_shape_explain(ctypes.byref(c), why, len(why))
        check(r, "shape check: " + why.value.decode("utf-8", "replace"))

    def warning(self) -> Optional[str]:
        """A warning about a valid shape, or None (``dcpx_shape_warning``):
        with ``world >= 2`` and ``world * local_topk <= topk`` every full
        row rescues, always (slow, still exact). :meth:`Client.join` warns
        of it too (a :class:`RuntimeWarning`, from dcpxd's join reply)."""
        self.check()
        c = self.resolved()._c()
        w = lib().dcpx_shape_warning(ctypes.byref(c))
        return w.decode("utf-8", "replace") if w else None


#: A block table too big for dcpx_call's uint32 bt_rows and bt_cols
#: (ctypes cut them to 32 bits: another table's pitch and extent).
_BT_BIG = ("block_table is {} x {}: each side must be below 2^32 "
           "(dcpx_call's bt_rows and bt_cols are uint32)")


def _tag(call_tag: Any) -> int:
    """A call tag as the C uint64 (any integer, taken modulo 2^64)."""
    if type(call_tag) is int:
        return call_tag & _U64
    if A.not_int(call_tag):
        raise InvalidArgument(context=f"call_tag must be an integer, got "
                              f"{type(call_tag).__name__} {call_tag!r}")
    return operator.index(call_tag) & _U64


def _no_stream_compiled(stream: Any, what: str) -> None:
    """Under torch.compile the dcpx ops run on torch's current stream: a
    ``stream=`` argument cannot go through the op, and was dropped (the
    call then ran on another stream than the one asked for). A builtin
    NotImplementedError (NotSupported's base): Dynamo cannot trace the
    construction of dcpx's error classes, whose text would be lost (it
    keeps a builtin's: torch 2.11 on the H200,
    scripts/dynamo-raise-probe.py)."""
    if stream is not None:
        raise NotImplementedError(
            f"{what}(stream=...) under torch.compile: the dcpx op runs on "
            "torch's current stream; use `with torch.cuda.stream(s):` "
            "instead [DCPX_E_NOSYS]")


def _ranged(x: Any, lo: int, hi: int, what: str) -> int:
    """x as an int in lo..hi (numpy integers too; not bool), else
    InvalidArgument naming ``what``."""
    if A.not_int(x) or \
            not lo <= operator.index(x) <= hi:
        raise InvalidArgument(context=f"{what}: {x!r} is not an integer in "
                              f"{lo}..{hi}")
    return operator.index(x)


def _flag(x: Any, what: str) -> bool:
    """A boolean option: True or False (numpy.bool_ too), else
    InvalidArgument naming ``what``. Not an int, 0 and 1 included, nor
    anything else that Python would take as true or false: ``"no"``
    counted as true."""
    if x is True or x is False:
        return x
    np = sys.modules.get("numpy")
    if np is not None and isinstance(x, np.bool_):
        return bool(x)
    raise InvalidArgument(context=f"{what} must be a bool (True or False), "
                          f"got {type(x).__name__} {x!r}")


@dataclass
class JoinOptions:
    """How a rank joins (``dcpx_join_opts``)."""
    rank: int = 0                      #: this member's rank, < W
    group: str = "dcpx"                #: 1..63 bytes of [A-Za-z0-9._-]
    device: int = -1                   #: CUDA device; -1 with the host backend
    backend: Backend = Backend.HOST    #: Backend.HOST or Backend.CUDA
    transport: Transport = Transport.AUTO
    join_timeout_ms: int = 0           #: 0: the daemon's default
    timeout_ns: int = 1_000_000_000    #: bound of every wait, 1 ms .. 1 h


@dataclass(frozen=True)
class Health:
    """A member's view of its group (``dcpx_health_info``)."""
    generation: int    #: bumped by every recovery
    abort: int         #: 0, or why aborted (1 alarm, 2 dead rank, 3 operator)
    failed_mask: int   #: ranks whose FAILED word is set
    alarm_mask: int    #: ranks whose alarm word is set
    joined_mask: int   #: ranks held by a live process
    world: int
    rank: int
    backend: int
    transport: int
    calls: int         #: this rank's calls
    rows: int
    rescue_rows: int
    failed_calls: int
    daemon_link: int   #: 1: attached to dcpxd
    reattaches: int    #: times reattached to a restarted dcpxd

    @property
    def ok(self) -> bool:
        """True when the group is not aborted and no rank has failed."""
        return self.abort == 0 and self.failed_mask == 0


class Reason(enum.IntEnum):
    """Why a member failed (``DCPX_REASON_*``)."""
    NONE = 0
    REFUSED = 1      #: this rank refused a call (bad arguments, launch)
    TIMEOUT = 2      #: a wait of this rank timed out
    PEER_FAILED = 3  #: another rank failed
    DEAD_RANK = 4    #: a rank's process died or left
    OPERATOR = 5     #: an operator reset the group (dcpxctl reset)
    BLOCK_TABLE = 6  #: rows outside the block table (host backend)


#: Why a call of a member came back DCPX_E_BUSY (the package runs poll,
#: health and recover one at a time itself, so only this remains).
_BUSY = ("another thread is inside a call of this member (push, push_list, "
         "merge or recover); the calls of one member run one at a time "
         "(nothing done)")

_REASON_TEXT = {
    Reason.REFUSED: "this rank refused an earlier call: bad arguments or "
                    "a failed launch",
    Reason.TIMEOUT: "a wait of this rank timed out",
    Reason.PEER_FAILED: "another rank of the group failed",
    Reason.DEAD_RANK: "a rank's process died or left",
    Reason.OPERATOR: "an operator reset the group (dcpxctl reset)",
}


@dataclass(frozen=True)
class AsyncError:
    """A member's sticky state and which rows of its last call failed
    (``dcpx_member_async_error``)."""
    state: int          #: 0, or the code: Failed's or Aborted's
    reason: Reason
    abort: int          #: the group's abort word
    failed_mask: int    #: ranks whose FAILED word is set
    generation: int
    rows: int           #: rows of the last call (push or merge)
    failed_rows: List[int] = field(default_factory=list)
    rows_exact: bool = True  #: False: only rows whose own wait timed out


class MergeResult(NamedTuple):
    """A merge's outputs for this rank (arrays of the inputs' kind)."""
    rows_out: Any          #: [rows][K] int32: KV rows of own selected, -1 pad
    valid_out: Any         #: [rows] int32: their count (-1: row failed)
    ids_out: Any = None    #: [rows][K] int32 gids of all K selected, or None
    sat_word: Any = None   #: [rows] (mask << 16) | ord16 of S1's K-th key


class RefStats(NamedTuple):
    """Statistics of :func:`ref_call`."""
    rows: int
    rescue_rows: int
    saturated: int


def _not_compiling() -> bool:
    return False


# Set by dcpx.torch_ops when torch is importable: torch.compiler's
# is_compiling (which Dynamo folds to True while it traces) and the module
# with the custom ops. Plain module globals, so that Dynamo traces the
# branch in Member.push/merge without touching ctypes.
_is_compiling = _not_compiling
_torch_ops: Any = None

# Live members by handle: the torch custom ops name a member by an int.
def _interruptible(call: Callable[[], int],
                   interrupt: Callable[[int], Any],
                   abandon: Callable[[int], Any]) -> int:
    """call(), a C wait that may last its whole timeout (dcpx_join,
    dcpx_recover), on a worker thread, so that this thread still takes
    Ctrl-C: it looks for signals every 50 ms. On KeyboardInterrupt (or any
    exception a signal handler raises) ``interrupt(1)`` stops the C wait
    (within about 50 ms: DCPX_E_INTR), the worker is waited for (further
    signals' exceptions are held till then), ``interrupt(0)`` clears the
    flag, ``abandon(code)`` undoes what the call did if it completed
    anyway, and the exception goes on."""
    box: List[Any] = []
    # A plain lock that the worker releases, not Thread.join (a join that a
    # KeyboardInterrupt cut short can leave is_alive() False while the
    # thread still runs) nor an Event: an exception from a signal handler
    # inside Condition.wait can leave the Condition's lock released twice
    # (CPython's threading; the caller got "RuntimeError: release
    # unlocked lock" instead of its KeyboardInterrupt), where a lock's own
    # acquire just raises it. `finished` says the worker is done, whoever
    # holds `done` now.
    done = threading.Lock()
    done.acquire()
    finished: List[bool] = []
    # Who goes first, the worker into call() or the caller out on a
    # signal: one atomic setdefault each, read back from the dict (the
    # worker may be started yet not have run when Thread.start raises).
    first_of: Dict[str, str] = {}

    def run() -> None:
        try:
            if first_of.setdefault("who", "worker") != "worker":
                return  # the caller gave up before this thread ran
            box.append(call())
        except BaseException as e:  # handed to the caller's thread
            box.append(e)
        finally:
            finished.append(True)
            done.release()

    th = threading.Thread(target=run, name="dcpx-wait", daemon=True)
    try:
        th.start()
        while not done.acquire(timeout=0.05):
            pass
    except BaseException as first:
        pending: BaseException = first
        while "who" not in first_of:
            try:
                first_of.setdefault("who", "caller")
            except BaseException as again:
                if not isinstance(again, KeyboardInterrupt):
                    pending = again
        if first_of["who"] == "caller":  # call() never runs: nothing to undo
            raise pending
        # Stop the C wait; wait until the worker is out of the C call
        # (about 50 ms; the CUDA backend's setup once the group formed is
        # not stopped): it may still use the client or the member; clear
        # the flag, and undo a call that completed anyway. Each step is
        # idempotent and is tried again after a second signal's exception,
        # which is kept, not let out (a SystemExit wins over a
        # KeyboardInterrupt; an undo's own DcpxError is dropped: the
        # caller's exception says what happened).
        stage = 0
        while stage < 3:
            try:
                if stage == 0:
                    interrupt(1)
                    stage = 1
                elif not finished:
                    done.acquire(timeout=0.05)
                else:
                    interrupt(0)
                    if box and isinstance(box[0], int):
                        abandon(box[0])
                    stage = 3
            except BaseException as again:
                if not isinstance(again, (KeyboardInterrupt, DcpxError)):
                    pending = again
        raise pending
    if isinstance(box[0], BaseException):
        raise box[0]
    return int(box[0])


_members: Dict[int, "weakref.ReferenceType[Member]"] = {}
_handles = itertools.count(1)


def _member_by_handle(handle: int) -> "Member":
    ref = _members.get(handle)
    m = ref() if ref is not None else None
    if m is None or m._ptr is None:
        raise StateError(context=f"dcpx member {handle} has left")
    return m


@dataclass(eq=False)
class Client:
    """A connection to the node's dcpxd (``dcpx_connect``).

    ``socket=None`` uses ``$DCPX_SOCKET``, else ``/run/dcpx/dcpxd.sock``.
    A context manager; :meth:`close` disconnects (members already joined
    keep their own link).

    One join at a time: the C client is one thread's (its interrupt flag
    and error text are the whole client's), so a :meth:`join` while
    another thread's join on this Client runs raises :class:`Busy`
    (connect a Client per thread that joins). :meth:`close` during a
    join stops that join (it raises :class:`StateError`); from another
    thread it waits for the join to end, and from the joining thread
    itself (a signal handler) it returns at once, the join disconnecting
    as it ends. Compared by identity.
    """
    socket: Optional[str] = None
    _ptr: Optional[int] = field(default=None, init=False, repr=False)
    # _joiner (the thread in a join), _closing (a close waits for that
    # join, which disconnects as it ends) and _ptr change under _state. A
    # bare lock, waited on by polling, not a Condition: an exception from a
    # signal handler inside Condition.wait can leave its lock released
    # twice (CPython's threading), so that a Ctrl-C in a close() that
    # waits for a join broke the Client for good.
    _state: threading.RLock = field(default_factory=threading.RLock,
                                    init=False, repr=False)
    _joiner: Optional[int] = field(default=None, init=False, repr=False)
    _closing: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        p = ctypes.c_void_p()
        if self.socket is not None:
            try:  # a str, or a path-like such as pathlib.Path
                self.socket = os.fsdecode(os.fspath(self.socket))
            except TypeError:
                raise InvalidArgument(context="Client socket must be a "
                                      "path (str or os.PathLike)") from None
        path = None if self.socket is None else os.fsencode(self.socket)
        if path is not None and b"\0" in path:
            raise TextError(context="Client socket path contains a NUL")
        r = lib().dcpx_connect(path, ctypes.byref(p))
        if r < 0:
            where = (self.socket or os.environ.get("DCPX_SOCKET")
                     or "/run/dcpx/dcpxd.sock")
            what = f"connecting to dcpxd at {where}"
            if r == RangeError.code and len(os.fsencode(where)) >= 108:
                what += (f" (the path is {len(os.fsencode(where))} bytes; a "
                         "Unix socket's is at most 107)")
            elif not os.path.exists(where):
                what += " (no such socket: is dcpxd running there?)"
            check(r, what)
        self._ptr = p.value

    def join(self, shape: Shape, options: Optional[JoinOptions] = None,
             **kw: Any) -> "Member":
        """Joins a group; blocks until all W ranks have joined (or the join
        times out: :class:`TimedOut`). ``kw`` sets :class:`JoinOptions`
        fields, e.g. ``client.join(shape, rank=1, group="layer")``.
        Errors: ShapeError, DuplicateRank, BadRank, LimitError, TimedOut,
        NotSupported (backend not built), InvalidArgument, ...

        The wait runs on a worker thread, so Ctrl-C (KeyboardInterrupt,
        or an exception a signal handler raises) stops it within about
        50 ms (``dcpx_client_interrupt``): the rank does not join, and
        dcpxd forgets it, so it may join again. Not stopped: the backend's
        setup once the group formed (CUDA; bounded by the join timeout);
        should the join complete anyway, the member leaves before the
        exception goes on."""
        # An exception from a signal handler may come at any call or
        # loop, the lock's __enter__ and __exit__ included: the claim is
        # made and its flag set with no call between them, inside the try,
        # and released first thing in the finally, so that Ctrl-C at the
        # wrong moment cannot leave the Client claimed by a join that is
        # over (every later join raised Busy).
        claimed = False
        try:
            with self._state:
                if self._joiner is not None:
                    where = "this thread (a signal handler's join?)" \
                        if self._joiner == threading.get_ident() else \
                        "another thread"
                    raise Busy(context=f"this Client is in a join on "
                               f"{where}: a Client joins one rank at a "
                               "time; connect a Client per thread that "
                               "joins")
                if self._ptr is None or self._closing:
                    raise StateError(context="Client is closed")
                self._joiner = threading.get_ident()
                claimed = True
            return self._join(shape, options, kw)
        finally:
            if claimed:
                self._joiner = None
                with self._state:
                    if self._closing:  # a close() came during the join
                        self._disconnect()  # first: a cut here leaves
                        self._closing = False  # _closing for close()

    def _join(self, shape: Shape, options: Optional[JoinOptions],
              kw: Dict[str, Any]) -> "Member":
        if self._ptr is None:
            raise StateError(context="Client is closed")
        if options is not None and not isinstance(options, JoinOptions):
            raise InvalidArgument(context="options must be a "
                                  "dcpx.JoinOptions")
        # A copy: the member keeps its options (recover() reads the
        # device), and the caller may reuse the object for the next join.
        opts = JoinOptions(**kw) if options is None else \
            JoinOptions(**{**options.__dict__, **kw})
        if not isinstance(shape, Shape):
            raise InvalidArgument(context="shape must be a dcpx.Shape")
        # One snapshot, taken before the wait: the caller may change (or
        # reuse) its Shape while the join waits, and the member must hold
        # the shape the group was joined with (a topk set smaller during
        # the wait let merge accept outputs that libdcpx wrote past).
        joined = shape.resolved()
        cs = joined._c()  # the same snapshot goes to C (N resolved alike)
        try:
            group = opts.group.encode("utf-8")
        except (AttributeError, UnicodeError):
            raise InvalidArgument(context="group must be a str") from None
        if b"\0" in group:  # C would stop there: another group's name
            raise TextError(context=f"group {opts.group!r} contains a NUL")
        rank = _ranged(opts.rank, 0, 0xFFFFFFFF, "JoinOptions.rank")
        jt = _ranged(opts.join_timeout_ms, 0, 0xFFFFFFFF,
                     "JoinOptions.join_timeout_ms")
        dev = _ranged(opts.device, -(1 << 31), (1 << 31) - 1,
                      "JoinOptions.device (an int32; -1: host backend)")
        tns = _ranged(opts.timeout_ns, 0, (1 << 64) - 1,
                      "JoinOptions.timeout_ns")
        # the library's values only (a wider int would be cut to 32 bits
        # by ctypes: 1 << 32 became the host backend)
        be = _ranged(opts.backend, 0, max(int(b) for b in Backend),
                     "JoinOptions.backend (a dcpx.Backend)")
        tr = _ranged(opts.transport, 0, max(int(t) for t in Transport),
                     "JoinOptions.transport (a dcpx.Transport)")
        co = DcpxJoinOptsC(ctypes.sizeof(DcpxJoinOptsC), rank, group, dev,
                           be, tr, jt, tns)
        # The library's word on the shape, before the join (the one in the
        # join reply, Member.warning, says the same): a warning made an
        # error (-W error) then stops a join that has not happened, rather
        # than one whose member would leave the group it just formed.
        sw = lib().dcpx_shape_warning(ctypes.byref(cs))
        if sw:
            warnings.warn(f"dcpx group {opts.group!r}: "
                          f"{sw.decode('utf-8', 'replace')}",
                          RuntimeWarning, stacklevel=3)
        p = ctypes.c_void_p()
        L, cp = lib(), ctypes.c_void_p(self._ptr)
        # The Member is made on the worker, as soon as the C join returns:
        # from then on dropping it leaves the group (__del__), and an
        # exception that comes before the caller has it (Ctrl-C as the
        # wait ends) leaves through it, never a second time by pointer.
        made: List["Member"] = []

        def join_and_hold() -> int:
            r = L.dcpx_join(cp, ctypes.byref(cs), ctypes.byref(co),
                            ctypes.byref(p))
            if r >= 0:
                m: Optional[Member] = None
                try:
                    m = Member(p.value, self, joined, opts)
                    made.append(m)
                except BaseException:
                    if m is not None and getattr(m, "_owns", False):
                        m.leave()  # it owns the pointer: once, through it
                    else:  # not made (or cut short): it frees nothing
                        L.dcpx_leave(p)
                    raise
            return r

        def abandon(code: int) -> None:
            # The list keeps the member until its leave returns: a signal's
            # exception in between leaves it here for the next try (a
            # leave cut short keeps its pointer in _left, which the
            # member's next leave or its __del__ frees).
            if made:
                made[0].leave()
                made.clear()

        try:
            r = _interruptible(join_and_hold,
                               lambda on: L.dcpx_client_interrupt(cp, on),
                               abandon)
            if r < 0 and self._closing and r == Interrupted.code:
                raise StateError(context=f"joining group {opts.group!r} as "
                                 f"rank {opts.rank}: the Client was closed "
                                 "during the join")
            if r < 0:
                context = f"joining group {opts.group!r} as rank {opts.rank}"
                why = lib().dcpx_client_last_error(ctypes.c_void_p(self._ptr))
                if why:  # libdcpx or dcpxd refused it and said why
                    context += f" ({why.decode('utf-8', 'replace')})"
                check(r, context)
            m = made[0]
            w = lib().dcpx_member_warning(ctypes.c_void_p(p.value))
            m._warning = w.decode("utf-8", "replace") if w else None
            made.clear()
            return m
        except BaseException:
            abandon(0)  # the join completed, the caller never had it
            raise

    def close(self) -> None:
        """Disconnects (``dcpx_disconnect``); idempotent. A join on this
        Client is stopped first (it freed the client under that join
        before): from another thread, close waits for it to end; from the
        joining thread (a signal handler) it returns, and the join
        disconnects as it ends."""
        with self._state:
            if self._ptr is None:
                return
            if self._joiner is None:
                self._disconnect()
                return
            # Each close, not only the first: a close cut short between the
            # two (Ctrl-C) left the join waiting out its whole timeout,
            # and the next close with it. The join holds the client: the
            # pointer is still valid.
            self._closing = True
            lib().dcpx_client_interrupt(ctypes.c_void_p(self._ptr), 1)
            if self._joiner == threading.get_ident():
                return
        # Polled, the lock not held (the join's end takes it): interrupted
        # here, the join still disconnects as it ends.
        while self._joiner is not None:
            time.sleep(0.005)
        with self._state:
            if self._joiner is None:  # whatever the join's end did or not
                self._disconnect()  # (a no-op once it is done)
                self._closing = False

    def _disconnect(self) -> None:
        """dcpx_disconnect, _ptr cleared on the C call's line, with no call
        between (see Member._free_left); with _state held."""
        p = self._ptr
        if p is not None:
            fn, arg = lib().dcpx_disconnect, ctypes.c_void_p(p)
            self._ptr = None; fn(arg)  # noqa: E702 (one line: above)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def __reduce_ex__(self, protocol: Any) -> Any:
        # A copy would hold the same C pointer: a second close() frees it
        # twice, and another process (spawn) would use an address that
        # means nothing there. Each process connects itself.
        raise TypeError("a dcpx.Client cannot be pickled or copied: pass "
                        "its socket path and connect in the process that "
                        "uses it (dcpx.Client(socket))")


def connect(socket: Optional[str] = None) -> Client:
    """``Client(socket)``."""
    return Client(socket)


@dataclass(eq=False, repr=False)
class Member:
    """One rank's membership of one group (``dcpx_member``); made by
    :meth:`Client.join`. A context manager that leaves the group.

    Not thread-safe (give each engine thread its own member), except that
    :meth:`poll` may run on another thread while push/merge run. A push,
    push_list, merge or recover made while another thread is inside one of
    them on the same member raises :class:`Busy` and does nothing (the
    library's refusal, ``DCPX_E_BUSY``): the running call goes on, and the
    rank does not fail. Whatever
    the threads do, Python never touches a freed member: after
    :meth:`leave` (and :meth:`close`, ``with``, garbage collection) every
    call raises :class:`StateError`, and calls still running on other
    threads (or under a signal handler that left) finish first: the last
    of them frees the member. :meth:`poll`, :meth:`health`,
    :meth:`async_error` and :meth:`recover` run one at a time (so
    :meth:`health` waits while :meth:`recover` runs on another thread).
    """
    _ptr: Optional[int]
    client: Client
    #: the group's shape, with local_topk resolved (to read: the calls
    #: check and allocate by the shape joined with, whatever is set here)
    shape: Shape
    #: the options this member joined with (to read, as ``shape``)
    options: JoinOptions
    #: the member's name for the torch custom ops
    handle: int = field(init=False)

    def __post_init__(self) -> None:
        self.handle = next(_handles)
        self._token: Any = None
        # The call path reads these (no enum or ctypes objects per call),
        # never self.shape or self.options, which the caller may change: a
        # topk set smaller made merge allocate outputs that libdcpx wrote
        # past, a rows set larger let a call through to a refusal that
        # failed the rank.
        self._cuda = int(self.options.backend) == int(Backend.CUDA)
        self._where_t: Tuple[str, int] = \
            ("cuda", int(self.options.device)) if self._cuda else ("cpu", -1)
        self._shape = Shape(**self.shape.__dict__)
        self._rows, self._topk, self._local_topk = \
            self._shape.rows, self._shape.topk, self._shape.local_topk
        self._rank = int(self.options.rank)
        self._group = self.options.group
        self._backend = Backend(self.options.backend)
        self._lib = lib()
        # In-flight C calls (leave waits for them), and the lock of the
        # calls that drive the daemon link (poll, health, recover, ...).
        # Reentrant: a signal handler may leave() while this thread holds
        # it (calls are made under it: a plain lock deadlocked there).
        self._lock = threading.RLock()
        self._busy = 0
        # The pointer of a member that left and is not freed yet: while
        # calls ran (the last one frees it), or until dcpx_leave is called
        # (_free_left), so that a signal's exception on the way leaves it
        # to __del__ rather than losing it.
        self._left: Optional[int] = None
        # the thread that claimed _left (_claim_left), or None
        self._freeing: Optional[int] = None
        self._warning: Optional[str] = None  # set by Client.join
        self._link = threading.Lock()
        _members[self.handle] = weakref.ref(self)
        self._owns = True  # last: a __post_init__ cut short frees nothing

    # -- properties -----------------------------------------------------
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world(self) -> int:
        return self._shape.world

    @property
    def backend(self) -> Backend:
        return self._backend

    @property
    def closed(self) -> bool:
        return self._ptr is None

    @property
    def warning(self) -> Optional[str]:
        """dcpxd's warning about the group's shape from the join reply
        (``dcpx_member_warning``; see :meth:`Shape.warning`), or None."""
        return self._warning

    def _begin(self) -> int:
        """The member's pointer for one C call (end it with :meth:`_end`);
        StateError once it left."""
        with self._lock:
            p = self._ptr
            if p is None:
                raise StateError(context="the member has left its group")
            self._busy += 1
        return p

    def _call(self, fn: Any, *args: Any) -> int:
        """fn(member, *args), a C call marked in flight (:meth:`_begin`)."""
        p = self._begin()
        try:
            return fn(p, *args)
        finally:
            self._end()

    def _link_call(self, fn: Any, *args: Any) -> int:
        """:meth:`_call` for the calls that drive the daemon link (poll,
        health, recover, ...): one at a time."""
        p = self._begin()
        try:
            with self._link:
                return fn(p, *args)
        finally:
            self._end()

    def _end(self) -> None:
        with self._lock:
            self._busy -= 1
            mine = self._claim_left()
        if mine:  # left while this call ran, the last call: free it now
            self._free_left()

    def _claim_left(self) -> bool:
        """With _lock held: True for the one thread that is to free the
        left member (_left set, no call in flight): a leave and the last
        call's end on two threads never both free it. The thread that
        claimed it may claim it again: its leave, cut by a signal's
        exception before it freed, frees on its next leave (_free_left
        frees once, whoever retries)."""
        me = threading.get_ident()
        if self._busy or self._left is None or \
                self._freeing not in (None, me):
            return False
        self._freeing = me
        return True

    def _free_left(self) -> int:
        """dcpx_leave of the pointer in _left, once, whatever exceptions
        signal handlers raise meanwhile: clearing _left and the C call are
        one line with no call between them (CPython raises a handler's
        exception only at a call, a function's start or a loop's jump; a
        tracer, at a line's start), so one comes before both (the pointer
        stays in _left, for __del__) or after both (freed once).
        Only by the thread that claimed it (_claim_left), or by __del__
        (nothing else holds the member then). Returns its code (0 when
        nothing was left)."""
        p = self._left
        if p is None:
            return 0
        fn, arg = self._lib.dcpx_leave, ctypes.c_void_p(p)
        self._left = None; r = fn(arg)  # noqa: E702 (one line: above)
        return int(r)

    def _raise(self, r: int, what: str) -> None:
        """Raises the error of a push/merge's code r: with the library's
        reason when it refused the call (:meth:`last_error`: the argument
        and the rule); for Failed and Aborted with why the rank or group
        stopped."""
        if r == Busy.code:
            # another thread is inside a call of this member: the reason
            # and the state are that call's, not to be read here
            check(r, f"{what}: {_BUSY}")
        why = self.last_error()
        if why:
            what = why
        if r in (Failed.code, Aborted.code):
            try:
                why = _REASON_TEXT.get(self.async_error().reason)
            except Exception:  # left meanwhile: the bare code says enough
                why = None
            if why:
                what += f" ({why}; call recover())"
        elif why and r != StateError.code:
            # A refusal (bad arguments, a failed launch) fails the rank:
            # every later call raises Failed until recover() (a refusal
            # for the call order, State, does not).
            try:  # this rank's own failed bit (not just an aborted group)
                failed = bool((self.async_error().failed_mask
                               >> self.rank) & 1)
            except Exception:  # left meanwhile
                failed = False
            if failed:
                what += " (this rank is now failed: call recover())"
        check(r, what)

    def __repr__(self) -> str:
        return (f"Member(group={self._group!r}, rank={self.rank}, "
                f"shape={self._shape}, backend={self.backend.name}"
                f"{', left' if self.closed else ''})")

    # -- the calls --------------------------------------------------------
    def _stream(self, stream: Any) -> Optional[int]:
        if not self._cuda:
            if stream is not None:  # checked as on the GPU, then unused
                A.stream_handle(stream)
            return None
        if stream is None:
            return A.current_stream_of_device(self._where_t[1])
        return A.stream_handle(stream)

    def push(self, logits: Any, row_ends: Any, *, call_tag: int = 0,
             stream: Any = None) -> Any:
        """Pushes this rank's local top-N of every row (``dcpx_push``).

        logits: ``[rows][len]`` bf16 bits, C-contiguous; row_ends:
        ``[rows]`` int32 (row t is valid up to ``row_ends[t]``), on the
        member's device. ``rows`` may be below ``shape.rows``.
        Under ``torch.compile`` this is the ``dcpx::push`` op and returns a
        token that :meth:`merge` orders itself after; otherwise None. The
        op runs on torch's current stream: ``stream=`` is refused there
        (a builtin ``NotImplementedError``, :class:`NotSupported`'s base,
        which Dynamo can raise; under ``fullgraph=True`` torch's
        ``Unsupported`` carries its text; use ``with
        torch.cuda.stream(s):``).
        """
        if _is_compiling():
            _no_stream_compiled(stream, "push")
            tok = _torch_ops.push(self, logits, row_ends, call_tag)
            self._token = tok
            return tok
        rows, stride = self._check_rows(logits, row_ends, "push")
        cin = call_in(rows, A.ptr(logits), stride, A.ptr(row_ends),
                      call_tag=_tag(call_tag))
        r = self._call(self._lib.dcpx_push, ctypes.byref(cin),
                       self._stream(stream))
        if r < 0:
            self._raise(r, "dcpx_push")
        return None

    def push_list(self, values: Any, indices: Any, row_ends: Any, *,
                  check_order: bool = False, call_tag: int = 0,
                  stream: Any = None) -> None:
        """Pushes lists the engine already has instead of selecting them
        from the logits (``dcpx_push_list``); :meth:`merge` follows as
        after :meth:`push`, with the logits (a rescue reads them).

        values: ``[rows][N]`` bf16 bits, indices: ``[rows][N]`` int32, N
        the group's ``local_topk``, both C-contiguous on the member's
        device; row t's full entries first, in ascending index, each below
        ``row_ends[t]``, no NaN; a negative index marks an empty entry
        (only empty ones may follow). From ``torch.topk``::

            v, i = torch.topk(logits, N, dim=1)   # in score order
            i, p = i.sort(dim=1)                  # ascending index
            m.push_list(v.gather(1, p), i.int(), row_ends)

        The result is the exact top-K when every list is the rank's
        local top-N with ties to the lower index (``torch.topk`` does not
        promise that order among equal values); otherwise it is exact for
        the lists given (docs/PROTOCOL.md 5.8). The library checks the
        indices (ascending, each once, below the row end) and NaN;
        ``check_order`` is accepted and changes nothing (the order is
        always checked). Raises :class:`RangeError` for a bad list (the
        rank is then FAILED: :meth:`recover`), :class:`InvalidArgument`
        for a wrong shape or a ``check_order`` that is not a bool (True,
        False or a numpy.bool_; not an int, 0 and 1 included),
        :class:`NotSupported` on the NCCL transport (nothing done, the
        rank not failed: :meth:`push` works).
        """
        if check_order is not True and check_order is not False:
            check_order = _flag(check_order, "push_list: check_order")
        if self._ptr is None:
            raise StateError(context="the member has left its group")
        where = self._where_t
        N = self._local_topk
        A.check_array(values, "values", A.BF16, 2, where)
        rows, n = values.shape
        if n != N:
            raise InvalidArgument(context=f"push_list: values has {n} "
                                  f"columns, the group's local_topk is {N}")
        A.check_array(indices, "indices", A.I32, 2, where, (rows, N))
        A.check_array(row_ends, "row_ends", A.I32, 1, where, (rows,))
        if rows > self._rows:
            raise RangeError(context=f"push_list: {rows} rows, more than "
                             f"the group's rows={self._rows}")
        cin = call_in(rows, None, 0, A.ptr(row_ends),
                      call_tag=_tag(call_tag))
        li = DcpxListsC(ctypes.sizeof(DcpxListsC), rows, N,
                        1 if check_order else 0, A.ptr(values),
                        A.ptr(indices))
        r = self._call(self._lib.dcpx_push_list, ctypes.byref(cin),
                       ctypes.byref(li), self._stream(stream))
        if r < 0:
            self._raise(r, "dcpx_push_list")

    def merge(self, logits: Any, row_ends: Any, req_id: Any,
              block_table: Any, out: Optional[Sequence[Any]] = None, *,
              ids: bool = True, sat: bool = False, call_tag: int = 0,
              stream: Any = None, token: Any = None) -> MergeResult:
        """The exact top-K of every row, this rank's outputs
        (``dcpx_merge``); ``logits``/``row_ends`` are those of the matching
        :meth:`push`.

        req_id: ``[rows]`` int32, the block-table row of each row;
        block_table: ``[bt_rows][bt_cols]`` int32, at least 1 x 1 (an
        empty table is refused before any work, :class:`InvalidArgument`,
        where libdcpx would fail every row of a 0-row table with
        ``DCPX_E_RANGE``: docs/PROTOCOL.md 5.7). ``out``: a
        :class:`MergeResult` (or tuple) of preallocated outputs
        (rows_out ``[rows][K]`` int32, valid_out ``[rows]`` int32, ids_out
        ``[rows][K]`` int32 or None, sat_word ``[rows]`` uint32/int32 or
        None), each in memory of its own (one that overlaps another
        output or an input is refused: :class:`InvalidArgument`); None
        allocates them like ``logits`` (ids_out if ``ids``, sat_word if
        ``sat``; each a bool, True, False or a numpy.bool_, else
        :class:`InvalidArgument`: not an int, 0 and 1 included). Raises
        :class:`Failed` / :class:`Aborted` (then :meth:`recover`),
        :class:`RangeError`, ...; with the CUDA
        backend a failed row shows as ``valid_out[t] == -1`` instead.
        When it raises, the outputs it allocated are lost with it; pass
        ``out`` to keep the rows that did complete (a :class:`RangeError`
        for one row's ``req_id`` leaves the others exact in ``out``).
        """
        if ids is not True and ids is not False:
            ids = _flag(ids, "merge: ids")
        if sat is not True and sat is not False:
            sat = _flag(sat, "merge: sat")
        if _is_compiling():
            _no_stream_compiled(stream, "merge")
            return _torch_ops.merge(self, logits, row_ends, req_id,
                                   block_table, out, ids, sat, call_tag,
                                   token if token is not None
                                   else self._token)
        rows, stride = self._check_rows(logits, row_ends, "merge")
        bt_rows, bt_cols = self._check_table(logits, rows, req_id,
                                             block_table)
        res = self._outputs(logits, rows, out, ids, sat,
                            (row_ends, req_id, block_table))
        ptr = A.ptr
        cin = call_in(rows, ptr(logits), stride, ptr(row_ends), ptr(req_id),
                      ptr(block_table), bt_rows, bt_cols, _tag(call_tag))
        cout = merge_out(ptr(res.rows_out), ptr(res.valid_out),
                         ptr(res.ids_out), ptr(res.sat_word))
        r = self._call(self._lib.dcpx_merge, ctypes.byref(cin),
                       ctypes.byref(cout), self._stream(stream))
        if r < 0:
            self._raise(r, "dcpx_merge")
        return res

    def prepare(self, logits: Any, row_ends: Any, req_id: Any,
                block_table: Any, out: Optional[Sequence[Any]] = None, *,
                ids: bool = True, sat: bool = False,
                stream: Any = None) -> "PreparedCall":
        """Checks a call's buffers once and binds them: the returned
        :class:`PreparedCall`'s ``push()`` / ``merge()`` then cost little
        more than the C calls, for an engine that reuses the same
        (persistent) buffers every layer and step. ``stream`` (CUDA): None
        takes the current torch stream at each call. Refill the buffers
        in place: a call over a buffer resized, reshaped or given other
        storage since, or over a numpy output made read-only since, raises
        :class:`InvalidArgument` (prepare again). ``ids`` and ``sat`` as
        for :meth:`merge` (bools)."""
        ids = _flag(ids, "prepare: ids")
        sat = _flag(sat, "prepare: sat")
        rows, stride = self._check_rows(logits, row_ends, "prepare")
        bt_rows, bt_cols = self._check_table(logits, rows, req_id,
                                             block_table)
        res = self._outputs(logits, rows, out, ids, sat,
                            (row_ends, req_id, block_table))
        return PreparedCall(self, (logits, row_ends, req_id, block_table),
                            res, rows, stride, bt_rows, bt_cols,
                            None if stream is None
                            else A.stream_handle(stream))

    # -- argument checks (before any work) ------------------------------
    def _where(self) -> Tuple[str, int]:
        return self._where_t

    def _check_rows(self, logits: Any, row_ends: Any,
                    what: str) -> Tuple[int, int]:
        if self._ptr is None:
            raise StateError(context="the member has left its group")
        where = self._where_t
        A.check_array(logits, "logits", A.BF16, 2, where)
        rows, width = logits.shape
        A.check_array(row_ends, "row_ends", A.I32, 1, where, (rows,))
        if rows > self._rows:
            raise RangeError(context=f"{what}: {rows} rows, more than the "
                             f"group's rows={self._rows}")
        if width < 1:
            raise InvalidArgument(context=f"{what}: logits has no columns")
        return rows, width

    def _check_table(self, logits: Any, rows: int, req_id: Any,
                     block_table: Any) -> Tuple[int, int]:
        where = self._where_t
        A.check_array(req_id, "req_id", A.I32, 1, where, (rows,))
        A.check_array(block_table, "block_table", A.I32, 2, where)
        bt_rows, bt_cols = block_table.shape
        if bt_rows < 1 or bt_cols < 1:
            raise InvalidArgument(context="block_table is empty")
        if bt_rows > 0xFFFFFFFF or bt_cols > 0xFFFFFFFF:
            raise InvalidArgument(context=_BT_BIG.format(bt_rows, bt_cols))
        return bt_rows, bt_cols

    def _outputs(self, like: Any, rows: int, out: Optional[Sequence[Any]],
                 ids: bool, sat: bool,
                 inputs: Tuple[Any, ...] = ()) -> MergeResult:
        K = self._topk
        if out is None:
            return MergeResult(
                A.empty(like, (rows, K), A.I32), A.empty(like, (rows,), A.I32),
                A.empty(like, (rows, K), A.I32) if ids else None,
                A.empty(like, (rows,), A.U32) if sat else None)
        if type(out) is not MergeResult:
            try:
                out = MergeResult(*out)
            except TypeError:
                raise InvalidArgument(
                    context="out must be (rows_out, valid_out[, ids_out"
                            "[, sat_word]])") from None
        where = self._where_t
        A.check_array(out.rows_out, "out.rows_out", A.I32, 2, where,
                      (rows, K), writable=True)
        A.check_array(out.valid_out, "out.valid_out", A.I32, 1, where,
                      (rows,), writable=True)
        if out.ids_out is not None:
            A.check_array(out.ids_out, "out.ids_out", A.I32, 2, where,
                          (rows, K), writable=True)
        if out.sat_word is not None:
            A.check_array(out.sat_word, "out.sat_word", A.U32, 1, where,
                          (rows,), writable=True)
        A.check_no_overlap(
            (("out.rows_out", out.rows_out), ("out.valid_out", out.valid_out),
             ("out.ids_out", out.ids_out), ("out.sat_word", out.sat_word)),
            tuple(zip(("logits", "row_ends", "req_id", "block_table"),
                      (like,) + tuple(inputs))))
        return out

    # -- health, recovery, lifetime ----------------------------------------
    def poll(self) -> int:
        """Keeps the link to dcpxd alive (``dcpx_poll``); call once per
        step, off the hot path. Returns 0 when attached; a negative code
        (NotConnected -107, ConnectionRefused -111, ...) while not attached:
        that affects no call, so it is returned, not raised."""
        return int(self._link_call(self._lib.dcpx_poll))

    def health(self) -> Health:
        """This member's view of its group (``dcpx_health``)."""
        h = DcpxHealthInfoC()
        h.size = ctypes.sizeof(DcpxHealthInfoC)
        check(self._link_call(self._lib.dcpx_health, ctypes.byref(h)),
              "dcpx_health")
        return Health(**{f.name: int(getattr(h, f.name))
                         for f in fields(Health)})

    def last_error(self) -> str:
        """Why the member refused its last call (the argument and the rule,
        ``dcpx_member_last_error``), or "" when it did not refuse it for its
        arguments or order."""
        try:
            why = self._call(self._lib.dcpx_member_last_error)
        except StateError:  # left: no call to speak of
            return ""
        return why.decode("utf-8", "replace") if why else ""

    def async_error(self) -> AsyncError:
        """The member's sticky state, why, and the failed rows of its last
        call (``dcpx_member_async_error``): reads the control page only,
        no device sync."""
        e = DcpxAsyncErrorC()
        e.size = ctypes.sizeof(DcpxAsyncErrorC)
        check(self._link_call(self._lib.dcpx_member_async_error,
                              ctypes.byref(e)), "dcpx_member_async_error")
        rows = [w * 64 + b for w in range(64) if e.row_mask[w]
                for b in range(64) if (e.row_mask[w] >> b) & 1]
        return AsyncError(int(e.state), Reason(e.reason), int(e.abort),
                          int(e.failed_mask), int(e.generation),
                          int(e.rows), rows, bool(e.rows_exact))

    def recover(self, timeout_ms: int = 20000, stream: Any = None) -> None:
        """After Failed/Aborted (or rows with valid_out -1): acknowledges
        and waits up to ``timeout_ms`` for the group's reset
        (``dcpx_recover``; the CUDA backend synchronizes ``stream``, by
        default the current torch stream, first). With the NCCL transport
        every rank then makes a new communicator (a replacement rank calls
        this right after its join; CUDA graphs captured before must be
        captured again). Raises TimedOut (its message names the ranks
        that no live process holds, or says that every rank is held and
        some has not called recover(), or that no dcpxd is attached), or
        NcclError when no new communicator could be made: the rank is then
        failed and the group aborts again, so calling recover() again
        retries with a fresh id. As with join, Ctrl-C stops the wait
        within about 50 ms (``dcpx_member_interrupt``; calling recover()
        again goes on with the recovery); not stopped: with NCCL, the new
        communicator's setup at the end (bounded by the join timeout)."""
        s = None
        if self.backend == Backend.CUDA:
            s = A.stream_handle(stream) if stream is not None else \
                A.current_stream_of_device(self._where_t[1])
        elif stream is not None:  # checked as on the GPU, then unused
            A.stream_handle(stream)
        ms = _ranged(timeout_ms, 0, 0xFFFFFFFF, "recover: timeout_ms")
        self._token = None
        L = self._lib
        p = self._begin()
        try:
            with self._link:
                r = _interruptible(
                    lambda: L.dcpx_recover(p, s, ms),
                    lambda on: L.dcpx_member_interrupt(p, on),
                    lambda code: None)  # an ack sent stands: call again
        finally:
            self._end()
        if r == TimedOut.code:
            raise TimedOut(code=r, context=self._recover_stuck(ms))
        check(r, f"dcpx_recover: {_BUSY}" if r == Busy.code
              else "dcpx_recover")

    def _recover_stuck(self, ms: int) -> str:
        """Why a recovery timed out, as far as the control page says."""
        what = f"dcpx_recover: the group was not reset within {ms} ms"
        try:
            h = self.health()
        except DcpxError:
            return what
        if not h.daemon_link:  # the joined words are the last dcpxd's
            return (f"{what}: not attached to dcpxd (down or restarting; "
                    "this rank acknowledges once it has reattached)")
        absent = [d for d in range(h.world) if not (h.joined_mask >> d) & 1]
        if absent:
            return (f"{what}: no live process holds rank(s) "
                    f"{', '.join(map(str, absent))} (dcpxd waits for their "
                    "replacements to join)")
        return (f"{what}: every rank is held; some have not called "
                "recover() (dcpxctl health shows the acknowledgements)")

    def leave(self) -> None:
        """Leaves the group and frees the member (``dcpx_leave``);
        idempotent; never waits for a call running on another thread.
        Later calls raise :class:`StateError`; calls still running on
        other threads finish (a :meth:`recover` waiting there is stopped
        at once and raises :class:`Interrupted`, so that the rank leaves
        now, not at its timeout), and the last of them frees the member (with
        the CUDA backend the freeing first waits for the member's work on
        its device). Should an exception from a signal handler cut a
        call's bookkeeping short, the member is freed when it is garbage
        collected instead. Leave together: a rank that leaves while
        a peer still merges the last call takes the group down under that
        peer (its merge raises :class:`Aborted`); synchronize the ranks
        first."""
        with self._lock:
            p = self._ptr
            if p is not None:
                # in _left until freed: the last call still running frees
                # it, or this thread does below
                self._left, self._ptr = p, None
                if self._busy:
                    # A recover on another thread would hold the rank in
                    # the group for up to its timeout: stop its wait (it
                    # raises Interrupted; push and merge do not look at
                    # the flag).
                    self._lib.dcpx_member_interrupt(ctypes.c_void_p(p), 1)
            mine = self._claim_left()
        _members.pop(self.handle, None)  # each time: a cut leave skipped it
        self._token = None
        if mine:
            check(self._free_left(), "dcpx_leave")

    close = leave

    def __reduce_ex__(self, protocol: Any) -> Any:
        # As Client's: the C member is this process's (a copy would leave
        # it twice; another process cannot use it).
        raise TypeError("a dcpx.Member cannot be pickled or copied: each "
                        "process connects and joins itself")

    def __enter__(self) -> "Member":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.leave()

    def __del__(self) -> None:
        if not getattr(self, "_owns", False):
            return  # __post_init__ cut short: Client.join frees the pointer
        # No torch op finds it by its handle from now on (the weak
        # reference lives until this returns).
        _members.pop(self.handle, None)
        # A leave deferred to a running call whose end was lost (an
        # exception from a signal handler between the call's start and its
        # try block), or cut short before its dcpx_leave: nothing runs once
        # the member is collected (a running call holds it), so free it
        # now. A signal's exception here (Python would only print it) cuts
        # one try; the next goes on from where it stopped.
        for _ in range(8):
            try:
                self.leave()
                self._free_left()
                return
            except BaseException:  # noqa: B902 (see above)
                continue


class PreparedCall:
    """A push/merge pair over buffers checked once (:meth:`Member.prepare`).
    Refill the bound arrays in place between calls; ``out`` holds the
    merge's results. It keeps the arrays (and the member) alive. Every
    call first checks that each bound array still has the address, shape
    and layout that prepare saw: one resized (``resize_``, numpy's
    ``resize``), given other storage (``set_``, ``.data =``) or reshaped
    in place since is refused with :class:`InvalidArgument` naming it,
    before any work (prepare again); so is a numpy output made read-only
    since (``flags.writeable = False``), as :meth:`Member.merge` refuses
    one ("out.rows_out is read-only")."""

    __slots__ = ("member", "arrays", "out", "_push", "_merge", "_in", "_out",
                 "_stream", "_cuda", "_wpush", "_wall")

    def __init__(self, m: Member, arrays: Tuple[Any, ...], out: MergeResult,
                 rows: int, stride: int, bt_rows: int, bt_cols: int,
                 stream: Optional[int]) -> None:
        p = A.ptr
        logits, row_ends, req_id, block_table = arrays
        self.member = m
        self.arrays = arrays
        self.out = out
        self._push = m._lib.dcpx_push
        self._merge = m._lib.dcpx_merge
        # The v1 structs, built once; a call sets only call_tag.
        self._in = call_in(rows, p(logits), stride, p(row_ends), p(req_id),
                           p(block_table), bt_rows, bt_cols)
        self._out = merge_out(p(out.rows_out), p(out.valid_out),
                              p(out.ids_out), p(out.sat_word))
        self._stream = stream
        self._cuda = m._cuda
        named = tuple(zip(("logits", "row_ends", "req_id", "block_table"),
                          arrays)) + \
            tuple(zip(("out.rows_out", "out.valid_out", "out.ids_out",
                       "out.sat_word"), out))
        self._wpush = A.watch(named[:2])  # what a push reads
        self._wall = A.watch(named[:4], named[4:])  # outputs: writable too

    def _moved(self, name: str) -> None:
        x = dict(zip(("logits", "row_ends", "req_id", "block_table",
                      "out.rows_out", "out.valid_out", "out.ids_out",
                      "out.sat_word"), self.arrays + tuple(self.out)))[name]
        if name.startswith("out.") and A.read_only(x):
            # as a plain merge refuses it (Member._outputs)
            raise InvalidArgument(context=f"{name} is read-only")
        raise InvalidArgument(
            context=f"PreparedCall: {name} was resized, reshaped or given "
                    "other storage since Member.prepare (its address, "
                    "shape or layout changed): refill the bound arrays in "
                    "place, or prepare again")

    def _s(self) -> Optional[int]:
        if self._stream is not None or not self._cuda:
            return self._stream
        return A.current_stream_of_device(self.member._where_t[1])

    def push(self, call_tag: int = 0) -> None:
        """``dcpx_push`` over the bound buffers."""
        moved = A.moved(self._wpush)
        if moved is not None:
            self._moved(moved)
        mb = self.member
        m = mb._begin()
        try:
            self._in.call_tag = _tag(call_tag)
            r = self._push(m, ctypes.byref(self._in), self._s())
        finally:
            mb._end()
        if r < 0:
            mb._raise(r, "dcpx_push")

    def merge(self, call_tag: int = 0) -> MergeResult:
        """``dcpx_merge`` into ``out``; returns ``out``."""
        moved = A.moved(self._wall)
        if moved is not None:
            self._moved(moved)
        mb = self.member
        m = mb._begin()
        try:
            self._in.call_tag = _tag(call_tag)
            r = self._merge(m, ctypes.byref(self._in),
                            ctypes.byref(self._out), self._s())
        finally:
            mb._end()
        if r < 0:
            mb._raise(r, "dcpx_merge")
        return self.out

    def __call__(self, call_tag: int = 0) -> MergeResult:
        """push, then merge (one in-flight mark for both)."""
        moved = A.moved(self._wall)
        if moved is not None:
            self._moved(moved)
        mb = self.member
        m = mb._begin()
        try:
            self._in.call_tag = _tag(call_tag)
            s = self._s()
            r = self._push(m, ctypes.byref(self._in), s)
            if r >= 0:
                r = self._merge(m, ctypes.byref(self._in),
                                ctypes.byref(self._out), s)
                if r < 0:
                    mb._raise(r, "dcpx_merge")
        finally:
            mb._end()
        if r < 0:
            mb._raise(r, "dcpx_push")
        return self.out


# ---- the CPU reference ---------------------------------------------------

def ref_call(shape: Shape, logits: Sequence[Any], row_ends: Sequence[Any],
             rank: int, req_id: Any, block_table: Any, *, ids: bool = True,
             sat: bool = True, stats: Optional[List[int]] = None,
             lists: Optional[Sequence[Any]] = None) -> MergeResult:
    """One whole call as every backend must compute it, for rank ``rank``
    (``dcpx_ref_call``): the oracle. ``logits[r]`` is rank r's
    ``[rows][stride]`` bf16 array (numpy, all the same shape),
    ``row_ends[r]`` its ``[rows]`` int32 row ends; req_id and block_table
    are rank ``rank``'s. Returns numpy outputs; ``stats`` (a list of
    three ints, or a 1-D numpy ``uint64`` array: the C counters' type;
    another dtype raises :class:`DtypeError`) is added to, as the C
    function does. ``lists``: None, or
    per rank None or a ``(values, indices)`` pair as
    :meth:`Member.push_list` takes them: that rank's round-1 lists are
    those (the result "exact for the lists given", docs/PROTOCOL.md
    5.8). ``ids`` and ``sat`` (whether to return ids_out and sat_word)
    are bools: True, False or a numpy.bool_, else
    :class:`InvalidArgument` (not an int, 0 and 1 included)."""
    import numpy as np
    ids = _flag(ids, "ref_call: ids")
    sat = _flag(sat, "ref_call: sat")
    if stats is not None:
        _ref_stats_ok(stats)
    if not isinstance(shape, Shape):
        raise InvalidArgument(context="ref_call: shape must be a dcpx.Shape")
    s = shape.resolved()
    s.check()  # names the field and the rule (C's refusal names neither)
    W = s.world
    for x in (logits, row_ends):
        if not hasattr(x, "__len__") or len(x) != W:
            raise InvalidArgument(context=f"ref_call needs {W} logits and "
                                  "row_ends arrays (a sequence of one per "
                                  "rank)")
    lg = [A.to_numpy_host(x, "logits", A.BF16, 2) for x in logits]
    rows, stride = lg[0].shape
    for x in lg:
        if x.shape != (rows, stride):
            raise InvalidArgument(context="ref_call: logits of different "
                                  "shapes")
    en = [A.to_numpy_host(x, "row_ends", A.I32, 1) for x in row_ends]
    for x in en:
        if x.shape != (rows,):
            raise InvalidArgument(context="ref_call: row_ends shape")
    req = A.to_numpy_host(req_id, "req_id", A.I32, 1)
    bt = A.to_numpy_host(block_table, "block_table", A.I32, 2)
    if req.shape != (rows,):
        raise InvalidArgument(context="ref_call: req_id shape")
    # What dcpx_ref_call refuses with a bare code, named here.
    rank = _ranged(rank, 0, 0xFFFFFFFF, "ref_call rank")
    if rank >= W:
        raise InvalidArgument(context=f"ref_call: rank {rank} is not below "
                              f"world {W}")
    if rows > s.rows:
        raise RangeError(context=f"ref_call: {rows} rows, more than the "
                         f"shape's rows={s.rows}")
    if bt.size == 0:
        raise InvalidArgument(context="ref_call: block_table is empty")
    if max(bt.shape) > 0xFFFFFFFF:
        raise InvalidArgument(context="ref_call: " + _BT_BIG.format(
            *bt.shape))
    _ref_rows_in_range(s, stride, en, req, bt)
    K = s.topk
    res = MergeResult(np.empty((rows, K), np.int32),
                      np.empty((rows,), np.int32),
                      np.empty((rows, K), np.int32) if ids else None,
                      np.empty((rows,), np.uint32) if sat else None)
    lp = (ctypes.c_void_p * W)(*[x.ctypes.data for x in lg])
    ep = (ctypes.c_void_p * W)(*[x.ctypes.data for x in en])
    st = DcpxRefStatsC()
    cs = s._c()
    keep, lsp = _ref_lists(lists, W, rows, s.local_topk)
    rin = DcpxRefInC(ctypes.sizeof(DcpxRefInC), rows, rank, 0, stride,
                     ctypes.cast(lp, ctypes.c_void_p).value,
                     ctypes.cast(ep, ctypes.c_void_p).value, A.ptr(req),
                     A.ptr(bt), bt.shape[0], bt.shape[1], lsp)
    cout = merge_out(A.ptr(res.rows_out), A.ptr(res.valid_out),
                     A.ptr(res.ids_out), A.ptr(res.sat_word))
    r = lib().dcpx_ref_call(ctypes.byref(cs), ctypes.byref(rin),
                            ctypes.byref(cout), ctypes.byref(st))
    if r == RangeError.code:  # what is left once _ref_rows_in_range passed
        raise RangeError(context=_REF_RANGE.format(
            bt.shape[1], s.block_size, "" if lists is None
            else _REF_RANGE_LISTS))
    check(r, "dcpx_ref_call")
    if stats is not None:
        # a numpy uint64 counter plus a Python int is a float64 under
        # numpy < 2 (2**60 + 1 lost its 1): add uint64s to it
        u = np.uint64 if A.is_numpy(stats) else int
        stats[0] += u(st.rows)
        stats[1] += u(st.rescue_rows)
        stats[2] += u(st.saturated)
    return res


def _ref_stats_ok(stats: Any) -> None:
    """Refuses a ref_call ``stats`` that cannot hold the C counters
    (dcpx_ref_stats: three uint64): not a mutable sequence of three, or
    an array of another dtype, whose elements wrapped or were cut
    silently (uint8 wrapped at 256, a float array lost precision), of
    another rank than 1, or read-only."""
    if not hasattr(stats, "__setitem__") or not hasattr(stats, "__len__") \
            or len(stats) < 3:
        raise InvalidArgument(context="ref_call: stats must be a list of "
                              "three ints (or a numpy uint64 array)")
    dt = getattr(stats, "dtype", None)
    if dt is None:
        return
    name = str(dt).replace("torch.", "")
    if name != "uint64":
        raise DtypeError(context=f"ref_call: stats is an array of {name}; "
                         "the counters are uint64 (dcpx_ref_stats): pass "
                         "np.zeros(3, np.uint64) or a list")
    if len(getattr(stats, "shape", ())) != 1:
        raise InvalidArgument(context="ref_call: stats must be 1-D, got "
                              f"shape {tuple(stats.shape)}")
    if A.read_only(stats):
        raise InvalidArgument(context="ref_call: stats is read-only")


def _ref_rows_in_range(s: Shape, stride: int, row_ends: List[Any],
                       req: Any, bt: Any) -> None:
    """What dcpx_ref_call refuses as DCPX_E_RANGE with a bare code, named
    before the call: a row_end over max_local or the stride, a req_id
    outside the block table's rows."""
    import numpy as np
    lim = min(s.max_local, stride)
    for r, x in enumerate(row_ends):
        bad = np.flatnonzero((x < 0) | (x > lim))
        if bad.size:
            t = int(bad[0])
            raise RangeError(context=f"ref_call: row_ends[{r}][{t}] = "
                             f"{int(x[t])} is outside 0..{lim} (max_local "
                             f"{s.max_local}, stride {stride})")
    bad = np.flatnonzero((req < 0) | (req >= bt.shape[0]))
    if bad.size:
        t = int(bad[0])
        raise RangeError(context=f"ref_call: req_id[{t}] = {int(req[t])} is "
                         "outside the block table's rows "
                         f"0..{bt.shape[0] - 1}")


#: dcpx_ref_call's DCPX_E_RANGE after _ref_rows_in_range: the reference
#: refuses the whole call (its outputs are not defined).
_REF_RANGE = ("dcpx_ref_call: a selected KV position of some row lies past "
              "the block table's {} columns of block_size {}, or maps to a "
              "negative block or a KV row beyond int32{}")
_REF_RANGE_LISTS = (", or a given list breaks a rule of dcpx_lists (an "
                    "index at or above its row_end, a NaN value, indices not "
                    "strictly ascending, a full entry after an empty one; "
                    "DCPX_DEBUG=warn logs the rank and row of such a list)")


def _ref_lists(lists: Optional[Sequence[Any]], W: int, rows: int,
               N: int) -> Tuple[List[Any], Optional[int]]:
    """dcpx_ref_in.lists for ref_call: the arrays to keep alive, and the
    address of the [W] array of dcpx_lists pointers (None: no lists)."""
    if lists is None:
        return [], None
    if not hasattr(lists, "__len__") or len(lists) != W:
        raise InvalidArgument(context=f"ref_call needs {W} lists (or None)")
    keep: List[Any] = []
    ptrs = (ctypes.c_void_p * W)()
    for r, pair in enumerate(lists):
        if pair is None:
            continue
        try:
            values, indices = pair
        except (TypeError, ValueError):
            raise InvalidArgument(context=f"ref_call lists[{r}] must be "
                                  "None or a (values, indices) pair") from None
        v = A.to_numpy_host(values, "values", A.BF16, 2)
        i = A.to_numpy_host(indices, "indices", A.I32, 2)
        if i.shape != v.shape:  # C reads rows * n of each
            raise InvalidArgument(
                context=f"ref_call lists[{r}]: indices {tuple(i.shape)} "
                        f"!= values {tuple(v.shape)}")
        if v.shape != (rows, N):
            raise InvalidArgument(
                context=f"ref_call lists[{r}]: values {tuple(v.shape)}, "
                        f"the call needs (rows, local_topk) = ({rows}, {N})")
        li = DcpxListsC(ctypes.sizeof(DcpxListsC), v.shape[0], v.shape[1],
                        0, A.ptr(v), A.ptr(i))
        keep += [v, i, li]
        ptrs[r] = ctypes.addressof(li)
    keep.append(ptrs)
    return keep, ctypes.addressof(ptrs)


def ref_local_list(logits: Any, cap: int) -> List[Tuple[int, int]]:
    """A rank's local top-``cap`` list of one row (``dcpx_ref_local_list``)
    as ``[(ord16, l), ...]`` in ascending l; ``1 <= cap <= MAX_TOPK``,
    at most ``MAX_LOCAL`` logits."""
    import numpy as np
    # dcpx_ref_local_list's rules, named here (its refusal is a bare
    # code; a longer row's length was cut to 32 bits)
    cap = _ranged(cap, 1, MAX_TOPK, "ref_local_list cap")
    x = A.to_numpy_host(logits, "logits", A.BF16, 1)
    if x.shape[0] > MAX_LOCAL:
        raise InvalidArgument(context=f"ref_local_list: logits has "
                              f"{x.shape[0]} elements, more than "
                              f"MAX_LOCAL={MAX_LOCAL}")
    words = np.zeros(max(int(lib().dcpx_row_words(cap)), 1), np.uint32)
    n = check(lib().dcpx_ref_local_list(A.ptr(x), x.shape[0], cap,
                                        A.ptr(words)), "dcpx_ref_local_list")
    out = []
    o, l = ctypes.c_uint32(), ctypes.c_uint32()
    for j in range(n):
        check(lib().dcpx_word_decode(A.ptr(words), cap, j, ctypes.byref(o),
                                     ctypes.byref(l)), "dcpx_word_decode")
        out.append((o.value, l.value))
    return out
