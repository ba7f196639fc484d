"""A member used from several threads: leave() while another thread is
inside a call waits for that call (it used to free the member under it:
a segfault or heap corruption), later calls raise StateError; the link
calls (poll, health, ...) run one at a time. And a zero-row call with
empty torch tensors (data_ptr() 0) is a call, not a refused one."""

import threading
import warnings
import time

import numpy as np
import pytest

import dcpx
from _ranks import small_args


_args = small_args


def _pair(daemon, group, timeout_ns):
    """Both ranks of a W=2 group, joined from two threads."""
    shape = dcpx.Shape(world=2, rows=4, topk=16, local_topk=4, block_size=4,
                       max_local=128)
    got = {}

    def join(r):
        got[r] = dcpx.Client(daemon.socket).join(
            shape, rank=r, group=group, timeout_ns=timeout_ns)

    ts = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    return got[0], got[1]


def test_leave_under_a_merge_on_another_thread(daemon, group):
    m0, m1 = _pair(daemon, group, 400_000_000)  # waits give up at 0.4 s
    lg, en, req, bt = _args()
    seen = []

    def merge():
        m0.push(lg, en)
        try:
            m0.merge(lg, en, req, bt)  # rank 1 never pushes: it waits
            seen.append("returned")
        except dcpx.DcpxError as e:
            seen.append(type(e).__name__)

    t = threading.Thread(target=merge)
    t.start()
    time.sleep(0.1)  # the merge is waiting inside libdcpx now
    t0 = time.monotonic()
    m0.leave()  # never blocks: the merge frees the member as it returns
    assert time.monotonic() - t0 < 0.1
    assert m0.closed and m0._left is not None
    with pytest.raises(dcpx.StateError):
        m0.push(lg, en)
    with pytest.raises(dcpx.StateError):
        m0.poll()
    t.join(10)
    assert not t.is_alive()
    assert seen == ["Failed"], seen
    assert m0._left is None  # freed by the merge's thread
    m1.leave()


def test_call_while_another_thread_merges_is_busy(daemon, group):
    """A push, merge or recover on a member while another thread's merge
    waits inside libdcpx raises Busy and does nothing: the rank does not
    fail, and the running merge completes exactly once rank 1 comes.
    (Before, the push went through, storing other lists under the merge.)
    """
    m0, m1 = _pair(daemon, group, 5_000_000_000)
    lg, en, req, bt = _args()
    other = (lg + 7).astype(np.uint16)  # other lists, were they stored
    res = {}

    def merge():
        try:
            res["r"] = m0.merge(lg, en, req, bt)  # waits for rank 1
        except dcpx.DcpxError as e:
            res["e"] = e

    m0.push(lg, en)
    t = threading.Thread(target=merge)
    t.start()
    end = time.monotonic() + 10
    busy = None
    while busy is None and time.monotonic() < end:
        try:
            m0.push(other, en)
        except dcpx.Busy as e:  # inside the merge now
            busy = e
        except dcpx.StateError:  # not yet: the first push is pending
            time.sleep(0.001)
    assert busy is not None, "never refused as busy"
    assert "another thread is inside a call of this member" in str(busy)
    inside = "another thread is inside a call of this member"
    with pytest.raises(dcpx.Busy, match=inside):
        m0.merge(other, en, req, bt)
    with pytest.raises(dcpx.Busy, match=inside):  # was "dcpx_recover: busy"
        m0.recover(timeout_ms=10)
    assert t.is_alive()
    m1.push(lg, en)
    r1 = m1.merge(lg, en, req, bt)
    t.join(10)
    assert "r" in res, res
    ref = dcpx.ref_call(m0.shape, [lg, lg], [en, en], 0, req, bt)
    for r in (res["r"], r1):
        assert (np.asarray(r.rows_out) == np.asarray(ref.rows_out)).all()
        assert (np.asarray(r.valid_out) == np.asarray(ref.valid_out)).all()
    assert m0.async_error().state == 0 and m0.last_error() == ""
    m0.leave()
    m1.leave()


