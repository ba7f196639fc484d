"""torch on the host backend (CPU tensors): the custom ops dcpx::push /
dcpx::merge, their fake implementations, and torch.compile(fullgraph=True)
without graph breaks. Skipped without torch."""

import warnings

import numpy as np
import pytest

import dcpx
from _ranks import compare, inputs, run_ranks, sync, tables

torch = pytest.importorskip("torch", reason="torch is not installed")
if not dcpx.torch_ops_available:
    pytest.skip("torch < 2.4: no torch.library.custom_op",
                allow_module_level=True)


def _lg(x):
    return torch.from_numpy(np.ascontiguousarray(x).view(np.int16)).view(
        torch.bfloat16)


def test_ops_registered():
    assert hasattr(torch.ops.dcpx, "push")
    assert hasattr(torch.ops.dcpx, "merge")
    assert hasattr(torch.ops.dcpx, "merge_out")


def test_fake_shapes(daemon, group):
    from torch._subclasses.fake_tensor import FakeTensorMode
    shape = dcpx.Shape(world=1, rows=4, topk=16, local_topk=4,
                       max_local=64)
    with dcpx.Client(daemon.socket).join(shape, group=group) as m:
        with FakeTensorMode():
            lg = torch.empty((3, 64), dtype=torch.bfloat16)
            en = torch.empty(3, dtype=torch.int32)
            tok = torch.ops.dcpx.push(m.handle, lg, en, 0)
            r, v, i, s = torch.ops.dcpx.merge(
                m.handle, lg, en, en, torch.empty((2, 2), dtype=torch.int32),
                tok, True, False, 0)
            assert r.shape == (3, 16) and v.shape == (3,)
            assert i.shape == (3, 16) and s.shape == (0,)
            assert r.dtype == torch.int32
        assert m.health().calls == 0  # the fakes did no work


def _compiled(rank, q, sock, group, shape, calls):
    R, L = shape.rows, shape.max_local
    req, bt = tables(rank, R, L, shape.block_size)
    req_t, bt_t = torch.from_numpy(req), torch.from_numpy(bt)
    # The wait bound covers a peer's first torch.compile: inductor in a
    # freshly spawned process (the GPU machine's runs) takes longer than
    # 10 s, and the eager rank's merge then timed out waiting for it.
    with dcpx.Client(sock) as c, c.join(shape, rank=rank, group=group,
                                        timeout_ns=120_000_000_000) as m:
        def step(f32, ends):
            lg = f32.to(torch.bfloat16)
            tok = m.push(lg, ends)
            res = m.merge(lg, ends, req_t, bt_t, token=tok, sat=True)
            return res.rows_out, res.valid_out, res.ids_out, res.sat_word

        cstep = torch.compile(step, fullgraph=True, backend="eager"
                              if rank % 2 else "inductor")
        for call in range(calls):
            lg, en = inputs(61, call, shape.world, R, L,
                            ("random", "ties", "skew")[call % 3])
            f32 = torch.from_numpy(dcpx.from_bf16_bits(lg[rank]))
            r, v, i, s = cstep(f32, torch.from_numpy(en[rank]))
            got = dcpx.MergeResult(r.numpy(), v.numpy(), i.numpy(),
                                   s.numpy())
            compare(got, dcpx.ref_call(shape, lg, en, rank, req, bt), R)
        h = m.health()
        assert h.ok and h.calls == calls, h
        sync()
    return calls


