"""An exception from a signal handler (Ctrl-C's KeyboardInterrupt) may
come at any point of Python code. These tests raise one at each line, in
turn, of Member.leave, Client.close while a join waits, and the undo of
an interrupted join, and check what must hold whatever the point: each C
member is freed exactly once (never lost: its rank would stay in its
group; never twice: a double free), and the Client stays usable.

A tracer (sys.settrace) raises the KeyboardInterrupt at the n-th line
event of the code under test, for n = 1, 2, ... until the code runs to
its end without it. That is a superset of where a real signal's
exception comes (at a call, a function's start or a loop's jump), except
within one line.
"""

import collections
import ctypes
import gc
import linecache
import sys
import threading
import time

import pytest

import dcpx
import dcpx.core


def _inside(frame, codes):
    """Whether frame runs one of codes, or is called from one."""
    while frame is not None:
        if frame.f_code in codes:
            return True
        frame = frame.f_back
    return False


class _Lines:
    """Counts the line events where a signal's exception can come: not a
    `with` statement's line seen again (CPython reports the block's exit,
    the __exit__ call, as that line: a tracer's exception there skips the
    __exit__, and a real signal's comes after it)."""

    def __init__(self):
        self.seen = 0
        self._with = set()

    def count(self, frame):
        line = linecache.getline(frame.f_code.co_filename, frame.f_lineno)
        if line.lstrip().startswith("with "):
            key = (id(frame), frame.f_lineno)
            if key in self._with:
                return False
            self._with.add(key)
        self.seen += 1
        return True


def _interrupt():
    raise KeyboardInterrupt


def _raise_at(n, fn, skip=(), only=None, handler=_interrupt):
    """fn() with handler() (by default: raise KeyboardInterrupt, as Ctrl-C's
    handler does) run at its n-th line event, as a signal handler would
    run there. Frames of the codes in skip, and their callees, are not
    counted (they stand for C calls); with `only`, just the lines of those
    codes are. Returns (raised, lines seen)."""
    lines = _Lines()

    def tracer(frame, event, arg):
        if _inside(frame, skip):
            return None
        if event == "line" and (only is None or frame.f_code in only) and \
                lines.count(frame) and lines.seen == n:
            sys.settrace(None)  # the handler runs untraced
            handler()
        return tracer

    sys.settrace(tracer)
    try:
        fn()
        return False, lines.seen
    except KeyboardInterrupt:
        return True, lines.seen
    finally:
        sys.settrace(None)


def _raise_after_call(n, fn, only, handler=_interrupt):
    """fn() with handler() (by default: raise KeyboardInterrupt) run at the
    n-th point where CPython runs signal handlers in the code of `only`:
    as a function of it starts, and as a call it makes (to C or Python)
    returns. A stricter tracer (_raise_at) also cuts between two
    statements with no call between them, where no real signal's handler
    runs. Returns (whether the handler ran, points seen)."""
    seen = [0]

    def prof(frame, event, arg):
        caller = frame.f_back.f_code if frame.f_back is not None else None
        if (event == "call" and frame.f_code in only) or \
                (event == "c_return" and frame.f_code in only) or \
                (event == "return" and caller in only):
            seen[0] += 1
            if seen[0] == n:
                sys.setprofile(None)
                handler()

    sys.setprofile(prof)
    try:
        fn()
    except KeyboardInterrupt:
        pass
    finally:
        sys.setprofile(None)
    return seen[0] >= n, seen[0]


class _CountingLib:
    """libdcpx, with dcpx_leave counted per member pointer (and never
    called twice for one: the count fails the test instead)."""

    def __init__(self, real):
        self._real = real
        self.freed = collections.Counter()

    def __getattr__(self, name):
        return getattr(self._real, name)

    def dcpx_leave(self, p):
        key = p.value if hasattr(p, "value") else p
        self.freed[key] += 1
        if self.freed[key] > 1:
            return 0
        return self._real.dcpx_leave(p)


_SKIP = (_CountingLib.__getattr__.__code__, _CountingLib.dcpx_leave.__code__)


