"""Inputs that ctypes would pass on wrongly unless the package checks
them (a new user's audit, session 7): index arrays of the wrong shape
for ref_call's lists, NUL bytes in names and paths, integers beyond the
C types, bf16 bit patterns of other integer types."""

import warnings

import numpy as np
import pytest

import dcpx
from _ranks import compare


def _ref_args(shape):
    rows, L = shape.rows, shape.max_local
    rng = np.random.default_rng(7)
    lg = dcpx.to_bf16_bits(rng.standard_normal((rows, L)).astype(np.float32))
    en = np.full(rows, L, np.int32)
    req = np.arange(rows, dtype=np.int32)
    bt = np.arange(rows * 32, dtype=np.int32).reshape(rows, 32)
    return lg, en, req, bt


def test_ref_call_lists_indices_shape(libdcpx, small_shape):
    lg, en, req, bt = _ref_args(small_shape)
    rows, n = small_shape.rows, small_shape.local_topk
    vals = np.zeros((rows, n), np.uint16)
    big = np.zeros((rows * 4, n), np.int32)
    for idx in (big[:1], big[:1, :1], big[:, :n - 1]):
        with pytest.raises(dcpx.InvalidArgument, match="indices"):
            dcpx.ref_call(small_shape, [lg], [en], 0, req, bt,
                          lists=[(vals, idx)])
    # the right shape is taken: a valid given list (the first n entries)
    idx = np.tile(np.arange(n, dtype=np.int32), (rows, 1))
    dcpx.ref_call(small_shape, [lg], [en], 0, req, bt,
                  lists=[(np.ascontiguousarray(lg[:, :n]), idx)])


def test_nul_in_names(daemon, group, small_shape):
    with pytest.raises(dcpx.TextError):
        dcpx.Client(daemon.socket + "\0junk")
    with pytest.raises(dcpx.TextError):
        dcpx.Client(daemon.socket.encode() + b"\0junk")
    with dcpx.Client(daemon.socket.encode()):  # a bytes path, as os takes
        pass
    with pytest.raises(dcpx.InvalidArgument):
        dcpx.Client(3.5)
    with dcpx.Client(daemon.socket) as c:
        with pytest.raises(dcpx.TextError):
            c.join(small_shape, rank=0, group=group + "\0other")


def test_join_device_range(daemon, group, small_shape):
    with dcpx.Client(daemon.socket) as c:
        for dev in (1 << 31, 1 << 32, -(1 << 31) - 1, 1.0):
            with pytest.raises(dcpx.InvalidArgument, match="device"):
                c.join(small_shape, rank=0, group=group, device=dev)


def test_join_rank_types(daemon, group, small_shape):
    """JoinOptions' integers are checked as Shape's: numpy integers are
    integers, bools and values out of range are not."""
    with dcpx.Client(daemon.socket) as c:
        for bad in (True, np.True_, -1, 1 << 32, 0.0):
            with pytest.raises(dcpx.InvalidArgument, match="rank"):
                c.join(small_shape, rank=bad, group=group)
        with c.join(small_shape, rank=np.int32(0), group=group) as m:
            assert m.rank == 0


def test_ref_ranges(libdcpx, small_shape):
    """ref_call's rank and ref_local_list's cap are uint32 in C: a larger
    value is refused, not wrapped to another rank or cap."""
    lg = np.arange(128, dtype=np.uint16).reshape(1, 128)
    en = np.full(1, 128, np.int32)
    req = np.zeros(1, np.int32)
    bt = np.arange(4 * 32, dtype=np.int32).reshape(4, 32)
    with pytest.raises(dcpx.InvalidArgument, match="rank"):
        dcpx.ref_call(small_shape, [lg], [en], 1 << 32, req, bt)
    with pytest.raises(dcpx.InvalidArgument, match="cap"):
        dcpx.ref_local_list(lg[0], (1 << 32) + 4)
    assert len(dcpx.ref_local_list(lg[0], 4)) == 4


