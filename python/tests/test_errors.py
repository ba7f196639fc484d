"""Every error class a host build can raise, with bad dtype, shape, rank,
group and call arguments; Failed / Aborted then recover."""

import threading
import time

import numpy as np
import pytest

import dcpx
import dcpx.testing
from _ranks import compare, inputs, run_ranks, small_args, sync, tables

_args = small_args


def _still_works(m):
    lg, en, req, bt = _args()
    m.push(lg, en)
    res = m.merge(lg, en, req, bt, sat=True)
    compare(res, dcpx.ref_call(m.shape, [lg], [en], 0, req, bt), 4)
    assert m.health().ok


def test_bad_dtype(member):
    lg, en, req, bt = _args()
    bad = [
        (lambda: member.push(lg.astype(np.float32), en), "logits"),
        (lambda: member.push(lg.astype(np.int32), en), "logits"),
        (lambda: member.push(lg, en.astype(np.int64)), "row_ends"),
        (lambda: member.push(lg, list(en)), "row_ends"),
        (lambda: member.merge(lg, en, req.astype(np.uint8), bt), "req_id"),
        (lambda: member.merge(lg, en, req, bt.astype(np.float64)),
         "block_table"),
        (lambda: member.merge(lg, en, req, bt, out=(
            np.empty((4, 16), np.int64), np.empty(4, np.int32))),
         "rows_out"),
    ]
    for f, what in bad:
        with pytest.raises(dcpx.DtypeError, match=what) as ei:
            f()
        assert ei.value.code == -22
    # refused before any work: the rank has not failed, calls go on
    _still_works(member)


def test_bad_shape(member):
    lg, en, req, bt = _args()
    with pytest.raises(dcpx.InvalidArgument, match="row_ends"):
        member.push(lg, en[:3])
    with pytest.raises(dcpx.InvalidArgument, match="2-D"):
        member.push(lg[0], en)
    with pytest.raises(dcpx.InvalidArgument, match="contiguous"):
        member.push(np.asfortranarray(lg), en)
    with pytest.raises(dcpx.InvalidArgument, match="req_id"):
        member.merge(lg, en, req[:2], bt)
    with pytest.raises(dcpx.InvalidArgument, match="rows_out"):
        member.merge(lg, en, req, bt, out=(np.empty((4, 15), np.int32),
                                           np.empty(4, np.int32)))
    big = np.zeros((5, 128), np.uint16)
    with pytest.raises(dcpx.RangeError, match="rows"):
        member.push(big, np.zeros(5, np.int32))
    _still_works(member)


def test_call_order(member):
    """A merge with no push before it (or of other rows than the push's),
    and a second push before the merge, are refused at once with
    StateError; the rank does not fail and the calls after are exact (the
    merge used to wait out the group timeout and fail the rank)."""
    lg, en, req, bt = _args()
    t0 = time.monotonic()
    with pytest.raises(dcpx.StateError) as ei:
        member.merge(lg, en, req, bt)
    assert ei.value.code == -1011
    assert time.monotonic() - t0 < 1.0
    assert member.health().ok
    member.push(lg, en)
    with pytest.raises(dcpx.StateError):
        member.push(lg, en)
    # a merge of other rows than the push's (it would leave the other
    # rows' epochs behind: a peer's wait on the next call times out)
    with pytest.raises(dcpx.StateError):
        member.merge(lg[:2], en[:2], req[:2], bt)
    res = member.merge(lg, en, req, bt, sat=True)
    compare(res, dcpx.ref_call(member.shape, [lg], [en], 0, req, bt), 4)
    assert member.health().ok
    _still_works(member)