@pytest.mark.parametrize("W", [1, 2])
def test_torch_compile_fullgraph_cpu(daemon, group, W):
    shape = dcpx.Shape(world=W, rows=4, topk=32, local_topk=0,
                       block_size=8, max_local=300)
    out = run_ranks(_compiled, W, (daemon.socket, group, shape, 3),
                    timeout=300)
    assert all(v == 3 for v in out.values())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compile_keeps_unused_merge(daemon, group, backend, tmp_path,
                                    monkeypatch):
    """A compiled step whose merge result is thrown away (a warm-up or
    padding step) still merges: the ops are side-effectful. Its call tags
    are beyond int64 (they failed the ops' int64 argument). Without that
    the merge was eliminated as dead code, and the next push was refused
    (the previous push has not been merged yet): a rank that skips its
    merge leaves its peers waiting."""
    # a fresh inductor cache: a graph compiled before the fix must not
    # come back from disk
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    shape = dcpx.Shape(world=1, rows=4, topk=16, local_topk=4,
                       block_size=4, max_local=128)
    lg, en = inputs(5, 0, 1, 4, 128, "random")
    req, bt = tables(0, 4, 128, 4)
    x, e = _lg(lg[0]), torch.from_numpy(en[0])
    q, b = torch.from_numpy(req), torch.from_numpy(bt)
    big = (1 << 64) - 3  # any integer is a tag, modulo 2^64, compiled too
    with dcpx.Client(daemon.socket).join(shape, group=group) as m:
        def step(x, e):
            tok = m.push(x, e, call_tag=big)
            m.merge(x, e, q, b, token=tok, call_tag=big + (1 << 64))
            return None

        f = torch.compile(step, fullgraph=True, backend=backend)
        for _ in range(3):
            f(x, e)
        assert m.health().calls == 3
    torch._dynamo.reset()


def test_compile_refuses_bad_dtype(daemon, group):
    shape = dcpx.Shape(world=1, rows=2, topk=8, local_topk=2, max_local=16)
    with dcpx.Client(daemon.socket).join(shape, group=group) as m:
        f = torch.compile(lambda x, e: m.push(x, e), fullgraph=True,
                          backend="eager")
        with pytest.raises(Exception) as ei:
            f(torch.zeros((2, 16)), torch.zeros(2, dtype=torch.int32))
        assert "dtype" in str(ei.value)
        assert m.health().failed_mask == 0  # refused before any work


def test_compile_refuses_a_stream(daemon, group):
    """Under torch.compile the ops run on torch's current stream: a
    stream= argument is refused with the reason (it was dropped, and the
    call ran on another stream than the one asked for)."""
    shape = dcpx.Shape(world=1, rows=2, topk=8, local_topk=2, max_local=16)
    with dcpx.Client(daemon.socket).join(shape, group=group) as m:
        f = torch.compile(lambda x, e: m.push(x, e, stream=7),
                          fullgraph=True, backend="eager")
        with pytest.raises(Exception) as ei:
            f(torch.zeros((2, 16), dtype=torch.int16),
              torch.full((2,), 16, dtype=torch.int32))
        assert "current stream" in str(ei.value), str(ei.value)
        assert m.health().calls == 0 and m.health().failed_mask == 0
    torch._dynamo.reset()


def test_compile_with_a_tag_per_step(daemon, group):
    """A call tag that changes every step, passed into the compiled
    function (the README's advice), compiles (fullgraph) and runs every
    step exact: the tag becomes symbolic after one recompile, and the ops
    take it without bit operations (they failed: "Invalid NaN
    comparison")."""
    torch._dynamo.reset()
    shape = dcpx.Shape(world=1, rows=4, topk=16, local_topk=4,
                       block_size=4, max_local=128)
    req, bt = tables(0, 4, 128, 4)
    req_t, bt_t = torch.from_numpy(req), torch.from_numpy(bt)
    with dcpx.Client(daemon.socket).join(shape, group=group) as m:
        @torch.compile(fullgraph=True)
        def layer(lg, en, tag):
            tok = m.push(lg, en, call_tag=tag)
            return m.merge(lg, en, req_t, bt_t, call_tag=tag, token=tok)

        for step in range(6):
            lg, en = inputs(17, step, 1, 4, 128, "random")
            res = layer(_lg(lg[0]), torch.from_numpy(en[0]),
                        step * 61 + 3)
            got = dcpx.MergeResult(*(None if t is None else t.numpy()
                                     for t in res))
            compare(got, dcpx.ref_call(shape, lg, en, 0, req, bt), 4)
        assert m.health().calls == 6