def test_integer_ranges(libdcpx, small_shape):
    with pytest.raises(dcpx.InvalidArgument):
        dcpx.strerror(1 << 40)
    assert dcpx.strerror(0) == dcpx.strerror(np.int64(0))
    # numpy integers are integers
    s = dcpx.Shape(world=np.int64(1), rows=np.uint32(4), topk=16,
                   local_topk=4, block_size=4, interleave=1, max_local=128)
    s.check()
    with pytest.raises(dcpx.InvalidArgument, match="integer"):
        dcpx.Shape(world=1.0, rows=4, topk=16, local_topk=4, block_size=4,
                   interleave=1, max_local=128).check()



def test_shape_fields_of_an_index_type(daemon, group, small_shape):
    """Shape fields of any type with ``__index__`` (not only numpy's) are
    taken as the ints they stand for, in the member and in every call
    (they passed the checks, then every push, merge and ref_call raised a
    bare TypeError); numpy bools are refused as Python's are."""
    class I:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    sh = dcpx.Shape(**{k: I(v) for k, v in small_shape.__dict__.items()})
    lg, en, req, bt = _ref_args(small_shape)
    ref = dcpx.ref_call(small_shape, [lg], [en], 0, req, bt)
    compare(dcpx.ref_call(sh, [lg], [en], 0, req, bt), ref, 4)
    with dcpx.Client(daemon.socket) as c, c.join(sh, rank=0,
                                                 group=group) as m:
        assert m.shape == small_shape
        m.push(lg, en)
        compare(m.merge(lg, en, req, bt), ref, 4)
    with pytest.raises(dcpx.InvalidArgument, match="Shape.rows"):
        dcpx.Shape(world=1, rows=np.True_, topk=16, local_topk=4,
                   max_local=128).check()


def test_shape_field_not_an_integer_is_named(libdcpx, small_shape):
    """A field that is not an integer is named as the Shape's, whatever
    the call: with local_topk=0 (the default) check() and ref_call said
    "auto_local_topk: world 1.0 is not an integer", a function the caller
    never called."""
    lg, en, req, bt = _ref_args(small_shape)
    for field, bad in (("world", 1.0), ("topk", "16")):
        for n in (4, 0):
            s = dcpx.Shape(**{**small_shape.__dict__, "local_topk": n,
                              field: bad})
            for call in (s.check, s.resolved,
                         lambda: dcpx.ref_call(s, [lg], [en], 0, req, bt)):
                with pytest.raises(dcpx.InvalidArgument,
                                   match=f"Shape.{field} must be an "
                                         "integer"):
                    call()

def test_from_bf16_bits_types(libdcpx):
    want = np.array([1.0, 2.0, -0.5], np.float32)
    bits = dcpx.to_bf16_bits(want)
    for b in (bits, list(map(int, bits)), bits.astype(np.int32),
              bits.astype(np.uint32), bits.astype(np.int64)):
        got = dcpx.from_bf16_bits(b)
        assert got.dtype == np.float32 and got.shape == want.shape
        assert np.array_equal(got, want)
    two = dcpx.from_bf16_bits(bits.astype(np.uint32).reshape(1, 3))
    assert two.shape == (1, 3)
    for bad in ([0x10000], [-1], np.array([1.5])):
        with pytest.raises(dcpx.InvalidArgument):
            dcpx.from_bf16_bits(bad)


def test_call_tag_and_out_types(member):
    lg = np.arange(4 * 128, dtype=np.uint16).reshape(4, 128)
    en = np.full(4, 128, np.int32)
    req = np.arange(4, dtype=np.int32)
    bt = np.arange(4 * 32, dtype=np.int32).reshape(4, 32)
    with pytest.raises(dcpx.InvalidArgument, match="call_tag"):
        member.push(lg, en, call_tag=1.5)
    with pytest.raises(dcpx.InvalidArgument, match="call_tag"):
        member.push(lg, en, call_tag=True)
    member.push(lg, en, call_tag=np.uint64(7))  # numpy integers are fine
    with pytest.raises(dcpx.InvalidArgument, match="out must be"):
        member.merge(lg, en, req, bt, out=(np.empty((4, 16), np.int32),))
    member.merge(lg, en, req, bt, call_tag=-1)  # modulo 2^64, as C
    assert member.async_error().state == 0