def test_bad_numbers(member):
    """Integer arguments out of their C range, or not integers, are
    InvalidArgument (recover's timeout used to wrap into a uint32, and a
    string gave a bare ValueError)."""
    for bad in (-1, 1 << 40, "x", 1.5, True):
        with pytest.raises(dcpx.InvalidArgument, match="timeout_ms"):
            member.recover(timeout_ms=bad)
    for bad in ("a", 1 << 40, 2.0):
        with pytest.raises(dcpx.InvalidArgument, match="code"):
            dcpx.strerror(bad)
    assert dcpx.strerror(np.int32(-1011)) == dcpx.strerror(-1011)
    member.recover(timeout_ms=np.uint32(1000))  # healthy: returns at once
    _still_works(member)


def test_range_from_library_then_recover(member):
    """A row_end over max_local is refused by libdcpx (RangeError); the
    refused call fails the rank, which recovers."""
    lg = np.zeros((4, 200), np.uint16)
    en = np.full(4, 200, np.int32)  # > max_local = 128
    assert member.last_error() == ""
    with pytest.raises(dcpx.RangeError,
                       match=r"dcpx_push: .*row_ends\[0\] = 200 is outside "
                             r"0\.\.128") as ei:
        member.push(lg, en)
    assert ei.value.code == -34
    # ... and says that the rank is now failed, and what to do
    assert "now failed: call recover()" in str(ei.value), str(ei.value)
    # the library's reason, without DCPX_DEBUG
    assert "row_ends[0] = 200" in member.last_error()
    h = member.health()
    assert h.failed_mask == 1
    # The next call raises Failed (or Aborted, once dcpxd has seen the
    # FAILED rank and aborted the group: a race), and says why: the
    # refusal, not a wait that timed out (the code's own text), and what
    # to do.
    lg, en, req, bt = _args()
    with pytest.raises((dcpx.Failed, dcpx.Aborted),
                       match="refused an earlier call.*recover") as ei:
        member.push(lg, en)
    assert ei.value.code in (-1007, -1006)
    assert member.last_error() == ""  # not refused: failed
    member.recover(timeout_ms=10000)
    _still_works(member)
    assert member.last_error() == ""


def test_recover_clears_the_reason(member):
    """A successful recovery clears the reason of the refusal it recovered
    from (Member.last_error named the old refusal after it)."""
    with pytest.raises(dcpx.RangeError):
        member.push(np.zeros((4, 200), np.uint16), np.full(4, 200, np.int32))
    assert "row_ends[0] = 200" in member.last_error()
    member.recover(timeout_ms=10000)
    assert member.last_error() == ""


def test_call_order_reason(member):
    """A call refused for its order says why (Member.last_error)."""
    lg, en, req, bt = _args()
    with pytest.raises(dcpx.StateError, match="no dcpx_push"):
        member.merge(lg, en, req, bt)
    assert "no dcpx_push" in member.last_error()
    _still_works(member)
    assert member.last_error() == ""