@pytest.fixture
def counting(monkeypatch):
    """libdcpx with dcpx_leave counted (_CountingLib), as the package's."""
    c = _CountingLib(dcpx.core.lib())
    monkeypatch.setattr(dcpx.core, "lib", lambda: c)
    return c


def test_leave_cut_at_any_line_frees_once(daemon, group, small_shape,
                                          counting):
    c = dcpx.Client(daemon.socket)
    cut = 0
    for n in range(1, 200):
        m = c.join(small_shape, rank=0, group=group)
        p = m._ptr
        counting.freed.clear()  # malloc may give the address again
        h = m.handle
        raised, _ = _raise_at(n, m.leave, _SKIP)
        m.leave()  # again: it finishes what the cut one left
        assert counting.freed[p] == 1, \
            f"a leave cut at line {n}, then a leave: dcpx_leave called " \
            f"{counting.freed[p]} times for the member"
        assert h not in dcpx.core._members
        del m
        gc.collect()
        assert counting.freed[p] == 1
        if not raised:
            break
        cut += 1
    assert cut >= 5  # the sweep went through leave's lines
    # the rank is free: the same group and rank join again at once
    with c.join(small_shape, rank=0, group=group):
        pass
    c.close()


def test_a_handler_that_leaves_at_any_line_of_a_call(daemon, group,
                                                     small_shape, counting):
    """A signal handler that calls leave() (to shut down on SIGTERM, say)
    at any point of a poll() where a handler can run: never a deadlock
    (the member's lock is held around calls; a plain Lock deadlocked
    there), and the member is freed once, never under the call."""
    only = tuple(f.__code__ for f in (
        dcpx.Member.poll, dcpx.Member._link_call, dcpx.Member._begin,
        dcpx.Member._end, dcpx.Member._claim_left, dcpx.Member._free_left))
    c = dcpx.Client(daemon.socket)
    cut = 0
    for n in range(1, 200):
        m = c.join(small_shape, rank=0, group=group)
        p = m._ptr
        counting.freed.clear()
        out = []

        def run():
            try:
                out.append(_raise_after_call(n, m.poll, only, m.leave)[0])
            except dcpx.StateError:  # left as the poll began
                out.append(True)

        t = threading.Thread(target=run, daemon=True)  # (the tracer is
        t.start()                                      # per thread)
        t.join(10)
        assert not t.is_alive(), f"leave at line {n} of poll: deadlock"
        m.leave()
        assert counting.freed[p] == 1, (n, counting.freed[p])
        if not out[0]:  # the poll ran out of points before the n-th
            break
        cut += 1
    assert cut >= 5
    c.close()


def test_join_end_cut_while_close_waits(daemon, group):
    """Ctrl-C at each point of a join's own code (its claim, its end) where
    a signal's exception can come, while another thread's close() waits
    for it: the close returns with the Client disconnected, and later
    joins raise StateError (a cut as the join's end disconnected left
    close() to return with the Client connected)."""
    shape = dcpx.Shape(world=2, rows=4, topk=16, local_topk=12,
                       block_size=4, max_local=128)
    only = (dcpx.Client.join.__code__, dcpx.Client._disconnect.__code__)
    cut = 0
    for n in range(1, 100):
        c = dcpx.Client(daemon.socket)

        def closer():
            for _ in range(400):  # until the join waits in C, if it does
                if c._joiner is not None:
                    break
                time.sleep(0.005)
            time.sleep(0.02)
            c.close()

        t = threading.Thread(target=closer)
        t.start()
        try:
            raised, _ = _raise_after_call(n, lambda: c.join(
                shape, rank=0, group=f"{group}-{n}", join_timeout_ms=20000),
                only)
        except dcpx.StateError:  # closed during the join: its usual end
            raised = False
        t.join(30)
        assert not t.is_alive()
        assert c._ptr is None and not c._closing, \
            f"join cut at line {n}: close() returned, the Client connected"
        with pytest.raises(dcpx.StateError):
            c.join(shape, rank=0, group=group)
        if not raised:
            break
        cut += 1
    assert cut >= 3