def test_ref_call_names_what_it_refuses(libdcpx, small_shape):
    """ref_call's refusals name the argument and the rule, as Member's
    do: dcpx_ref_call itself returns a bare code ('dcpx_ref_call: invalid
    argument', 'value out of range'), a shape that is not a Shape raised
    AttributeError from inside the package, and logits that are no
    sequence TypeError."""
    lg, en, req, bt = _ref_args(small_shape)
    R, N = small_shape.rows, small_shape.local_topk
    cases = [
        (dict(shape=(1, 4, 16)), dcpx.InvalidArgument, "dcpx.Shape"),
        (dict(shape=dcpx.Shape(world=1, rows=4, topk=16, local_topk=16)),
         dcpx.InvalidArgument, "local_topk 16 must be less than topk"),
        (dict(rank=1), dcpx.InvalidArgument, "rank 1 is not below world 1"),
        (dict(lg=np.zeros((R + 1, 128), np.uint16),
              en=np.zeros(R + 1, np.int32),
              req=np.zeros(R + 1, np.int32)),
         dcpx.RangeError, f"{R + 1} rows, more than"),
        (dict(en=np.array([0, 129, 0, 0], np.int32)), dcpx.RangeError,
         r"row_ends\[0\]\[1\] = 129 is outside 0..128"),
        (dict(bt=np.zeros((0, 4), np.int32)), dcpx.InvalidArgument,
         "block_table is empty"),
        (dict(lists=[(np.zeros((R, N - 1), np.uint16),
                      np.zeros((R, N - 1), np.int32))]),
         dcpx.InvalidArgument, r"lists\[0\]: values .* needs"),
        (dict(lists=[(np.zeros((R, N), np.uint16),)]),
         dcpx.InvalidArgument, "a \\(values, indices\\) pair"),
        (dict(lists=5), dcpx.InvalidArgument, "needs 1 lists"),
        # dcpx_ref_call's DCPX_E_RANGE was a bare "value out of range"
        (dict(req=np.array([0, 4, 0, 0], np.int32)), dcpx.RangeError,
         r"req_id\[1\] = 4 is outside the block table's rows 0..3"),
        (dict(bt=np.full((R, 32), -1, np.int32)), dcpx.RangeError,
         "maps to a negative block"),
        (dict(bt=np.zeros((R, 1), np.int32)), dcpx.RangeError,
         "past the block table's 1 columns"),
        (dict(lists=[(np.ones((R, N), np.uint16),
                      np.tile(np.arange(N, 0, -1, dtype=np.int32), (R, 1)))]),
         dcpx.RangeError, "a given list breaks a rule of dcpx_lists"),
    ]
    for kw, cls, text in cases:
        a = dict(shape=small_shape, lg=lg, en=en, rank=0, req=req, bt=bt,
                 lists=None)
        a.update(kw)
        with pytest.raises(cls, match=text):
            dcpx.ref_call(a["shape"], [a["lg"]], [a["en"]], a["rank"],
                          a["req"], a["bt"], lists=a["lists"])
    for lgs in (None, 5):  # raised TypeError from len()
        with pytest.raises(dcpx.InvalidArgument, match="one per rank"):
            dcpx.ref_call(small_shape, lgs, [en], 0, req, bt)


