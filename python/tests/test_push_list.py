"""Member.push_list (dcpx_push_list) on the host backend: lists equal to
the local top-N give the logits' exact result bit for bit; any valid
lists give the result exact for the lists given (ref_call(lists=...));
the input checks of push and merge, and the list rules."""

import numpy as np
import pytest

import dcpx
from _ranks import compare, inputs, run_ranks, sync, tables


def top_lists(lg, en, N):
    """Every row's local top-N as push_list takes it: (values, indices)
    [rows][N], from the reference's own list (ties to the lower l)."""
    rows = lg.shape[0]
    vals = np.zeros((rows, N), np.uint16)
    idx = np.full((rows, N), -1, np.int32)
    for t in range(rows):
        for j, (_, l) in enumerate(dcpx.ref_local_list(lg[t, :en[t]], N)):
            vals[t, j], idx[t, j] = lg[t, l], l
    return vals, idx


def any_lists(lg, en, N, seed):
    """Valid lists that are not the local top-N: random ascending subsets
    of the non-NaN elements, full in about half of the rows, values now
    and then unlike the logit."""
    rng = np.random.default_rng(seed)
    rows = lg.shape[0]
    vals = np.zeros((rows, N), np.uint16)
    idx = np.full((rows, N), -1, np.int32)
    for t in range(rows):
        ok = [l for l in range(en[t]) if (lg[t, l] & 0x7FFF) <= 0x7F80]
        n = min(N, len(ok))
        if rng.integers(2):
            n = int(rng.integers(0, n + 1))
        pick = np.sort(rng.choice(ok, n, replace=False)) if n else []
        for j, l in enumerate(pick):
            vals[t, j] = lg[t, l] if rng.integers(4) else \
                0x3F00 + int(rng.integers(0, 0x100))
            idx[t, j] = l
    return vals, idx


def _rank(rank, q, sock, group, shape, calls, kind, given):
    R, L, B = shape.rows, shape.max_local, shape.block_size
    req, bt = tables(rank, R, L, B)
    stats = [0, 0, 0]
    with dcpx.Client(sock) as c, \
            c.join(shape, rank=rank, group=group,
                   timeout_ns=5_000_000_000) as m:
        N = m.shape.local_topk
        for call in range(calls):
            lg, en = inputs(23, call, shape.world, R, L, kind)
            if given:
                lists = [any_lists(lg[r], en[r], N, [call, r])
                         for r in range(shape.world)]
            else:
                lists = [top_lists(lg[r], en[r], N)
                         for r in range(shape.world)]
            v, i = lists[rank]
            m.push_list(v, i, en[rank], check_order=bool(call % 2),
                        call_tag=call)
            res = m.merge(lg[rank], en[rank], req, bt, sat=True,
                          call_tag=call)
            ref = dcpx.ref_call(m.shape, lg, en, rank, req, bt, stats=stats,
                                lists=lists if given else None)
            compare(res, ref, R)
            if given:
                logits_ref = dcpx.ref_call(m.shape, lg, en, rank, req, bt)
                stats.append(int(not np.array_equal(res.ids_out,
                                                    logits_ref.ids_out)))
        assert m.health().ok
        sync()
    return stats


@pytest.mark.parametrize("W,kind,given", [(3, "random", False),
                                          (2, "ties", False),
                                          (4, "skew", False),
                                          (3, "skew", True),
                                          (2, "ties", True)])
def test_push_list_exact(daemon, group, W, kind, given):
    shape = dcpx.Shape(world=W, rows=5, topk=32, local_topk=32 // W + 2,
                       block_size=4, interleave=2, max_local=200)
    out = run_ranks(_rank, W, (daemon.socket, group, shape, 4, kind, given))
    assert sorted(out) == list(range(W))
    if kind != "random":
        assert max(v[1] for v in out.values()) > 0, "no row rescued"
    if given:  # the lists matter: not the logits' result
        assert sum(sum(v[3:]) for v in out.values()) > 0


def _args(rows=4, L=128):
    lg = ((np.arange(rows * L) * 37) % 1000 + 0x3F00).astype(
        np.uint16).reshape(rows, L)
    en = np.full(rows, L, np.int32)
    v, i = top_lists(lg, en, 4)
    return lg, en, v, i


def _still_works(m):
    lg, en, v, i = _args()
    req = np.arange(4, dtype=np.int32)
    bt = np.arange(4 * 32, dtype=np.int32).reshape(4, 32)
    m.push_list(v, i, en, check_order=True)
    res = m.merge(lg, en, req, bt, sat=True)
    compare(res, dcpx.ref_call(m.shape, [lg], [en], 0, req, bt), 4)
    assert m.health().ok


def test_push_list_checks(member):
    lg, en, v, i = _args()
    bad = [
        (dcpx.DtypeError, "values",
         lambda: member.push_list(v.astype(np.float32), i, en)),
        (dcpx.DtypeError, "indices",
         lambda: member.push_list(v, i.astype(np.int64), en)),
        (dcpx.DtypeError, "row_ends",
         lambda: member.push_list(v, i, en.astype(np.int64))),
        (dcpx.InvalidArgument, "local_topk",
         lambda: member.push_list(v[:, :3].copy(), i[:, :3].copy(), en)),
        (dcpx.InvalidArgument, "indices",
         lambda: member.push_list(v, i[:3].copy(), en)),
        (dcpx.InvalidArgument, "row_ends",
         lambda: member.push_list(v, i, en[:3].copy())),
        (dcpx.InvalidArgument, "contiguous",
         lambda: member.push_list(v, np.asfortranarray(i), en)),
    ]
    for cls, what, f in bad:
        with pytest.raises(cls, match=what):
            f()
    # refused before any work: nothing failed
    _still_works(member)


@pytest.mark.parametrize("what", ["index", "nan", "order", "repeated"])
@pytest.mark.parametrize("check_order", [False, True])
def test_push_list_bad_lists(member, what, check_order):
    lg, en, v, i = _args()
    if what == "index":
        i[1, 3] = en[1]
    elif what == "nan":
        v[2, 0] = 0x7FC0
    elif what == "order":
        i[0, 1], i[0, 2] = i[0, 2], i[0, 1]
    else:  # taken unchecked before: that KV row twice in rows_out
        i[0, 2] = i[0, 1]
    with pytest.raises(dcpx.RangeError):
        member.push_list(v, i, en, check_order=check_order)
    # a refused call fails the rank (its peers must know): recover
    assert not member.health().ok
    member.recover(timeout_ms=10000)
    _still_works(member)
