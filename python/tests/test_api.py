"""The package surface: loading, versions, the error table, helpers."""

import ctypes
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import dcpx
from dcpx import _arrays as A

HERE = os.path.dirname(os.path.abspath(__file__))
HEADER = os.path.join(HERE, "..", "..", "include", "dcpx.h")


def _header_codes():
    with open(HEADER) as f:
        text = f.read()
    return {name: int(v) for name, v in
            re.findall(r"X\((DCPX_E_\w+),\s*(-?\d+),", text)}


def test_struct_layouts_match_the_library(libdcpx):
    """Every struct the package mirrors has the C library's size, and the
    package mirrors every DCPX_STRUCT_* kind of the header: a field added
    on one side only fails here."""
    from dcpx._lib import STRUCT_KINDS, lib
    with open(HEADER) as f:
        kinds = {int(v) for v in
                 re.findall(r"#define DCPX_STRUCT_\w+ (\d+)u", f.read())}
    assert kinds and kinds == set(STRUCT_KINDS)
    for kind, cls in STRUCT_KINDS.items():
        assert lib().dcpx_struct_size(kind) == ctypes.sizeof(cls), cls
    assert lib().dcpx_struct_size(0) == 0
    assert lib().dcpx_struct_size(max(kinds) + 1) == 0


def test_gid(libdcpx):
    """dcpx_gid: the gid through an out-parameter, a code on bad input."""
    from dcpx._lib import lib
    g = ctypes.c_int64(-5)
    assert lib().dcpx_gid(70, 1, 4, 64, ctypes.byref(g)) == 0
    assert g.value == 326
    g.value = -5
    from dcpx.errors import InvalidArgument
    assert lib().dcpx_gid(0, 2, 2, 1, ctypes.byref(g)) == InvalidArgument.code
    assert g.value == -5


def test_version(libdcpx):
    assert re.match(r"\d+\.\d+\.\d+", dcpx.version())
    assert dcpx.version().split(".")[0] == dcpx.__version__.split(".")[0]


def test_every_error_code_has_a_class(libdcpx):
    codes = _header_codes()
    assert len(codes) >= 30
    for name, code in codes.items():
        cls = dcpx.ERRORS.get(code)
        assert cls is not None, f"{name} ({code}) has no exception class"
        assert cls.name == name and cls.code == code
        e = dcpx.error_for(code, "doing x")
        assert type(e) is cls and isinstance(e, dcpx.DcpxError)
        assert e.code == code and e.message == dcpx.strerror(code)
        assert "doing x" in str(e) and name in str(e)
        assert getattr(dcpx, cls.__name__) is cls
        assert cls.__name__ in dcpx.errors.__all__
        assert cls.__doc__.endswith(f"(``{name}``, {code})")
    assert set(dcpx.ERRORS) == set(codes.values())
    # builtin bases an engine may already catch
    assert issubclass(dcpx.InvalidArgument, ValueError)
    assert issubclass(dcpx.TimedOut, TimeoutError)
    assert issubclass(dcpx.DtypeError, TypeError)
    assert issubclass(dcpx.DtypeError, dcpx.InvalidArgument)
    unknown = dcpx.error_for(-4242)
    assert type(unknown) is dcpx.DcpxError and unknown.code == -4242


def test_errors_pickle(libdcpx):
    import pickle
    e = dcpx.error_for(-1007, "merge")
    f = pickle.loads(pickle.dumps(e))
    assert type(f) is dcpx.Failed and f.code == -1007 and str(f) == str(e)