def test_ref_call_stats_types(libdcpx, small_shape):
    """ref_call's stats must hold the C counters (dcpx_ref_stats: three
    uint64): a numpy array of another dtype is refused with DtypeError
    before the call (a uint8 one wrapped at 256 silently), as is one of
    another rank or read-only; a list and a uint64 array add up."""
    lg, en, req, bt = _ref_args(small_shape)
    for bad in (np.zeros(3, np.uint8), np.zeros(3, np.int32),
                np.zeros(3, np.float64), np.zeros(3, np.int64)):
        with pytest.raises(dcpx.DtypeError,
                           match=f"stats is an array of {bad.dtype}; the "
                                 "counters are uint64"):
            dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, stats=bad)
        assert not bad.any()
    with pytest.raises(dcpx.InvalidArgument, match="stats must be 1-D"):
        dcpx.ref_call(small_shape, [lg], [en], 0, req, bt,
                      stats=np.zeros((3, 3), np.uint64))
    ro = np.zeros(3, np.uint64)
    ro.flags.writeable = False
    with pytest.raises(dcpx.InvalidArgument, match="stats is read-only"):
        dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, stats=ro)
    with pytest.raises(dcpx.InvalidArgument, match="list of three ints"):
        dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, stats=[0, 0])
    a, li = np.zeros(3, np.uint64), [0, 0, 0]
    for _ in range(70):  # 280 rows: past a uint8's 255
        dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, stats=a)
        dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, stats=li)
    assert a.dtype == np.uint64 and list(a) == li and li[0] == 280
    # near 2^64: a uint64 counter plus a Python int went through float64
    # under numpy < 2 (2^60 + 1 lost its 1)
    big = np.array([2**60 + 1, 2**62 + 3, (1 << 64) - 9], np.uint64)
    st = [0, 0, 0]
    dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, stats=st)
    dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, stats=big)
    assert big.dtype == np.uint64 and st[0] == 4
    assert [int(x) for x in big] == [2**60 + 1 + st[0], 2**62 + 3 + st[1],
                                     (1 << 64) - 9 + st[2]]


def test_boolean_options_must_be_bools(member, small_shape):
    """merge's, prepare's and ref_call's ids and sat and push_list's
    check_order take True, False or a numpy.bool_; anything else (an int,
    0 and 1 included, a str, None) raises InvalidArgument naming the
    option, before any work: any truthy value was taken, so ids="no"
    returned ids_out."""
    lg, en, req, bt = _ref_args(small_shape)
    bad = ("no", "", 1, 0, None, 1.0, [True])
    for v in bad:
        for opt in ("ids", "sat"):
            m = f"{opt} must be a bool \\(True or False\\), got " \
                f"{type(v).__name__}"
            with pytest.raises(dcpx.InvalidArgument, match="merge: " + m):
                member.merge(lg, en, req, bt, **{opt: v})
            with pytest.raises(dcpx.InvalidArgument, match="prepare: " + m):
                member.prepare(lg, en, req, bt, **{opt: v})
            with pytest.raises(dcpx.InvalidArgument, match="ref_call: " + m):
                dcpx.ref_call(small_shape, [lg], [en], 0, req, bt,
                              **{opt: v})
        with pytest.raises(dcpx.InvalidArgument,
                           match="push_list: check_order must be a bool"):
            member.push_list(np.zeros((4, 4), np.uint16),
                             np.zeros((4, 4), np.int32), en, check_order=v)
    assert member.async_error().state == 0  # nothing reached libdcpx
    ref = dcpx.ref_call(small_shape, [lg], [en], 0, req, bt,
                        ids=np.bool_(False), sat=np.bool_(True))
    assert ref.ids_out is None and ref.sat_word is not None
    member.push(lg, en)
    r = member.merge(lg, en, req, bt, ids=np.bool_(False), sat=np.True_)
    assert r.ids_out is None and r.sat_word is not None
    compare(r, ref, 4)
    pc = member.prepare(lg, en, req, bt, ids=np.False_, sat=False)
    assert pc.out.ids_out is None and pc.out.sat_word is None
    pc()
    assert member.health().ok