def test_two_threads_hammer_one_member(member):
    """Two threads push and merge on one member: each call completes or
    raises Busy (the other thread is inside one) or StateError (the call
    order across the two); every merge that completes is exact."""
    lg, en, req, bt = _args()
    ref = dcpx.ref_call(member.shape, [lg], [en], 0, req, bt)
    seen = {"ok": 0, "Busy": 0, "StateError": 0}
    bad = []
    stop = time.monotonic() + 1.0

    def loop():
        while time.monotonic() < stop and not bad:
            for what in ("push", "merge"):
                try:
                    if what == "push":
                        member.push(lg, en)
                    else:
                        r = member.merge(lg, en, req, bt)
                        if not (np.asarray(r.rows_out) ==
                                np.asarray(ref.rows_out)).all():
                            bad.append("a wrong result")
                    seen["ok"] += 1
                except (dcpx.Busy, dcpx.StateError) as e:
                    seen[type(e).__name__] += 1
                except Exception as e:  # noqa: BLE001 - the test's verdict
                    bad.append(repr(e))

    ts = [threading.Thread(target=loop) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert bad == [], bad[:3]
    assert seen["ok"] > 0, seen
    assert member.async_error().state == 0


def test_leave_from_a_signal_handler_mid_call(daemon, group, small_shape):
    """A SIGALRM handler that leaves runs on the calling thread right after
    a C call, before the call's bookkeeping: leave must not wait for its
    own thread (it used to: a deadlock)."""
    import signal
    lg, en, req, bt = _args()
    m = dcpx.Client(daemon.socket).join(small_shape, rank=0, group=group)
    old = signal.signal(signal.SIGALRM, lambda *a: m.leave())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        end = time.monotonic() + 5
        with pytest.raises(dcpx.StateError):
            while time.monotonic() < end:
                m.push(lg, en)
                m.merge(lg, en, req, bt)
        assert m.closed and m._left is None and m._busy == 0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_leave_under_a_poll_and_health_loop(daemon, group):
    m0, m1 = _pair(daemon, group, 1_000_000_000)
    errors = []
    stop = threading.Event()

    def loop():
        while not stop.is_set():
            try:
                m0.poll()
                m0.health()
                m0.async_error()
            except dcpx.StateError:
                return
            except Exception as e:  # noqa: BLE001 - the test's verdict
                errors.append(repr(e))
                return

    ts = [threading.Thread(target=loop) for _ in range(3)]
    for t in ts:
        t.start()
    time.sleep(0.2)
    m0.leave()
    stop.set()
    for t in ts:
        t.join(10)
        assert not t.is_alive()
    assert errors == []
    m1.leave()


def test_prepared_call_after_leave(daemon, group, small_shape):
    lg, en, req, bt = _args()
    m = dcpx.Client(daemon.socket).join(small_shape, rank=0, group=group)
    pc = m.prepare(lg, en, req, bt)
    pc()
    m.leave()
    with pytest.raises(dcpx.StateError):
        pc.push()
    with pytest.raises(dcpx.StateError):
        pc.merge()


def test_zero_rows_torch(member):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    lg0 = torch.empty((0, 128), dtype=torch.int16)
    en0 = torch.empty(0, dtype=torch.int32)
    assert lg0.data_ptr() == 0  # what used to reach libdcpx as NULL
    bt = torch.arange(4 * 32, dtype=torch.int32).reshape(4, 32)
    member.push(lg0, en0)
    res = member.merge(lg0, en0, en0, bt)
    assert tuple(res.rows_out.shape) == (0, 16)
    assert member.async_error().state == 0
    lg, en, req, btn = _args()
    member.push(lg, en)
    res = member.merge(lg, en, req, btn)
    ref = dcpx.ref_call(member.shape, [lg], [en], 0, req, btn)
    assert (np.asarray(res.rows_out) == np.asarray(ref.rows_out)).all()


def test_one_client_two_joins_and_close_under_a_join(daemon, group):
    """A Client joins one rank at a time: a second thread's join while one
    waits raises Busy (the C client's interrupt flag and error text are
    the whole client's: Ctrl-C on one join stopped the other). close()
    from another thread stops the join in flight, waits for it, then
    disconnects: it freed the C client under the join (use after free;
    the join then read a reused flag and failed at random)."""
    shape = dcpx.Shape(world=2, rows=4, topk=16, local_topk=4, block_size=4,
                       max_local=128)
    c = dcpx.Client(daemon.socket)
    got = {}

    def join0():
        try:  # rank 1 never comes: this waits until close() stops it
            got["m"] = c.join(shape, rank=0, group=group,
                              join_timeout_ms=20_000)
        except dcpx.DcpxError as e:
            got["e"] = e

    t = threading.Thread(target=join0)
    t.start()
    deadline = time.monotonic() + 10
    while c._joiner is None and time.monotonic() < deadline:
        time.sleep(0.005)
    time.sleep(0.1)  # inside dcpx_join
    with pytest.raises(dcpx.Busy) as e:
        c.join(shape, rank=1, group=group)
    assert "one rank at a time" in str(e.value)
    t0 = time.monotonic()
    c.close()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    assert isinstance(got.get("e"), dcpx.StateError), got
    assert "closed during the join" in str(got["e"])
    with pytest.raises(dcpx.StateError):
        c.join(shape, rank=0, group=group)
    assert len({c, dcpx.Client(daemon.socket)}) == 2  # hashable, by identity


@pytest.mark.parametrize("kw", [{"binary": "/bin/false"},
                                {"extra_args": ["--bogus"]},
                                {"binary": "/nonexistent/dcpxd"}])
def test_private_daemon_start_failure_leaves_nothing(libdcpx, kw):
    import os
    import dcpx.testing
    if "binary" not in kw and not dcpx.testing.find_dcpxd():
        pytest.skip("dcpxd not found (set DCPXD)")
    d = dcpx.testing.PrivateDaemon(**kw)
    assert os.path.isdir(d.dir)
    with pytest.raises(RuntimeError):
        d.start(timeout_s=5)
    assert not os.path.exists(d.dir)


def test_close_from_a_signal_handler_during_join(daemon, group):
    """close() in a signal handler on the joining thread stops the join
    (StateError) and returns: the join disconnects as it ends. It waited
    for the join to end, which its own thread could not do: a hang. Two
    close() calls after it are no-ops."""
    import signal
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals go to the main thread")
    shape = dcpx.Shape(world=2, rows=4, topk=16, local_topk=12, block_size=4,
                       max_local=128)
    c = dcpx.Client(daemon.socket)
    old = signal.signal(signal.SIGALRM, lambda *a: c.close())
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        t0 = time.monotonic()
        with pytest.raises(dcpx.StateError) as e:  # rank 1 never comes
            c.join(shape, rank=0, group=group, join_timeout_ms=20_000)
        assert time.monotonic() - t0 < 5
        assert "closed" in str(e.value)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert c._ptr is None
    c.close()
    c.close()


def test_shape_warning_reaches_python(daemon, group):
    """A shape whose every full row rescues (world * local_topk <= topk)
    is valid, and slow: Shape.warning() says so, and the join warns
    (RuntimeWarning, dcpxd's word from the join reply; Member.warning).
    libdcpx had it (dcpx_shape_warning, dcpx_member_warning) and the
    package dropped it."""
    bad = dcpx.Shape(world=8, rows=4, topk=2048, local_topk=256,
                     block_size=4, max_local=4096)
    assert "every full row rescues" in bad.warning()
    ok = dcpx.Shape(world=2, rows=4, topk=16, local_topk=12, block_size=4,
                    max_local=128)
    assert ok.warning() is None
    shape = dcpx.Shape(world=2, rows=4, topk=16, local_topk=4, block_size=4,
                       max_local=128)
    got = {}

    def join(r):
        got[r] = dcpx.Client(daemon.socket).join(shape, rank=r, group=group)

    # (warnings' filters are the process's: recorded here, for both threads)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ts = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
    assert sum(issubclass(x.category, RuntimeWarning) and
               "every full row rescues" in str(x.message) for x in w) == 2, w
    for r in (0, 1):
        assert got[r].warning and "every full row rescues" in got[r].warning
        got[r].leave()


def test_shape_changed_during_join(daemon, group):
    """The Shape a join was given, changed by the caller while the join
    waits, changes nothing: the member holds the shape the group was
    joined with. It read the caller's object again after the wait: with
    topk set from 16 to 12 meanwhile, merge accepted a [rows][12] output
    that libdcpx wrote 16 ints a row into (64 bytes past it); with rows
    set to None the join completed in C and then raised, leaving the
    rank joined with nobody to drive it."""
    shape = dcpx.Shape(world=2, rows=4, topk=16, local_topk=12,
                       block_size=4, max_local=128)
    mine = dcpx.Shape(**shape.__dict__)
    got = {}

    def join0():
        got[0] = dcpx.Client(daemon.socket).join(mine, rank=0, group=group)

    t = threading.Thread(target=join0)
    t.start()
    time.sleep(0.3)  # rank 0 waits for rank 1 now
    mine.topk, mine.rows = 12, None
    m1 = dcpx.Client(daemon.socket).join(shape, rank=1, group=group)
    t.join(30)
    m0 = got[0]
    assert m0.shape == shape and m0.shape is not mine
    lg, en, req, bt = _args()
    buf = np.full(100, 7777, np.int32)
    res = {}

    def call(m, out):
        m.push(lg, en)
        try:
            res[m.rank] = m.merge(lg, en, req, bt, out=out, ids=False)
        except dcpx.DcpxError as e:
            res[m.rank] = e

    short = (buf[:48].reshape(4, 12), np.empty(4, np.int32))
    ts = [threading.Thread(target=call, args=(m0, short)),
          threading.Thread(target=call, args=(m1, None))]
    for x in ts:
        x.start()
    for x in ts:
        x.join(30)
    assert isinstance(res[0], dcpx.InvalidArgument), res[0]
    assert (buf[48:] == 7777).all()
    m0.leave()
    m1.leave()


def test_leave_stops_a_recover_on_another_thread(daemon, group):
    """leave() while another thread waits in recover() stops that wait
    (Interrupted) and the rank leaves the group at once; it stayed joined
    until the recovery's timeout (20 s by default), so its peers waited
    on a rank that had left."""
    m0, m1 = _pair(daemon, group, 200_000_000)
    lg, en, req, bt = _args()
    m0.push(lg, en)
    with pytest.raises(dcpx.Failed):
        m0.merge(lg, en, req, bt)  # rank 1 never pushed
    seen = []

    def recover():
        try:
            m0.recover(timeout_ms=15000)
            seen.append("recovered")
        except dcpx.DcpxError as e:
            seen.append(type(e).__name__)

    t = threading.Thread(target=recover)
    t.start()
    time.sleep(0.3)  # the recover waits for rank 1's acknowledgement
    t0 = time.monotonic()
    m0.leave()
    t.join(10)
    assert not t.is_alive() and seen == ["Interrupted"], seen
    while m1.health().joined_mask & 1 and time.monotonic() - t0 < 5:
        time.sleep(0.02)
    assert not m1.health().joined_mask & 1
    assert time.monotonic() - t0 < 2
    m1.leave()


def test_private_daemon_start_twice(libdcpx):
    """start() while its dcpxd runs raises instead of starting a second
    dcpxd on the same socket and state dir (the first was orphaned)."""
    import dcpx.testing
    if not dcpx.testing.find_dcpxd():
        pytest.skip("dcpxd not found (set DCPXD)")
    d = dcpx.testing.PrivateDaemon().start()
    try:
        pid = d.proc.pid
        with pytest.raises(RuntimeError, match="stop"):
            d.start()
        assert d.proc.pid == pid and d.proc.poll() is None
    finally:
        assert d.stop() == 0
    d.start()  # after stop() it starts again
    assert d.stop() == 0