def test_error_built_by_hand_names_its_code(libdcpx):
    """A DcpxError built with a known code names it in its text (and
    name), as the code's class does: it showed "[DCPX_E_UNKNOWN -22]"
    for DcpxError(code=-22) and for a raw errno. The bare DcpxError()
    still names no code, and every one pickles to the same text."""
    import pickle
    for code, name in ((-22, "DCPX_E_INVAL"), (-1001, "DCPX_E_SHAPE"),
                       (-1, "DCPX_E_PERM"), (-110, "DCPX_E_TIMEDOUT"),
                       (-9, "EBADF"), (-9999, "DCPX_E_UNKNOWN")):
        for e in (dcpx.DcpxError(code=code),
                  dcpx.DcpxError("why", code=code, context="doing x"),
                  dcpx.error_for(code)):
            assert e.code == code and e.name == name, (code, e.name)
            assert str(e).endswith(f"[{name} {code}]"), str(e)
            f = pickle.loads(pickle.dumps(e))
            assert type(f) is type(e) and str(f) == str(e) and \
                f.name == name
    assert str(dcpx.DcpxError(code=-22)) == \
        f"{dcpx.strerror(-22)} [DCPX_E_INVAL -22]"
    assert str(dcpx.DcpxError(code=-9)).startswith(dcpx.strerror(-9))
    bare = dcpx.DcpxError()
    assert str(bare) == "unknown dcpx error [DCPX_E_UNKNOWN -1]"
    assert str(pickle.loads(pickle.dumps(bare))) == str(bare)
    # a class's own code keeps its name; another code is named as itself
    assert dcpx.InvalidArgument(context="x").name == "DCPX_E_INVAL"
    assert dcpx.DtypeError(context="x").name == "DCPX_E_INVAL"
    assert dcpx.InvalidArgument(code=-5).name == "DCPX_E_IO"
    assert dcpx.Failed().name == "DCPX_E_FAILED"


def test_shape_defaults_and_auto_n(libdcpx):
    s = dcpx.Shape(world=8, rows=64, topk=2048, max_local=16384)
    assert s.local_topk == 0
    n = dcpx.auto_local_topk(8, 2048)
    assert 256 <= n < 2048 and n % 32 == 0
    assert s.resolved().local_topk == n
    s.check()
    with pytest.raises(dcpx.LimitError):
        dcpx.Shape(world=17, rows=1, topk=4, local_topk=1).check()
    with pytest.raises(dcpx.InvalidArgument,
                       match="local_topk 4 must be less than topk 4"):
        dcpx.Shape(world=2, rows=1, topk=4, local_topk=4).check()
    # out of range: 0, not wrapped into range as a uint32 (was 320 for
    # 2**32 + 8, the value for W = 8)
    assert dcpx.auto_local_topk(2**32 + 8, 2048) == 0
    assert dcpx.auto_local_topk(-(2**32) + 8, 2048) == 0
    with pytest.raises(dcpx.InvalidArgument):
        dcpx.auto_local_topk(8.0, 2048)
    with pytest.raises(dcpx.InvalidArgument):
        dcpx.Shape(world=-1).check()
    o = dcpx.JoinOptions()
    assert o.backend == dcpx.Backend.HOST and o.device == -1
    assert o.timeout_ns == 1_000_000_000


def test_bf16_bits():
    x = np.array([0.0, -0.0, 1.0, -2.5, np.inf, -np.inf, 3.14159],
                 np.float32)
    b = dcpx.to_bf16_bits(x)
    assert b.dtype == np.uint16
    assert b.tolist()[:6] == [0, 0x8000, 0x3F80, 0xC020, 0x7F80, 0xFF80]
    assert abs(dcpx.from_bf16_bits(b)[6] - 3.14159) < 0.02
    n = dcpx.to_bf16_bits(np.array([np.nan], np.float32))
    assert (int(n[0]) & 0x7FFF) > 0x7F80
    # not numbers: the package's own error, naming the function
    for bad in ("abc", [1.0, "x"], object(),
                # numpy reads these as numbers: "1.5" as 1.5, None as NaN
                "1.5", [1.0, None], None, np.array([1.0, None]),
                np.array([1 + 2j]), [1.0, 2j]):
        with pytest.raises(dcpx.InvalidArgument) as e:
            dcpx.to_bf16_bits(bad)
        assert "to_bf16_bits" in str(e.value)


def test_bf16_bits_wide_floats():
    import warnings
    # beyond float32's range: an infinity of the sign, and no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = dcpx.to_bf16_bits(np.array([1e39, -1e300, 3e38]))
    assert b.tolist()[:2] == [0x7F80, 0xFF80]
    assert b[2] == dcpx.to_bf16_bits(np.array([3e38], np.float32))[0]
    # float64 goes through float32 (as torch's .to(torch.bfloat16)): 1 +
    # 2^-8 + 2^-30 is 1 + 2^-8 in float32, a tie that rounds to even (1.0)
    assert dcpx.to_bf16_bits(np.array([1 + 2**-8 + 2**-30]))[0] == 0x3F80


def test_ref_local_list(libdcpx):
    row = np.array([0x3F80, 0x4000, 0x7FC0, 0x4000, 0x3F00], np.uint16)
    lst = dcpx.ref_local_list(row, 2)
    assert [l for _, l in lst] == [1, 3]  # ties: lower l; NaN never