def test_out_overlap(member, small_shape):
    """Output arrays that share memory with one another or with an input
    are refused before any work: merge writes each output while it reads
    the inputs and writes the others, so with out=(buf, valid, buf) the
    ids came back silently wrong (rows_out overwrote them)."""
    lg, en, req, bt = _ref_args(small_shape)
    R, K = small_shape.rows, small_shape.topk
    ref = dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, sat=False)
    two = np.zeros((2, R, K), np.int32)   # two outputs, one buffer
    valid = np.zeros(R, np.int32)
    lg_words = lg.reshape(-1).view(np.int32)[:R * K].reshape(R, K)
    cases = [
        ((two[0], valid, two[0]), "out.rows_out overlaps out.ids_out"),
        ((two[0], two[0, 0, :R]), "out.rows_out overlaps out.valid_out"),
        ((two[0], valid, None, valid.view(np.uint32)),
         "out.valid_out overlaps out.sat_word"),
        ((lg_words, valid), "out.rows_out overlaps logits"),
        ((two[0], en), "out.valid_out overlaps row_ends"),
        ((two[0], valid, two[1], req.view(np.uint32)),
         "out.sat_word overlaps req_id"),
        ((two[0], valid, bt[:R, :K].copy(), bt[0, :R]),
         "out.sat_word overlaps block_table"),
    ]
    member.push(lg, en)
    for out, text in cases:
        with pytest.raises(dcpx.InvalidArgument, match=text):
            member.merge(lg, en, req, bt, out=out)
        with pytest.raises(dcpx.InvalidArgument, match=text):
            member.prepare(lg, en, req, bt, out=out)
    # nothing reached the library: the push's merge is still due, and
    # outputs side by side in one buffer are fine
    res = member.merge(lg, en, req, bt, out=(two[0], valid, two[1]))
    assert member.async_error().state == 0
    assert np.array_equal(res.rows_out, ref.rows_out)
    assert np.array_equal(res.valid_out, ref.valid_out)
    assert np.array_equal(res.ids_out, ref.ids_out)


def test_prepared_call_refuses_moved_arrays(member, small_shape):
    """A numpy array bound by Member.prepare and then resized with
    refcheck=False (numpy moves its memory), or reshaped or restrided in
    place, is refused by the PreparedCall's next call with InvalidArgument
    naming it, before any work: the call used the address and shape
    prepare saw (freed memory after the resize). A plain resize is
    refused by numpy itself (the PreparedCall holds the array)."""
    lg, en, req, bt = _ref_args(small_shape)
    ref = dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, sat=False)

    def fresh():
        return ((lg.copy(), en.copy(), req.copy(), bt.copy()),
                dcpx.MergeResult(np.empty((4, 16), np.int32),
                                 np.empty(4, np.int32),
                                 np.empty((4, 16), np.int32)))

    def restride(x):
        with warnings.catch_warnings():  # deprecated in numpy 2
            warnings.simplefilter("ignore", DeprecationWarning)
            x.strides = (4, 16)

    def reshape(x, shape):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            x.shape = shape

    cases = [
        ("logits", lambda a, o: a[0].resize((64, 1024), refcheck=False)),
        ("row_ends", lambda a, o: reshape(a[1], (2, 2))),
        ("block_table", lambda a, o: restride(a[3])),
        ("out.rows_out", lambda a, o: o.rows_out.resize((1024, 1024),
                                                        refcheck=False)),
        ("out.ids_out", lambda a, o: reshape(o.ids_out, (16, 4))),
    ]
    for name, change in cases:
        a, out = fresh()
        pc = member.prepare(*a, out=out)
        compare(pc(), ref, 4)
        with pytest.raises(ValueError, match="refcheck"):
            a[0].resize((64, 1024))  # numpy's own guard
        change(a, out)
        with pytest.raises(dcpx.InvalidArgument,
                           match=f"PreparedCall: {name} was resized"):
            pc()
        assert member.async_error().state == 0  # nothing reached libdcpx
    a, out = fresh()
    compare(member.prepare(*a, out=out)(), ref, 4)
    assert member.health().ok


def test_prepared_call_refuses_arrays_given_other_buffers(member,
                                                          small_shape):
    """A numpy array bound by Member.prepare and then given another buffer
    with ``.data =`` (same shape and strides; numpy frees the old one when
    nothing else holds it) is refused by the PreparedCall's next call,
    as its docstring says: the call wrote its outputs into, and read its
    logits from, the buffer prepare saw."""
    lg, en, req, bt = _ref_args(small_shape)
    ref = dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, sat=False)

    def give_other(x):
        with warnings.catch_warnings():  # deprecated in numpy 1.x
            warnings.simplefilter("ignore", DeprecationWarning)
            try:
                x.data = np.zeros_like(x).data
            except AttributeError:  # numpy 2 has no such assignment
                pytest.skip(f"numpy {np.__version__} cannot set .data")

    for name in ("logits", "block_table", "out.rows_out", "out.valid_out"):
        a = (lg.copy(), en.copy(), req.copy(), bt.copy())
        out = dcpx.MergeResult(np.empty((4, 16), np.int32),
                               np.empty(4, np.int32),
                               np.empty((4, 16), np.int32))
        pc = member.prepare(*a, out=out)
        compare(pc(), ref, 4)
        target = {"logits": a[0], "block_table": a[3],
                  "out.rows_out": out.rows_out,
                  "out.valid_out": out.valid_out}[name]
        give_other(target)
        with pytest.raises(dcpx.InvalidArgument,
                           match=f"PreparedCall: {name} was resized"):
            pc()
        assert member.async_error().state == 0  # nothing reached libdcpx
    assert member.health().ok