def test_close_cut_at_any_line_during_a_join(daemon, group):
    shape = dcpx.Shape(world=2, rows=4, topk=16, local_topk=12,
                       block_size=4, max_local=128)
    cut = 0
    for n in range(1, 400):
        c = dcpx.Client(daemon.socket)
        got = []

        def joiner():
            try:
                got.append(c.join(shape, rank=0, group=f"{group}-{n}",
                                  join_timeout_ms=20000))
            except BaseException as e:  # noqa: B902 (what the join raised)
                got.append(e)

        t = threading.Thread(target=joiner)
        t.start()
        for _ in range(400):  # until the join waits in C
            if c._joiner is not None:
                break
            time.sleep(0.005)
        assert c._joiner is not None
        time.sleep(0.01)
        raised, _ = _raise_at(n, c.close)
        c.close()  # again, whole: never RuntimeError, never a hang
        t.join(10)
        assert not t.is_alive(), f"close cut at line {n}: the join runs on"
        assert c._ptr is None and c._joiner is None and not c._closing
        assert len(got) == 1 and isinstance(got[0], dcpx.StateError), \
            f"close cut at line {n}: the join gave {got!r}"
        with pytest.raises(dcpx.StateError):
            c.join(shape, rank=0, group=group)
        if not raised:
            break
        cut += 1
    assert cut >= 5


class _JoinLib(_CountingLib):
    """_CountingLib that also says when a dcpx_join returned, and arms
    `then` (a tracer) at the first dcpx_client_interrupt(c, 0): the undo
    of an interrupted join runs right after it."""

    def __init__(self, real):
        super().__init__(real)
        self.joined = threading.Event()
        self.then = None

    def dcpx_join(self, *a):
        r = self._real.dcpx_join(*a)
        self.joined.set()
        return r

    def dcpx_client_interrupt(self, c, on):
        r = self._real.dcpx_client_interrupt(c, on)
        if not on and self.then is not None:
            t, self.then = self.then, None
            sys.settrace(t)
        return r


def test_undo_of_an_interrupted_join_cut_at_any_line(daemon, group,
                                                     small_shape,
                                                     monkeypatch):
    """Ctrl-C as a join completes: the join is undone (the member made
    on the worker leaves) before the KeyboardInterrupt goes on. A second
    one at each line of that undo: the undo is tried again till it is
    done, and the member is freed once."""
    real = dcpx.core.lib()
    c = dcpx.Client(daemon.socket)
    wait_code = dcpx.core._interruptible.__code__
    cut = 0
    for n in range(1, 200):
        jl = _JoinLib(real)
        monkeypatch.setattr(dcpx.core, "lib", lambda: jl)
        lines = _Lines()

        # (not in a __del__ that the collector runs meanwhile: Python
        # prints an exception there, and its first line is no point of
        # the undo's)
        skip = _SKIP + (dcpx.core.Member.__del__.__code__,)

        def second(frame, event, arg):  # the n-th line of the undo
            if _inside(frame, skip):
                return None
            if event == "return" and frame.f_code.co_name == "abandon":
                sys.settrace(None)
            elif event == "line" and lines.count(frame) and lines.seen == n:
                raise KeyboardInterrupt
            return second

        def first(frame, event, arg):  # as the caller waits, once joined
            if event == "line" and frame.f_code is wait_code and \
                    "while not done.acquire" in _line(frame):
                assert jl.joined.wait(5)
                time.sleep(0.02)  # the worker makes the member
                jl.then = second
                sys.settrace(None)
                raise KeyboardInterrupt
            return first

        sys.settrace(first)
        try:
            with pytest.raises(KeyboardInterrupt):
                c.join(small_shape, rank=0, group=group)
        finally:
            sys.settrace(None)
        gc.collect()
        ptrs = list(jl.freed)
        assert len(ptrs) == 1 and jl.freed[ptrs[0]] == 1, \
            f"undo cut at line {n}: dcpx_leave calls {dict(jl.freed)}"
        assert c._joiner is None
        if lines.seen < n:
            break
        cut += 1
    assert cut >= 3
    monkeypatch.undo()
    with c.join(small_shape, rank=0, group=group):  # the rank is free
        pass
    c.close()


def _line(frame):
    return linecache.getline(frame.f_code.co_filename, frame.f_lineno)