def test_missing_library_message(tmp_path):
    env = dict(os.environ, DCPX_LIBRARY=str(tmp_path / "nope.so"))
    code = ("import dcpx\n"
            "try:\n    dcpx.load()\nexcept dcpx.LibraryNotFound as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60,
                         cwd=os.path.dirname(HERE))
    assert "make install" in out.stdout and "DCPX_LIBRARY" in out.stdout, \
        out.stdout + out.stderr


def test_check_array_rules():
    cpu, gpu = ("cpu", -1), ("cuda", 0)
    a = np.zeros((2, 3), np.uint16)
    A.check_array(a, "x", A.BF16, 2, cpu)
    A.check_array(a.view(np.int16), "x", A.BF16, 2, cpu)
    with pytest.raises(dcpx.DtypeError):
        A.check_array(a.astype(np.float32), "x", A.BF16, 2, cpu)
    with pytest.raises(dcpx.DtypeError):
        A.check_array([[1, 2]], "x", A.BF16, 2, cpu)
    with pytest.raises(dcpx.DeviceError):
        A.check_array(a, "x", A.BF16, 2, gpu)
    with pytest.raises(dcpx.InvalidArgument, match="C-contiguous"):
        A.check_array(np.zeros((3, 4), np.uint16)[:, ::2], "x", A.BF16, 2,
                      cpu)
    with pytest.raises(dcpx.InvalidArgument, match="2-D"):
        A.check_array(np.zeros(3, np.uint16), "x", A.BF16, 2, cpu)
    with pytest.raises(dcpx.DtypeError):
        A.check_array(np.zeros(3, ">i4"), "x", A.I32, 1, cpu)


def test_connect_refused(libdcpx, tmp_path):
    with pytest.raises((dcpx.ConnectionRefused, dcpx.NotFound)) as ei:
        dcpx.Client(str(tmp_path / "no.sock"))
    assert ei.value.code in (-111, -2)


def test_private_daemon_not_left_running(tmp_path):
    """A PrivateDaemon its program never stops is stopped (and its temp
    dir removed) when the interpreter exits; it was left running under
    init."""
    import subprocess
    import sys
    import time
    script = tmp_path / "orphan.py"
    script.write_text("import dcpx.testing\n"
                      "d = dcpx.testing.PrivateDaemon().start()\n"
                      "print(d.proc.pid, d.dir)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    pid, path = int(out[0]), out[1]
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        raise AssertionError(f"dcpxd {pid} still runs")
    assert not os.path.exists(path)


def test_private_daemon_survives_a_forked_child():
    """A forked child that exits normally runs the finalizers it inherited:
    the parent's PrivateDaemon must stay (its dir and dcpxd)."""
    d = dcpx.testing.PrivateDaemon().start()
    try:
        pid = os.fork()
        if pid == 0:  # what a child's ordinary exit runs, then out
            import atexit
            atexit._run_exitfuncs()
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.path.exists(d.socket) and d.proc.poll() is None
        dcpx.Client(d.socket).close()
    finally:
        d.stop()


def test_private_daemon_never_started_leaves_nothing(tmp_path):
    """A PrivateDaemon made but never started (a test that failed or
    skipped before start()) removes its temp dir when collected or at
    exit; it was left in $TMPDIR."""
    import subprocess
    import sys
    import dcpx.testing
    d = dcpx.testing.PrivateDaemon(binary="/bin/true")
    path = d.dir
    assert os.path.isdir(path)
    del d
    import gc
    gc.collect()
    assert not os.path.exists(path)
    script = tmp_path / "unstarted.py"
    script.write_text("import dcpx.testing\n"
                      "d = dcpx.testing.PrivateDaemon(binary='/bin/true')\n"
                      "print(d.dir)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True,
                         text=True, timeout=60, check=True).stdout.split()
    assert not os.path.exists(out[0])


def test_private_daemon_starts_again_after_stop(libdcpx):
    """stop() removes the temp dir; a later start() made it again (it
    failed as 'cannot run dcpxd: No such file ... dcpxd.log')."""
    import dcpx.testing
    if not dcpx.testing.find_dcpxd():
        pytest.skip("dcpxd not found (set DCPXD)")
    d = dcpx.testing.PrivateDaemon().start()
    try:
        assert d.stop() == 0 and not os.path.exists(d.dir)
        d.start()
        dcpx.Client(d.socket).close()
    finally:
        assert d.stop() == 0
    assert not os.path.exists(d.dir)