def test_prepared_call_refuses_output_made_read_only(member, small_shape):
    """A numpy output made read-only after Member.prepare is refused by
    the PreparedCall's next merge (and push + merge) as a plain merge
    refuses one, before any work: the per-call check looked at address,
    shape and layout only, and libdcpx wrote the read-only array."""
    lg, en, req, bt = _ref_args(small_shape)
    for name in ("rows_out", "valid_out", "ids_out", "sat_word"):
        out = dcpx.MergeResult(np.zeros((4, 16), np.int32),
                               np.zeros(4, np.int32),
                               np.zeros((4, 16), np.int32),
                               np.zeros(4, np.uint32))
        pc = member.prepare(lg, en, req, bt, out=out)
        getattr(out, name).flags.writeable = False
        with pytest.raises(dcpx.InvalidArgument,
                           match=f"out.{name} is read-only") as plain:
            member.merge(lg, en, req, bt, out=out)
        for call in (pc, pc.merge):
            with pytest.raises(dcpx.InvalidArgument) as e:
                call()
            assert str(e.value) == str(plain.value)
        pc.push()  # a push reads the inputs only
        assert not getattr(out, name).any()  # never written
        assert member.async_error().state == 0  # nothing reached libdcpx
        getattr(out, name).flags.writeable = True
        pc.merge()
        pc()
    assert member.health().ok


def _misaligned(a, by):
    """A copy of numpy array a whose data starts `by` bytes past a 16-byte
    boundary (numpy flags it unaligned when `by` is not a multiple of its
    element size)."""
    buf = np.zeros(a.nbytes + 32, np.uint8)
    off = (-buf.ctypes.data) % 16 + by
    m = buf[off:off + a.nbytes].view(a.dtype).reshape(a.shape)
    m[...] = a
    return m


def test_misaligned_arrays(member, small_shape):
    """Arrays whose data is not aligned to their element (logits 2 bytes,
    the int32 arrays 4: include/dcpx.h) are refused with InvalidArgument
    naming the array and the rule, before any work; they were refused as
    "must be C-contiguous" (numpy's aligned flag was folded into that
    check). ref_call copies them (as it copies what is not contiguous)."""
    lg, en, req, bt = _ref_args(small_shape)
    R, K, N = small_shape.rows, small_shape.topk, small_shape.local_topk
    ref = dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, sat=True)
    names = ("logits", "row_ends", "req_id", "block_table", "out.rows_out",
             "out.valid_out", "out.ids_out", "out.sat_word")
    good = [lg, en, req, bt, np.empty((R, K), np.int32),
            np.empty(R, np.int32), np.empty((R, K), np.int32),
            np.empty(R, np.uint32)]

    def calls(a):
        """Each way to pass the arrays a: eager push + merge, and
        prepare + call; each leaves no push unmerged."""
        def eager():
            member.push(a[0], a[1])
            try:
                return member.merge(*a[:4], out=a[4:])
            except dcpx.InvalidArgument:
                member.merge(lg, en, req, bt)  # the push's merge
                raise
        return (eager, lambda: member.prepare(*a[:4], out=a[4:])())

    for k, name in enumerate(names):
        n = 2 if name == "logits" else 4
        for by in range(1, n):
            a = list(good)
            a[k] = _misaligned(good[k], by)
            assert not a[k].flags.aligned
            for call in calls(a):
                with pytest.raises(dcpx.InvalidArgument,
                                   match=f"{name} must be aligned to its "
                                         f"{n}-byte element"):
                    call()
        a = list(good)
        a[k] = _misaligned(good[k], n)  # aligned: taken
        for call in calls(a):
            compare(call(), ref, R)
    vals = np.ascontiguousarray(lg[:, :N])  # push_list's lists too
    idx = np.tile(np.arange(N, dtype=np.int32), (R, 1))
    with pytest.raises(dcpx.InvalidArgument,
                       match="values must be aligned to its 2-byte"):
        member.push_list(_misaligned(vals, 1), idx, en)
    with pytest.raises(dcpx.InvalidArgument,
                       match="indices must be aligned to its 4-byte"):
        member.push_list(vals, _misaligned(idx, 2), en)
    assert member.async_error().state == 0  # nothing reached libdcpx
    assert member.last_error() == ""
    # the oracle copies them
    got = dcpx.ref_call(small_shape, [_misaligned(lg, 1)],
                        [_misaligned(en, 2)], 0, _misaligned(req, 1),
                        _misaligned(bt, 3), sat=True)
    compare(got, ref, R)


