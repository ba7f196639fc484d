"""Helpers of the tests: rank processes, inputs, checks against the
reference."""

import multiprocessing as mp
import os
import sys
import traceback

import numpy as np

import dcpx


def inputs(seed, call, W, R, L, kind="random"):
    """Every rank's logits [R][L] (bf16 bits) and row ends [R] of one call,
    the same in every process."""
    rng = np.random.default_rng([seed, call])
    lg, en = [], []
    for r in range(W):
        if kind == "random":
            x = dcpx.to_bf16_bits(rng.standard_normal((R, L), np.float32))
        elif kind == "ties":
            # few distinct values, zeros of both signs, infinities, NaNs
            pool = np.array([0x3F80, 0x3F80, 0x4000, 0x4000, 0x0000, 0x8000,
                             0x7F80, 0xFF80, 0x7FC0, 0xBF80, 0x4040],
                            np.uint16)
            x = pool[rng.integers(0, len(pool), (R, L))]
        elif kind == "skew":  # one rank holds most of the top: rescues
            hot = (call + r) % W == 0
            base = 0x4100 if hot else 0x3F00
            x = (base + rng.integers(0, 0x60, (R, L))).astype(np.uint16)
        else:
            raise ValueError(kind)
        lg.append(np.ascontiguousarray(x, np.uint16))
        e = rng.integers(0, L + 1, R).astype(np.int32)
        e[rng.integers(0, R)] = L
        en.append(e)
    return lg, en


def small_args(rows=4, L=128):
    """One rank's arguments for the small shapes of the argument and
    thread tests: logits 0.. as bf16 bits, full rows, req_id t, a 4 x 32
    block table."""
    lg = np.arange(rows * L, dtype=np.uint16).reshape(rows, L)
    en = np.full(rows, L, np.int32)
    req = np.arange(rows, dtype=np.int32)
    bt = np.arange(4 * 32, dtype=np.int32).reshape(4, 32)
    return lg, en, req, bt


def tables(rank, R, L, B):
    cols = (L + B - 1) // B
    rng = np.random.default_rng([77, rank])
    bt = np.stack([rng.permutation(cols) + t * cols
                   for t in range(R)]).astype(np.int32)
    req = ((np.arange(R) * 7) % R).astype(np.int32)
    return req, bt


def compare(res, ref, rows):
    """Bit-exact comparison of two MergeResults (numpy) over rows."""
    for name in ("rows_out", "valid_out", "ids_out", "sat_word"):
        a, b = getattr(res, name), getattr(ref, name)
        if a is None or b is None:
            continue
        a, b = np.asarray(a)[:rows], np.asarray(b)[:rows]
        if a.dtype != b.dtype:
            a = a.view(b.dtype)
        if not np.array_equal(a, b):
            bad = np.nonzero((a != b).reshape(rows, -1).any(axis=1))[0]
            raise AssertionError(f"{name} differs in rows {bad.tolist()}")


def _default_ctx():
    """fork, unless this process may have initialised CUDA (an earlier GPU
    test of the same pytest run, through torch or through libdcpx's CUDA
    backend, which torch.cuda.is_initialized() does not see): a forked
    child cannot use CUDA then, and torch.compile touches it, so spawn
    wherever torch sees a GPU. DCPX_TEST_START_METHOD overrides."""
    forced = os.environ.get("DCPX_TEST_START_METHOD")
    if forced:
        return forced
    torch = sys.modules.get("torch")
    if torch is not None and (torch.cuda.is_initialized() or
                              torch.cuda.is_available()):
        return "spawn"
    return "fork"


def run_ranks(target, world, args=(), timeout=120, ctx=None, extra=()):
    """Runs target(rank, q, *args) in `world` processes (plus `extra`
    (rank, target, args) processes); returns {rank: result}. A rank puts
    ("ok", rank, value) or ("err", rank, traceback) on q. ctx: the
    multiprocessing start method (default: _default_ctx())."""
    c = mp.get_context(ctx or _default_ctx())
    q = c.Queue()
    barrier = c.Barrier(world)
    procs = [c.Process(target=_wrap, args=(target, r, q, barrier) +
                       tuple(args)) for r in range(world)]
    for p in procs:
        p.start()
    out, errs = {}, []
    import queue as _q
    try:
        for _ in range(world):
            try:
                st, r, v = q.get(timeout=timeout)
            except _q.Empty:
                errs.append("timed out waiting for the ranks")
                break
            if st == "ok":
                out[r] = v
            else:
                errs.append(f"rank {r}: {v}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
    assert not errs, "\n".join(errs)
    return out


BARRIER = None


def sync(timeout=60):
    """Waits for every rank of run_ranks (call it before leaving: a rank
    that leaves while a peer still merges the last call aborts the
    group, and that peer's merge returns Aborted)."""
    if BARRIER is not None:
        BARRIER.wait(timeout)


def _wrap(target, rank, q, barrier, *args):
    global BARRIER
    BARRIER = barrier
    try:
        q.put(("ok", rank, target(rank, q, *args)))
    except BaseException:
        q.put(("err", rank, traceback.format_exc()))