def test_prepared_call_refuses_moved_tensors(member):
    """A tensor bound by Member.prepare and then resized (resize_), given
    other storage (set_, .data =, its storage resized) or reshaped in
    place (as_strided_) is refused by the PreparedCall's next call with
    InvalidArgument naming it, before any work: the call used the
    addresses and shapes prepare saw, and read freed memory (a row_end of
    213833898 after row_ends.set_) or wrote past an output."""
    shape = member.shape
    lg, en = inputs(23, 0, 1, 4, 128, "random")
    req, bt = tables(0, 4, 128, 4)
    ref = dcpx.ref_call(shape, lg, en, 0, req, bt)

    def fresh():
        a = (_lg(lg[0]).clone(), torch.from_numpy(en[0]).clone(),
             torch.from_numpy(req).clone(), torch.from_numpy(bt).clone())
        out = dcpx.MergeResult(torch.empty((4, 16), dtype=torch.int32),
                               torch.empty(4, dtype=torch.int32),
                               torch.empty((4, 16), dtype=torch.int32),
                               torch.empty(4, dtype=torch.int32))
        return a, out

    cases = [
        ("logits", lambda a, o: a[0].resize_(64, 1024)),      # moves
        ("logits", lambda a, o: a[0].resize_(2, 128)),        # shrinks
        ("row_ends", lambda a, o: a[1].set_(torch.full((4,), 128,
                                                       dtype=torch.int32))),
        ("req_id", lambda a, o: setattr(a[2], "data", a[2].clone())),
        ("block_table", lambda a, o: a[3].as_strided_((4, 32), (1, 4))),
        ("block_table", lambda a, o: a[3].untyped_storage().resize_(0)),
        ("out.rows_out", lambda a, o: o.rows_out.resize_(1024, 1024)),
        ("out.valid_out", lambda a, o: o.valid_out.resize_(2)),
        ("out.ids_out", lambda a, o: o.ids_out.set_()),
        ("out.sat_word", lambda a, o: o.sat_word.resize_(4, 1)),
    ]
    def same(res):  # on copies: a numpy view pins a tensor's storage
        compare(dcpx.MergeResult(*(t.clone() for t in res)), ref, 4)

    for name, change in cases:
        a, out = fresh()
        pc = member.prepare(*a, out=out, sat=True)
        same(pc())
        a[1].copy_(torch.from_numpy(en[0]))  # refilled in place: fine
        same(pc())
        change(a, out)
        calls = [pc]
        if name in ("logits", "row_ends"):
            calls.append(pc.push)  # a push reads only these two
        else:
            pc.push()
            calls.append(pc.merge)
        for call in calls:
            with pytest.raises(dcpx.InvalidArgument,
                               match=f"PreparedCall: {name} was resized"):
                call()
        if name not in ("logits", "row_ends"):
            a2, out2 = fresh()  # the push's merge, over fresh buffers
            same(member.merge(*a2, out=out2, sat=True))
        assert member.async_error().state == 0  # nothing reached libdcpx
    a, out = fresh()
    same(member.prepare(*a, out=out, sat=True)())
    assert member.health().ok


def _misaligned(t, by):
    """A CPU tensor equal to t whose data starts `by` bytes past a 16-byte
    boundary (torch.frombuffer takes any byte offset)."""
    buf = bytearray(t.numel() * t.element_size() + 32)
    base = torch.frombuffer(buf, dtype=torch.uint8).data_ptr()
    x = torch.frombuffer(buf, dtype=t.dtype, count=t.numel(),
                         offset=(-base) % 16 + by).view(t.shape)
    x.copy_(t)
    return x


def test_misaligned_tensors(member):
    """CPU tensors whose data is not aligned to their element (logits 2
    bytes, the int32 arrays 4: include/dcpx.h) are refused with
    InvalidArgument naming the tensor and the rule, before any work, as
    the CUDA path's checks report theirs (the host backend read them
    unchecked; the CUDA launchers refuse them and fail the rank)."""
    shape = member.shape
    lg, en = inputs(29, 0, 1, 4, 128, "random")
    req, bt = tables(0, 4, 128, 4)
    ref = dcpx.ref_call(shape, lg, en, 0, req, bt, sat=True)
    good = [_lg(lg[0]), torch.from_numpy(en[0]), torch.from_numpy(req),
            torch.from_numpy(bt), torch.empty((4, 16), dtype=torch.int32),
            torch.empty(4, dtype=torch.int32),
            torch.empty((4, 16), dtype=torch.int32),
            torch.empty(4, dtype=torch.int32)]
    names = ("logits", "row_ends", "req_id", "block_table", "out.rows_out",
             "out.valid_out", "out.ids_out", "out.sat_word")
    for k, name in enumerate(names):
        n = 2 if name == "logits" else 4
        for by in range(1, n):
            a = list(good)
            a[k] = _misaligned(good[k], by)
            assert a[k].data_ptr() % n == by
            with pytest.raises(dcpx.InvalidArgument,
                               match=f"{name} must be aligned to its "
                                     f"{n}-byte element.*clone"):
                member.prepare(*a[:4], out=a[4:])
            if k < 2:
                with pytest.raises(dcpx.InvalidArgument, match=name):
                    member.push(a[0], a[1])
            else:
                member.push(a[0], a[1])
                with pytest.raises(dcpx.InvalidArgument, match=name):
                    member.merge(*a[:4], out=a[4:])
                member.merge(*good[:4])  # the push's merge
        a = list(good)
        a[k] = _misaligned(good[k], n)  # aligned: taken
        res = member.prepare(*a[:4], out=a[4:])()
        compare(dcpx.MergeResult(*(t.clone() for t in res)), ref, 4)
    assert member.async_error().state == 0  # nothing reached libdcpx
    assert member.last_error() == ""