def test_member_shape_set_by_the_caller(member, small_shape):
    """Member.shape and Member.options are there to read: fields set on
    them change nothing that the calls check or allocate. A topk set
    smaller made merge allocate outputs that libdcpx wrote past (a
    segfault), a rows set larger let a call of too many rows through to
    a refusal by libdcpx, which failed the rank."""
    lg, en, req, bt = _ref_args(small_shape)
    R, K, N = small_shape.rows, small_shape.topk, small_shape.local_topk
    ref = dcpx.ref_call(small_shape, [lg], [en], 0, req, bt, sat=True)
    member.shape.rows, member.shape.topk = 100, 2
    member.shape.local_topk, member.shape.world = 1, 3
    member.options.rank, member.options.backend = 2, dcpx.Backend.CUDA
    member.options.device = 0
    with pytest.raises(dcpx.RangeError,
                       match=f"{R + 1} rows, more than the group's "
                             f"rows={R}"):
        member.push(np.zeros((R + 1, 128), np.uint16),
                    np.zeros(R + 1, np.int32))
    assert member.async_error().state == 0  # refused by the package
    assert (member.rank, member.world, member.backend) == \
        (0, 1, dcpx.Backend.HOST)
    member.push(lg, en)
    with pytest.raises(dcpx.InvalidArgument,
                       match=rf"out.rows_out must have shape \({R}, {K}\)"):
        member.merge(lg, en, req, bt, out=(np.empty((R, 2), np.int32),
                                           np.empty(R, np.int32)))
    res = member.merge(lg, en, req, bt, sat=True)
    assert res.rows_out.shape == (R, K) and res.ids_out.shape == (R, K)
    compare(res, ref, R)
    compare(member.prepare(lg, en, req, bt, sat=True)(), ref, R)
    idx = np.tile(np.arange(N, dtype=np.int32), (R, 1))
    member.push_list(np.ascontiguousarray(lg[:, :N]), idx, en)
    member.merge(lg, en, req, bt)
    assert member.health().ok


def test_stream_handles(member, small_shape):
    """A stream that is no cudaStream_t (a bool, an int outside
    0..2^64-1) is refused with InvalidArgument; ctypes passed 2^64 on as
    0 (the legacy default stream: the calls ordered on another stream
    than the one named), -1 as 2^64-1 and True as 1. numpy integers are
    integers."""
    lg, en, req, bt = _ref_args(small_shape)

    class Handle:
        cuda_stream = 1 << 64

    for bad in (1 << 64, -1, True, 1.5, "s", Handle()):
        with pytest.raises(dcpx.InvalidArgument, match="stream"):
            member.prepare(lg, en, req, bt, stream=bad)
    for ok in (0, np.uint64(2), (1 << 64) - 1):
        member.prepare(lg, en, req, bt, stream=ok)()  # the host ignores it
    # push, merge and recover check it on the host backend too (they
    # took anything there: "bogus", object())
    for bad in (np.True_, "bogus", object(), -1):
        with pytest.raises(dcpx.InvalidArgument, match="stream"):
            member.push(lg, en, stream=bad)
        with pytest.raises(dcpx.InvalidArgument, match="stream"):
            member.recover(timeout_ms=10, stream=bad)
    member.push(lg, en, stream=np.uint64(3))
    with pytest.raises(dcpx.InvalidArgument, match="stream"):
        member.merge(lg, en, req, bt, stream="bogus")
    compare(member.merge(lg, en, req, bt, stream=0), dcpx.ref_call(
        small_shape, [lg], [en], 0, req, bt), 4)
    assert member.health().ok


