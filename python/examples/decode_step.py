#!/usr/bin/env python3
"""decode_step.py - DSA-style decode steps (--steps) over L layers, W ranks.

Every rank process holds 1/W of the KV cache (DCP, interleave I). Per
layer: (1) the indexer scores the rank's local KV positions for every
decode row (q . k, rounded to bf16); (2) dcpx push + merge select the exact
global top-K; (3) the rank gathers the KV rows of its own selected
positions for the sparse attention. Every row is checked: against a brute
force top-K of the concatenated logits (torch.topk where torch is present,
numpy otherwise) as a set when the K-th place is not tied, and against
dcpx_ref_call otherwise (every --ties-every'th row is made tie-heavy on
purpose, like a quantized indexer).

Host backend without a GPU; with --backend cuda (default when torch sees a
GPU) the CUDA backend, ranks spread over the GPUs, and steps after the
first replay a CUDA graph of all L layers.

    DCPX_LIBRARY=<build>/libclient/.libs/libdcpx.so.0 DCPXD=<build>/daemon/dcpxd \\
      PYTHONPATH=python python3 python/examples/decode_step.py --world 4

(<build> is the build folder: `.` for the README's in-tree build.)

Ends with "exact: N/N rows" and exit 0, or exit 1.
"""

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
import dcpx  # noqa: E402
import dcpx.testing  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

D = 32  # indexer head dim


def local_len_of(ctx, r, W, I):
    """How many of positions [0, ctx) rank r holds (gid rule of dcpx)."""
    full, rem = divmod(ctx, I * W)
    return full * I + min(max(rem - r * I, 0), I)