def test_join_errors(daemon, group):
    c = dcpx.Client(daemon.socket)
    s2 = dcpx.Shape(world=2, rows=2, topk=8, local_topk=2, max_local=64)
    with pytest.raises(dcpx.BadRank) as ei:
        c.join(s2, rank=2, group=group)
    assert ei.value.code == -1003
    with pytest.raises(dcpx.LimitError):
        c.join(dcpx.Shape(world=2, rows=5000, topk=8, local_topk=2,
                          max_local=64), rank=0, group=group)
    # a world or topk beyond the limits with local_topk=0 (the default)
    # is a LimitError too, not a zero field
    for big in (dict(world=17, topk=8), dict(world=1, topk=4097)):
        with pytest.raises(dcpx.LimitError):
            dcpx.Shape(**big).check()
        with pytest.raises(dcpx.LimitError):
            c.join(dcpx.Shape(rows=2, max_local=64, **big), rank=0,
                   group=group)
    with pytest.raises(dcpx.InvalidArgument, match="group name"):
        c.join(s2, rank=0, group="bad name!")
    # the options object is copied: reusing it for another join does not
    # change the member that joined with it (it used to be kept as is)
    o = dcpx.JoinOptions(group=group + "-opts", rank=0)
    with c.join(s1 := dcpx.Shape(world=1, rows=2, topk=8, local_topk=2,
                                 max_local=64), o) as m:
        o.group, o.rank = "other", 3
        assert m.rank == 0 and m.options.group == group + "-opts"
    with pytest.raises(dcpx.InvalidArgument, match="JoinOptions"):
        c.join(s1, {"rank": 0})
    with pytest.raises(dcpx.InvalidArgument):
        c.join(s2, rank=0, group=group, timeout_ns=10)
    with pytest.raises(dcpx.TransportError):
        c.join(s2, rank=0, group=group, transport=dcpx.Transport.NCCL)
    # values past 32 bits are refused, not cut (1 << 32 joined as HOST)
    with pytest.raises(dcpx.InvalidArgument, match="backend"):
        c.join(s2, rank=0, group=group, backend=1 << 32)
    with pytest.raises(dcpx.InvalidArgument, match="transport"):
        c.join(s2, rank=0, group=group, transport=(1 << 32) + 2)
    s1 = dcpx.Shape(world=1, rows=2, topk=8, local_topk=2, max_local=64)
    try:  # a host-only build: NotSupported; CUDA built, no GPU: CudaError
        m = c.join(s1, rank=0, group=group + "-cuda",
                   backend=dcpx.Backend.CUDA, device=0)
    except (dcpx.NotSupported, dcpx.CudaError) as e:
        assert e.code in (-38, -1009)
    else:  # a CUDA build on a GPU machine
        m.leave()
    with pytest.raises(dcpx.TimedOut):  # rank 1 never comes
        c.join(s2, rank=0, group=group + "-t", join_timeout_ms=300)

    # DuplicateRank and ShapeError against a forming group
    got = {}

    def first():
        try:
            with dcpx.Client(daemon.socket).join(
                    s2, rank=0, group=group, join_timeout_ms=5000) as m:
                got["m"] = m.health().world
        except dcpx.DcpxError as e:
            got["e"] = e

    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.3)
    with pytest.raises(dcpx.DuplicateRank):
        c.join(s2, rank=0, group=group)
    other = dcpx.Shape(world=2, rows=2, topk=8, local_topk=3, max_local=64)
    with pytest.raises(dcpx.ShapeError) as ei:
        c.join(other, rank=1, group=group)
    # dcpxd's own reason (dcpx_client_last_error) is in the message
    assert "shape mismatch: local_topk 3" in str(ei.value), ei.value
    # so is libdcpx's, for a shape it refuses itself
    bad = dcpx.Shape(world=2, rows=2, topk=8, local_topk=8, max_local=64)
    with pytest.raises(dcpx.InvalidArgument, match="less than topk"):
        c.join(bad, rank=1, group=group)
    with c.join(s2, rank=1, group=group) as m1:
        t.join()
        assert got.get("m") == 2, got
        assert m1.world == 2 and m1.rank == 1
    c.close()
    with pytest.raises(dcpx.StateError):
        c.join(s2, rank=0, group=group)


def test_left_member(daemon, group, small_shape):
    with dcpx.Client(daemon.socket) as c:
        m = c.join(small_shape, rank=0, group=group)
        m.leave()
        m.leave()
        lg, en, _, _ = _args()
        with pytest.raises(dcpx.StateError):
            m.push(lg, en)
        with pytest.raises(dcpx.StateError):
            m.health()


def _stall_rank(rank, q, sock, group, shape):
    """Rank 1 misses call 0: rank 0 fails (Failed), rank 1 then finds the
    group aborted (Aborted); both recover and call 1 is exact."""
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    seen = []
    with dcpx.Client(sock) as c, c.join(shape, rank=rank, group=group,
                                        timeout_ns=1_000_000_000) as m:
        lg, en = inputs(3, 0, 2, R, L)
        if rank == 0:
            m.push(lg[0], en[0])
            with pytest.raises(dcpx.Failed) as ei:
                m.merge(lg[0], en[0], req, bt)
            seen.append(type(ei.value).__name__)
            assert m.health().failed_mask & 1
        else:
            deadline = time.monotonic() + 10
            while m.health().abort == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
            with pytest.raises(dcpx.Aborted) as ei:
                m.push(lg[1], en[1])
                m.merge(lg[1], en[1], req, bt)
            seen.append(type(ei.value).__name__)
        gen = m.health().generation
        m.recover(timeout_ms=10000)
        assert m.health().generation != gen
        lg, en = inputs(3, 1, 2, R, L)
        m.push(lg[rank], en[rank])
        res = m.merge(lg[rank], en[rank], req, bt)
        compare(res, dcpx.ref_call(shape, lg, en, rank, req, bt), R)
        sync()
    return seen