def test_masked_arrays(member, small_shape):
    """A numpy masked array is refused with InvalidArgument (by ref_call
    too): libdcpx reads every element and never sees the mask, so masked
    logits took part in the top-K as if unmasked."""
    lg, en, req, bt = _ref_args(small_shape)
    mask = np.zeros(lg.shape, bool)
    mask[:, :64] = True
    ma = np.ma.masked_array(lg, mask=mask)
    with pytest.raises(dcpx.InvalidArgument,
                       match="logits is a numpy masked array"):
        member.push(ma, en)
    with pytest.raises(dcpx.InvalidArgument,
                       match="req_id is a numpy masked array"):
        member.prepare(lg, en, np.ma.masked_array(req), bt)
    with pytest.raises(dcpx.InvalidArgument,
                       match="logits is a numpy masked array"):
        dcpx.ref_call(small_shape, [ma], [en], 0, req, bt)
    assert member.async_error().state == 0  # nothing reached libdcpx
    class Sub(np.ndarray):  # other subclasses are arrays as they are
        pass

    member.push(lg.view(Sub), en)
    compare(member.merge(lg, en, req, bt),
            dcpx.ref_call(small_shape, [lg], [en], 0, req, bt), 4)


def test_block_table_beyond_uint32(member, small_shape):
    """A block table with a side of 2^32 or more (here views that claim
    it over a small buffer; the library reads only the rows req_id
    names) is refused with InvalidArgument naming the limit: ctypes cut
    bt_rows and bt_cols to 32 bits, giving the library another table (a
    (2^32 + 4) x 32 one went through as 4 x 32, a 4 x (2^32 + 8) one as
    4 x 8 read with a pitch of 8)."""
    lg, en, req, bt = _ref_args(small_shape)
    buf = np.zeros(1 << 16, np.int32)
    tall = np.lib.stride_tricks.as_strided(buf, ((1 << 32) + 4, 32),
                                           (128, 4))
    wide = np.lib.stride_tricks.as_strided(buf, (4, (1 << 32) + 8),
                                           (4 * ((1 << 32) + 8), 4))
    for big in (tall, wide):
        assert big.flags.c_contiguous
        member.push(lg, en)
        with pytest.raises(dcpx.InvalidArgument, match="below 2"):
            member.merge(lg, en, req, big)
        with pytest.raises(dcpx.InvalidArgument, match="below 2"):
            member.prepare(lg, en, req, big)
        member.merge(lg, en, req, bt)
    assert member.async_error().state == 0  # nothing reached libdcpx
    with pytest.raises(dcpx.InvalidArgument, match="below 2"):
        dcpx.ref_call(small_shape, [lg], [en], 0, req, tall)


def test_ref_local_list_limits(libdcpx):
    """ref_local_list's limits (1 <= cap <= MAX_TOPK, at most MAX_LOCAL
    logits) are named: the library's refusal was a bare "invalid
    argument"."""
    x = np.arange(128, dtype=np.uint16)
    for cap in (0, dcpx.MAX_TOPK + 1, 1 << 20):
        with pytest.raises(dcpx.InvalidArgument,
                           match=f"cap: {cap} is not an integer in "
                                 f"1..{dcpx.MAX_TOPK}"):
            dcpx.ref_local_list(x, cap)
    with pytest.raises(dcpx.InvalidArgument,
                       match=f"more than MAX_LOCAL={dcpx.MAX_LOCAL}"):
        dcpx.ref_local_list(np.zeros(dcpx.MAX_LOCAL + 1, np.uint16), 4)
    assert len(dcpx.ref_local_list(x, dcpx.MAX_TOPK)) == 128
    assert len(dcpx.ref_local_list(np.zeros(dcpx.MAX_LOCAL, np.uint16),
                                   1)) == 1