def gids(r, n, W, I):
    l = np.arange(n)
    return (l // I) * I * W + r * I + l % I


def indexer_logits(a, step, layer, r):
    """[rows][local_len] bf16 bits of rank r: q . k of the rank's keys."""
    keys = np.random.default_rng([1, r]).standard_normal(
        (a.local_len, D), np.float32)
    q = np.random.default_rng([2, step, layer]).standard_normal(
        (a.rows, D), np.float32)
    x = q @ keys.T
    t = np.arange(a.rows)
    ties = (t % a.ties_every) == a.ties_every - 1 if a.ties_every else \
        np.zeros(a.rows, bool)
    x[ties] = np.round(x[ties])  # a few distinct values: heavy ties
    return dcpx.to_bf16_bits(x)


def ctx_lens(a, step):
    rng = np.random.default_rng([3, step])
    full = a.local_len * a.world
    # at least K/2 positions (fewer when the whole context is smaller)
    c = rng.integers(min(a.topk // 2, full), full + 1, a.rows)
    c[0] = full
    return c


def topk_set(vals, k):
    """Brute-force top-k of one global row (float values): the set of
    positions, or None when the k-th place is tied (then the order's tie
    rule decides, and the reference is the judge)."""
    n = vals.shape[0]
    if n <= k:
        return set(range(n))
    if torch is not None:
        v, i = torch.topk(torch.from_numpy(vals), k + 1)
        v, i = v.numpy(), i.numpy()
    else:
        i = np.argpartition(-vals, k)[:k + 1]
        i = i[np.argsort(-vals[i], kind="stable")]
        v = vals[i]
    if v[k - 1] == v[k]:
        return None
    return set(i[:k].tolist())


def check_layer(a, shape, rank, step, layer, lgs, ends, req, bt, res, stats):
    rows_out, valid, ids = (np.asarray(x) for x in res[:3])
    W, I, K = a.world, a.interleave, a.topk
    ctx = ctx_lens(a, step)
    bad, sets = 0, 0
    ref = None
    for t in range(a.rows):
        g = np.full(a.local_len * W, -np.inf, np.float32)
        for r in range(W):
            n = ends[r][t]
            g[gids(r, n, W, I)] = dcpx.from_bf16_bits(lgs[r][t, :n])
        want = topk_set(g[:ctx[t]], K)
        got = set(ids[t][ids[t] >= 0].tolist())
        if want is not None:
            sets += 1
            ok = got == want
            own = sorted(x for x in want
                         if (x // I) % W == rank)  # own gids, ascending l
            ls = [(x // (I * W)) * I + x % I for x in own]
            kv = [bt[req[t], l // a.block_size] * a.block_size +
                  l % a.block_size for l in ls]
            ok = ok and valid[t] == len(kv) and \
                rows_out[t, :len(kv)].tolist() == kv
        else:
            if ref is None:
                ref = dcpx.ref_call(shape, lgs, ends, rank, req, bt,
                                    sat=False, stats=stats)
            ok = np.array_equal(ref.rows_out[t], rows_out[t]) and \
                ref.valid_out[t] == valid[t] and \
                np.array_equal(ref.ids_out[t], ids[t])
        bad += not ok
    return bad, sets


def rank_main(a, rank, sock, q, barrier):
    try:
        q.put(run_rank(a, rank, sock, barrier))
    except BaseException as e:  # noqa: BLE001
        import traceback
        q.put((rank, -1, 0, 0, traceback.format_exc() + repr(e)))


def shape_of(a):
    """The group's shape for the arguments."""
    return dcpx.Shape(world=a.world, rows=a.rows, topk=a.topk,
                      local_topk=a.local_topk, block_size=a.block_size,
                      interleave=a.interleave, max_local=a.local_len)


def run_rank(a, rank, sock, barrier):
    W, R, K, B, L = a.world, a.rows, a.topk, a.block_size, a.layers
    cuda = a.backend == "cuda"
    shape = shape_of(a)
    cols = (a.local_len + B - 1) // B
    rng = np.random.default_rng([4, rank])
    bt = np.stack([rng.permutation(cols) + t * cols
                   for t in range(R)]).astype(np.int32)
    req = ((np.arange(R) * 5) % R).astype(np.int32)
    kv_cache = np.random.default_rng([5, rank]).standard_normal(
        (R * cols * B, 8), np.float32)  # the rank's KV rows (toy width)
    opts = dict(rank=rank, group=a.group, timeout_ns=5_000_000_000)
    dev = None
    if cuda:
        ndev = torch.cuda.device_count()
        dev = rank % ndev
        torch.cuda.set_device(dev)
        opts.update(backend=dcpx.Backend.CUDA, device=dev)
    client = dcpx.Client(sock)
    m = client.join(shape, **opts)
    rows_checked = bad = sets = 0
    stats = [0, 0, 0]
    us = []
    if cuda:
        d = torch.device("cuda", dev)
        keys = torch.from_numpy(np.random.default_rng([1, rank])
                                .standard_normal((a.local_len, D),
                                                 np.float32)).to(d)
        kv = torch.from_numpy(kv_cache).to(d)
        q_in = torch.zeros((L, R, D), device=d)
        tie_mask = torch.zeros(R, dtype=torch.bool, device=d)
        if a.ties_every:
            tie_mask[a.ties_every - 1::a.ties_every] = True
        ends_in = torch.zeros(R, dtype=torch.int32, device=d)
        req_t = torch.from_numpy(req).to(d)
        bt_t = torch.from_numpy(bt).to(d)
        outs = [dcpx.MergeResult(
            torch.empty((R, K), dtype=torch.int32, device=d),
            torch.empty(R, dtype=torch.int32, device=d),
            torch.empty((R, K), dtype=torch.int32, device=d), None)
            for _ in range(L)]
        lg_out = [None] * L
        gathered = [None] * L

        def step_fn():
            for layer in range(L):
                x = q_in[layer] @ keys.T
                x = torch.where(tie_mask[:, None], torch.round(x), x)
                lg = x.to(torch.bfloat16).contiguous()
                lg_out[layer] = lg
                tok = m.push(lg, ends_in, call_tag=layer)
                m.merge(lg, ends_in, req_t, bt_t, out=outs[layer],
                        call_tag=layer, token=tok)
                # (3) the sparse-attention gather of own selected KV rows
                idx = outs[layer].rows_out.clamp(min=0).view(-1).long()
                gathered[layer] = kv.index_select(0, idx)

        graph = None
    for step in range(a.steps):
        ctx = ctx_lens(a, step)
        ends = [np.array([local_len_of(c, r, W, a.interleave) for c in ctx],
                         np.int32) for r in range(W)]
        lgs_all = [[indexer_logits(a, step, layer, r) for r in range(W)]
                   for layer in range(L)]
        if cuda:
            qs = np.stack([np.random.default_rng([2, step, layer])
                           .standard_normal((R, D), np.float32)
                           for layer in range(L)])
            q_in.copy_(torch.from_numpy(qs))
            ends_in.copy_(torch.from_numpy(ends[rank]))
            t0 = time.perf_counter()
            if step == 0 or not a.graph:
                step_fn()  # eager (and the warm-up before capture)
            else:
                if graph is None:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step_fn()
                # The member must be healthy before a replay: with nccl a
                # replay after an abort would run its captured
                # all-gathers on an aborted (freed) communicator
                # (docs/PROTOCOL.md 6.4). Host loads only.
                if m.async_error().state != 0:
                    raise SystemExit(f"rank {rank}: the group failed; "
                                     "recover() and capture again")
                graph.replay()
            torch.cuda.synchronize()
            us.append((time.perf_counter() - t0) * 1e6)
            for layer in range(L):
                mine = lg_out[layer].view(torch.int16).cpu().numpy() \
                    .view(np.uint16)
                # the GPU indexer rounds differently from numpy: use its
                # logits for this rank, and check every rank's from theirs
                lgs_all[layer][rank] = mine
            results = [dcpx.MergeResult(*[x.cpu().numpy() if x is not None
                                          else None for x in o])
                       for o in outs]
            # peers' GPU logits differ from numpy's only by matmul
            # rounding, so the check needs all ranks' actual logits:
            # exchanged through files in the run dir
            path = os.path.join(a.run_dir, f"lg-{step}-{rank}.npy")
            np.save(path + ".tmp.npy", np.stack([lgs_all[layer][rank]
                                                 for layer in range(L)]))
            os.replace(path + ".tmp.npy", path)
            for r in range(W):
                p = os.path.join(a.run_dir, f"lg-{step}-{r}.npy")
                while not os.path.exists(p):
                    time.sleep(0.005)
                arr = np.load(p)
                for layer in range(L):
                    lgs_all[layer][r] = arr[layer]
        else:
            results = []
            t0 = time.perf_counter()
            for layer in range(L):
                lg = lgs_all[layer][rank]
                m.push(lg, ends[rank], call_tag=step * L + layer)
                res = m.merge(lg, ends[rank], req, bt,
                              call_tag=step * L + layer)
                _ = kv_cache[np.maximum(res.rows_out, 0)]  # (3) gather
                results.append(res)
            us.append((time.perf_counter() - t0) * 1e6)
        for layer in range(L):
            b, s = check_layer(a, shape, rank, step, layer, lgs_all[layer],
                               ends, req, bt, results[layer], stats)
            bad += b
            sets += s
            rows_checked += R
        m.poll()
    h = m.health()
    # Leave together: a rank that leaves while a peer still merges the
    # last call takes the group down (dead-rank abort) under that peer.
    barrier.wait(300)
    m.leave()
    client.close()
    info = (f"rank {rank}: {a.steps} steps x {L} layers, step "
            f"{np.median(us):.0f} us (median"
            f"{', graph' if cuda and a.graph else ''}), "
            f"{sets} rows as sets, {rows_checked - sets} against the "
            f"reference, rescue rows {h.rescue_rows}")
    return rank, rows_checked, bad, sets, info


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--topk", type=int, default=256)
    p.add_argument("--local-topk", type=int, default=0)
    p.add_argument("--local-len", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--interleave", type=int, default=1)
    p.add_argument("--ties-every", type=int, default=4,
                   help="every Nth row tie-heavy (0: none)")
    p.add_argument("--backend", choices=("auto", "host", "cuda"),
                   default="auto")
    p.add_argument("--no-graph", dest="graph", action="store_false",
                   help="CUDA: run every step eagerly")
    p.add_argument("--socket", help="an existing dcpxd (default: start a "
                   "private one from $DCPXD / the build tree)")
    p.add_argument("--group", default=f"decode-step-{os.getpid()}")
    a = p.parse_args(argv)
    for name in ("world", "layers", "steps", "rows", "topk", "local_len",
                 "block_size", "interleave"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.local_topk < 0 or a.ties_every < 0:
        p.error("--local-topk and --ties-every must be >= 0")
    try:  # here, not as W tracebacks from the ranks' joins
        shape_of(a).check()
    except dcpx.DcpxError as e:
        p.error(e.context)
    except ImportError as e:  # dcpx.LibraryNotFound
        print(f"decode_step: {e}", file=sys.stderr)
        return 1
    if a.backend == "auto":
        a.backend = "cuda" if torch is not None and \
            torch.cuda.is_available() else "host"
    if a.backend == "cuda" and (torch is None or
                                not torch.cuda.is_available()):
        p.error("--backend cuda needs torch with a GPU")
    import tempfile
    daemon = None
    sock = a.socket
    if sock is None:
        try:
            daemon = dcpx.testing.PrivateDaemon().start()
        except (OSError, RuntimeError) as e:
            print(f"cannot start a private dcpxd: {e}", file=sys.stderr)
            return 1
        sock = daemon.socket
    else:  # a dead socket: one line here, not W tracebacks from the ranks
        try:
            dcpx.Client(sock).close()
        except dcpx.DcpxError as e:
            print(f"decode_step: --socket {sock}: {e}", file=sys.stderr)
            return 1
    a.run_dir = tempfile.mkdtemp(prefix="dcpx-step.")
    procs = []
    try:
        ctx = mp.get_context("spawn" if a.backend == "cuda" else "fork")
        q = ctx.Queue()
        barrier = ctx.Barrier(a.world)
        procs = [ctx.Process(target=rank_main,
                             args=(a, r, sock, q, barrier))
                 for r in range(a.world)]
        for pr in procs:
            pr.start()
        total = bad = 0
        failed = False
        for _ in range(a.world):
            rank, rows, b, sets, info = q.get(timeout=600)
            if rows < 0:
                print(f"rank {rank} failed:\n{info}", file=sys.stderr)
                failed = True
                continue
            print(info)
            total += rows
            bad += b
        for pr in procs:
            pr.join()
    finally:
        for pr in procs:
            if pr.is_alive():
                pr.kill()
        if daemon is not None:
            daemon.stop()
        import shutil
        shutil.rmtree(a.run_dir, ignore_errors=True)
    print(f"backend {a.backend}, W={a.world}: exact: {total - bad}/{total} "
          "rows")
    return 0 if not failed and bad == 0 and total > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
