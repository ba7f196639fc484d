#!/usr/bin/env python3
"""torch_baseline.py - the torch.topk baselines that bench/RESULTS.md sets
beside dcpx's kernels, measured the way tests/gpu/bench_kernels measures
those: the median over REPS replays of a CUDA graph of ITERS calls, divided
by ITERS.

  push baseline   torch.topk(local logits [rows, L] bf16, N)
  merge baseline  torch.topk(gathered candidates [rows, W*N] bf16, K)
                  (the values only; an all-gather would come on top)

Also an independent check of dcpx's exactness: for random rows, the set of
indices torch.topk picks over the concatenated logits of W ranks (ties
broken by torch arbitrarily, so rows without ties at the K-th value only)
equals the CPU reference's ids (run through ctypes on libdcpx when
--lib is given).

Usage: torch_baseline.py [--w 8] [--n 512] [--k 2048] [--lib PATH]
"""
import argparse
import ctypes
import statistics
import sys

import torch


def graph_time_us(fn, iters=20, reps=15):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / iters)
    return statistics.median(times)


def check_sets(lib, W, N, K, L, rows, seed=1):
    """dcpx_ref_call ids vs torch.topk over the concatenation, as sets."""
    dcpx = ctypes.CDLL(lib)
    # The v1 structs as the Python package mirrors them (one definition;
    # python/tests/test_api.py checks each against the library's size).
    from dcpx._lib import DcpxMergeOutC, DcpxRefInC, DcpxShapeC

    sh = DcpxShapeC(ctypes.sizeof(DcpxShapeC), W, rows, K, N, 1, 1, L)
    g = torch.Generator().manual_seed(seed)
    # Distinct values per row (positive finite bf16 bit patterns), so
    # torch's arbitrary tie order cannot matter.
    uniq = torch.arange(1, 0x7F80, dtype=torch.int16).view(torch.bfloat16)
    assert uniq.numel() >= W * L, "not enough distinct bf16 values"
    logits = []
    for r in range(W):
        logits.append(torch.empty(rows, L, dtype=torch.bfloat16))
    for t in range(rows):
        perm = torch.randperm(uniq.numel(), generator=g)[: W * L]
        row = uniq[perm].view(W, L)
        for r in range(W):
            logits[r][t] = row[r]
    u16 = [x.view(torch.int16).numpy().astype("uint16") for x in logits]
    ends = [(ctypes.c_int32 * rows)(*([L] * rows)) for _ in range(W)]
    lp = (ctypes.POINTER(ctypes.c_uint16) * W)(
        *[a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint16)) for a in u16])
    ep = (ctypes.POINTER(ctypes.c_int32) * W)(
        *[ctypes.cast(e, ctypes.POINTER(ctypes.c_int32)) for e in ends])
    req = (ctypes.c_int32 * rows)(*range(rows))
    bt = (ctypes.c_int32 * (rows * L))(*range(rows * L))
    rows_out = (ctypes.c_int32 * (rows * K))()
    valid = (ctypes.c_int32 * rows)()
    ids = (ctypes.c_int32 * (rows * K))()
    addr = ctypes.addressof
    rin = DcpxRefInC(ctypes.sizeof(DcpxRefInC), rows, 0, 0, L, addr(lp),
                     addr(ep), addr(req), addr(bt), rows, L, None)
    rout = DcpxMergeOutC(ctypes.sizeof(DcpxMergeOutC), 0, addr(rows_out),
                         addr(valid), addr(ids), None)
    rc = dcpx.dcpx_ref_call(ctypes.byref(sh), ctypes.byref(rin),
                            ctypes.byref(rout), None)
    if rc != 0:
        raise RuntimeError("dcpx_ref_call: %d" % rc)
    cat = torch.cat([x.float() for x in logits], dim=1).cuda()
    _, idx = torch.topk(cat, K, dim=1)
    bad = 0
    for t in range(rows):
        # torch's column c = r * L + l; dcpx's gid with I=1 is l * W + r.
        tset = {(int(c) % L) * W + int(c) // L for c in idx[t].tolist()}
        dset = set(ids[t * K:(t + 1) * K])
        bad += tset != dset
    return rows - bad, rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--w", type=int, default=8)
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--lib")
    a = ap.parse_args()
    dev = torch.device("cuda")
    print("torch %s, %s" % (torch.__version__, torch.cuda.get_device_name(0)))
    print()
    print("| local | rows | torch.topk(local, N) us | "
          "torch.topk(gathered W*N, K) us |")
    print("|---:|---:|---:|---:|")
    for L in (16384, 65536):
        for rows in (1, 8, 64, 256):
            x = torch.randn(rows, L, device=dev).to(torch.bfloat16)
            c = torch.randn(rows, a.w * a.n, device=dev).to(torch.bfloat16)
            tp = graph_time_us(lambda: torch.topk(x, a.n, dim=1))
            tm = graph_time_us(lambda: torch.topk(c, a.k, dim=1))
            print("| %d | %d | %.1f | %.1f |" % (L, rows, tp, tm))
    sys.stdout.flush()
    if a.lib:
        ok, n = check_sets(a.lib, 4, 64, 256, 1024, 16)
        print()
        print("independent check, torch.topk over the concatenation vs "
              "dcpx_ref_call ids (W=4 N=64 K=256 L=1024): %d/%d rows equal "
              "as sets" % (ok, n))
        return 0 if ok == n else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