def test_failed_aborted_recover(daemon, group):
    shape = dcpx.Shape(world=2, rows=3, topk=16, local_topk=0,
                       block_size=4, max_local=256)
    out = run_ranks(_stall_rank, 2, (daemon.socket, group, shape))
    assert out == {0: ["Failed"], 1: ["Aborted"]}


def test_connect_no_socket(tmp_path):
    """No dcpxd at the path: ConnectionRefused naming the path, and saying
    that there is no socket file there."""
    p = str(tmp_path / "none.sock")
    with pytest.raises(dcpx.ConnectionRefused) as e:
        dcpx.Client(p)
    assert p in str(e.value) and "no such socket" in str(e.value)


def test_connect_path_like_and_too_long(daemon, tmp_path):
    """A pathlib.Path socket works as a str does; a path over a Unix
    socket's 107 bytes says so (not "no such socket"); a non-path is
    InvalidArgument."""
    import pathlib
    with dcpx.Client(pathlib.Path(daemon.socket)):
        pass
    long = str(tmp_path / ("x" * 120))
    with pytest.raises(dcpx.RangeError) as e:
        dcpx.Client(long)
    assert "107" in str(e.value) and "no such socket" not in str(e.value)
    with pytest.raises(dcpx.InvalidArgument):
        dcpx.Client(42)


def test_recover_timeout_names_the_absent_rank(daemon, group):
    """A recovery that cannot complete because a rank left (no live
    process holds it: dcpxd waits for a replacement) times out naming
    that rank, not just "timed out"."""
    shape = dcpx.Shape(world=2, rows=2, topk=16, local_topk=0,
                       block_size=4, max_local=128)
    got = {}

    def join(rank):
        got[rank] = dcpx.Client(daemon.socket).join(shape, rank=rank,
                                                    group=group)
    ts = [threading.Thread(target=join, args=(r,)) for r in (0, 1)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    m0, m1 = got[0], got[1]
    m1.leave()  # a leave aborts the formed group; rank 1 is now absent
    deadline = time.monotonic() + 10
    while not m0.async_error().abort and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(dcpx.TimedOut) as e:
        m0.recover(timeout_ms=300)
    assert "rank(s) 1" in str(e.value) and "replacement" in str(e.value)
    m0.leave()


def test_recover_timeout_with_dcpxd_down(group, small_shape):
    """A recovery that times out while no dcpxd is there says so: the
    control page's joined words are the last dcpxd's (every rank held),
    and "some have not called recover()" blamed ranks, here none but
    this one, for an acknowledgement that no dcpxd could take."""
    if not dcpx.testing.find_dcpxd():
        pytest.skip("dcpxd not found (set DCPXD)")
    d = dcpx.testing.PrivateDaemon().start()
    try:
        c = dcpx.Client(d.socket)
        m = c.join(small_shape, rank=0, group=group)
        with pytest.raises(dcpx.RangeError):  # fails the rank
            m.push(np.zeros((4, 200), np.uint16), np.full(4, 200, np.int32))
    finally:
        assert d.stop() == 0
    with pytest.raises(dcpx.TimedOut) as e:
        m.recover(timeout_ms=300)
    assert "not attached to dcpxd" in str(e.value), str(e.value)
    assert "every rank is held" not in str(e.value), str(e.value)
    m.leave()
    c.close()
