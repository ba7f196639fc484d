"""A rank killed (SIGKILL) mid-call: its peers fail the call, a
replacement process joins as that rank, everyone recovers, and the calls
after are exact."""

import multiprocessing as mp
import os
import signal


import dcpx
from _ranks import compare, inputs, tables

W, CALLS, KILL_AT, VICTIM = 3, 6, 2, 1


def _rank(rank, q, barrier, sock, group, shape, first_call, replacement):
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    exact, failed = 0, 0
    try:
        with dcpx.Client(sock) as c, c.join(shape, rank=rank, group=group,
                                            timeout_ns=5_000_000_000) as m:
            if replacement:  # the group is recovering: take the dead
                m.recover(timeout_ms=20000)  # rank's place, then go on
            for call in range(first_call, CALLS):
                lg, en = inputs(21, call, W, R, L, "skew")
                try:
                    m.push(lg[rank], en[rank], call_tag=call)
                    if call == KILL_AT and rank == VICTIM:
                        os.kill(os.getpid(), signal.SIGKILL)  # pushed only
                    res = m.merge(lg[rank], en[rank], req, bt, sat=True,
                                  call_tag=call)
                except (dcpx.Failed, dcpx.Aborted) as exc:
                    assert call == KILL_AT, f"call {call} failed"
                    failed += 1
                    # The sticky state says why, and which rows failed
                    # (host backend: all of the call's, exactly).
                    e = m.async_error()
                    assert e.state == exc.code, (e, exc.code)
                    assert e.reason in (dcpx.Reason.DEAD_RANK,
                                        dcpx.Reason.TIMEOUT), e
                    assert e.rows_exact and e.rows == R, e
                    assert e.failed_rows == list(range(R)), e
                    m.recover(timeout_ms=20000)
                    e = m.async_error()
                    assert (e.state, e.reason) == (0, dcpx.Reason.NONE), e
                    continue
                compare(res, dcpx.ref_call(shape, lg, en, rank, req, bt), R)
                exact += 1
            barrier.wait(60)  # nobody leaves while a peer still merges
            h = m.health()
        q.put(("ok", rank, (exact, failed, h.generation)))
    except BaseException as e:  # noqa: BLE001
        import traceback
        q.put(("err", rank, traceback.format_exc() + repr(e)))


def test_kill_mid_call_then_recover(daemon, group):
    shape = dcpx.Shape(world=W, rows=4, topk=32, local_topk=0, block_size=4,
                       interleave=1, max_local=512)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    barrier = ctx.Barrier(W)  # the survivors and the replacement
    procs = {r: ctx.Process(target=_rank, args=(r, q, barrier, daemon.socket,
                                                 group, shape, 0, False))
             for r in range(W)}
    for p in procs.values():
        p.start()
    victim = procs[VICTIM]
    victim.join(timeout=60)
    assert victim.exitcode == -signal.SIGKILL, victim.exitcode
    repl = ctx.Process(target=_rank, args=(VICTIM, q, barrier, daemon.socket,
                                           group, shape, KILL_AT + 1, True))
    repl.start()
    out = {}
    try:
        for _ in range(W):
            st, r, v = q.get(timeout=90)
            assert st == "ok", f"rank {r}: {v}"
            out[r] = v
    finally:
        for p in list(procs.values()) + [repl]:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    after = CALLS - KILL_AT - 1
    for r in range(W):
        exact, failed, gen = out[r]
        if r == VICTIM:
            assert (exact, failed) == (after, 0)
        else:
            assert (exact, failed) == (KILL_AT + after, 1)
        assert gen >= 2  # one recovery at least
