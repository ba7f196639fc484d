"""Exactness: W rank processes through a private dcpxd, every output
bit-exact with dcpx_ref_call (bound through the package)."""

import numpy as np
import pytest

import dcpx
from _ranks import compare, inputs, run_ranks, sync, tables


def _rank(rank, q, sock, group, shape, calls, kind, rows_of, torch_cpu):
    R, L, B = shape.rows, shape.max_local, shape.block_size
    req, bt = tables(rank, R, L, B)
    stats = [0, 0, 0]
    exact = 0
    with dcpx.Client(sock) as c, \
            c.join(shape, rank=rank, group=group,
                   timeout_ns=5_000_000_000) as m:
        assert m.shape.local_topk > 0
        for call in range(calls):
            rows = rows_of(call)
            lg, en = inputs(11, call, shape.world, R, L, kind)
            mine = np.ascontiguousarray(lg[rank][:rows])
            ends = np.ascontiguousarray(en[rank][:rows])
            rq = np.ascontiguousarray(req[:rows])
            if torch_cpu:
                import torch
                t_lg = torch.from_numpy(mine.view(np.int16)).view(
                    torch.bfloat16)
                t_en = torch.from_numpy(ends)
                m.push(t_lg, t_en, call_tag=call)
                res = m.merge(t_lg, t_en, torch.from_numpy(rq),
                              torch.from_numpy(bt), sat=True, call_tag=call)
                assert isinstance(res.rows_out, torch.Tensor)
                res = dcpx.MergeResult(*[x.numpy() for x in res])
            elif call % 2:
                out = dcpx.MergeResult(
                    np.full((rows, shape.topk), 7, np.int32),
                    np.full(rows, 7, np.int32),
                    np.full((rows, shape.topk), 7, np.int32),
                    np.zeros(rows, np.uint32))
                m.push(mine, ends, call_tag=call)
                res = m.merge(mine, ends, rq, bt, out=out, call_tag=call)
                assert res.rows_out is out.rows_out
            else:
                m.push(mine, ends, call_tag=call)
                res = m.merge(mine, ends, rq, bt, sat=True, call_tag=call)
            ref = dcpx.ref_call(shape, [x[:rows] for x in lg],
                                [x[:rows] for x in en], rank, rq, bt,
                                stats=stats)
            compare(res, ref, rows)
            exact += 1
        h = m.health()  # before anyone leaves: nothing failed
        assert h.ok, h
        sync()
        assert h.calls == calls and h.world == shape.world and h.rank == rank
    return exact, stats


# Rows of each call (module level: a spawned rank unpickles them).
def _fewer_rows(call):
    return 6 - (call % 3)


def _four_rows(call):
    return 4


@pytest.mark.parametrize("W,kind", [(2, "random"), (4, "random"),
                                    (3, "ties"), (4, "skew"), (1, "ties")])
def test_exact_processes(daemon, group, W, kind):
    shape = dcpx.Shape(world=W, rows=6, topk=64, local_topk=0,
                       block_size=4, interleave=2, max_local=700)
    calls = 6
    out = run_ranks(_rank, W, (daemon.socket, group, shape, calls, kind,
                               _fewer_rows, False))
    assert sorted(out) == list(range(W))
    assert all(v[0] == calls for v in out.values())
    if kind in ("skew", "ties") and W > 1:
        assert max(v[1][1] for v in out.values()) > 0, "no row rescued"


def test_exact_small_n(daemon, group):
    """N = 1: nearly every row rescues."""
    shape = dcpx.Shape(world=3, rows=4, topk=16, local_topk=1,
                       block_size=1, interleave=1, max_local=300)
    out = run_ranks(_rank, 3, (daemon.socket, group, shape, 4, "random",
                               _four_rows, False))
    assert all(v[1][1] > 0 for v in out.values())


def test_exact_torch_cpu(daemon, group):
    pytest.importorskip("torch", reason="torch is not installed")
    shape = dcpx.Shape(world=2, rows=4, topk=32, local_topk=0,
                       block_size=8, interleave=1, max_local=500)
    out = run_ranks(_rank, 2, (daemon.socket, group, shape, 3, "random",
                               _four_rows, True))
    assert all(v[0] == 3 for v in out.values())


def test_brute_force_sets():
    """The reference itself against a numpy brute force (distinct values:
    compared as sets of gids)."""
    W, R, L, K = 3, 4, 200, 24
    shape = dcpx.Shape(world=W, rows=R, topk=K, local_topk=8, block_size=1,
                       interleave=2, max_local=L)
    rng = np.random.default_rng(5)
    vals = rng.permutation(0x3F00)[:W * R * L] + 0x100  # distinct, >0
    lg = [vals[r * R * L:(r + 1) * R * L].reshape(R, L).astype(np.uint16)
          for r in range(W)]
    en = [np.full(R, L, np.int32) for _ in range(W)]
    req = np.arange(R, dtype=np.int32)
    bt = np.tile(np.arange(L, dtype=np.int32), (R, 1))
    ref = dcpx.ref_call(shape, lg, en, 0, req, bt)
    for t in range(R):
        allv = np.concatenate([lg[r][t] for r in range(W)]).astype(np.int64)
        best = np.argsort(-allv, kind="stable")[:K]
        gids = set()
        for i in best:
            r, l = divmod(int(i), L)
            gids.add((l // 2) * 2 * W + r * 2 + l % 2)
        assert set(ref.ids_out[t].tolist()) == gids


def _prepared_rank(rank, q, sock, group, shape, calls):
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    lg_buf = np.zeros((R, L), np.uint16)  # persistent, refilled in place
    en_buf = np.zeros(R, np.int32)
    with dcpx.Client(sock) as c, c.join(shape, rank=rank, group=group,
                                        timeout_ns=5_000_000_000) as m:
        pc = m.prepare(lg_buf, en_buf, req, bt, sat=True)
        with pytest.raises(dcpx.DtypeError):
            m.prepare(lg_buf.astype(np.float32), en_buf, req, bt)
        for call in range(calls):
            lg, en = inputs(71, call, shape.world, R, L,
                            ("random", "ties", "skew")[call % 3])
            lg_buf[:] = lg[rank]
            en_buf[:] = en[rank]
            res = pc(call_tag=call)
            assert res is pc.out
            compare(res, dcpx.ref_call(shape, lg, en, rank, req, bt), R)
        sync()
    return calls


def test_prepared_call(daemon, group):
    shape = dcpx.Shape(world=2, rows=5, topk=48, local_topk=0,
                       block_size=4, interleave=1, max_local=600)
    out = run_ranks(_prepared_rank, 2, (daemon.socket, group, shape, 6))
    assert out == {0: 6, 1: 6}