def test_tensors_not_dense(member):
    """Sparse and nested tensors are refused with InvalidArgument saying
    the tensor must be dense, before any work (and by ref_call); a sparse
    CSR tensor raised torch's own RuntimeError from is_contiguous(), a
    nested one from .shape, and a sparse COO one was called
    non-contiguous."""
    shape = member.shape
    lg, en = inputs(31, 0, 1, 4, 128, "random")
    req, bt = tables(0, 4, 128, 4)
    x, e = _lg(lg[0]), torch.from_numpy(en[0])
    q, b = torch.from_numpy(req), torch.from_numpy(bt)
    with warnings.catch_warnings():  # nested, sparse CSR: prototypes
        warnings.simplefilter("ignore")
        csr = x.float().to_sparse_csr().to(torch.bfloat16)
        bad = {"logits": [x.to_sparse(), csr,
                          torch.nested.nested_tensor(list(x))],
               "block_table": [b.to_sparse(), b.to_sparse_csr()],
               "row_ends": [e.to_sparse()]}
        try:
            bad["logits"].append(torch.nested.nested_tensor(
                list(x), layout=torch.jagged))
        except Exception:  # an older torch: no jagged layout
            pass
    for t in bad["logits"]:
        with pytest.raises(dcpx.InvalidArgument,
                           match="logits must be a dense tensor"):
            member.push(t, e)
        with pytest.raises(dcpx.InvalidArgument,
                           match="logits must be a dense tensor"):
            dcpx.ref_call(shape, [t], [e], 0, q, b)
    for t in bad["row_ends"]:
        with pytest.raises(dcpx.InvalidArgument,
                           match="row_ends must be a dense tensor"):
            member.push(x, t)
    for t in bad["block_table"]:
        with pytest.raises(dcpx.InvalidArgument,
                           match="block_table must be a dense tensor"):
            member.prepare(x, e, q, t)
    assert member.async_error().state == 0  # nothing reached libdcpx
    member.push(x, e)
    res = member.merge(x, e, q, b)
    compare(res, dcpx.ref_call(shape, lg, en, 0, req, bt), 4)


def test_compile_refuses_bad_out(daemon, group):
    """Under torch.compile, an out= that is not (rows_out, valid_out[,
    ids_out[, sat_word]]) is refused with the eager call's InvalidArgument
    (surfacing in torch's Unsupported, whose text names it), before any
    work; a 1-tuple raised MergeResult's TypeError ("missing required
    positional argument")."""
    torch._dynamo.reset()
    shape = dcpx.Shape(world=1, rows=2, topk=8, local_topk=2, max_local=16)
    x = torch.zeros((2, 16), dtype=torch.bfloat16)
    e = torch.full((2,), 16, dtype=torch.int32)
    q, b = torch.zeros(2, dtype=torch.int32), torch.zeros((2, 16),
                                                          dtype=torch.int32)
    r = torch.empty((2, 8), dtype=torch.int32)
    with dcpx.Client(daemon.socket).join(shape, group=group) as m:
        for out in ((r,), (r, e, r, e, r)):
            f = torch.compile(lambda x, e: m.merge(x, e, q, b, out=out),
                              fullgraph=True, backend="eager")
            with pytest.raises(Exception, match=r"out must be \(rows_out"):
                f(x, e)
            torch._dynamo.reset()
        assert m.health().failed_mask == 0 and m.health().calls == 0
