"""pytest fixtures for the dcpx package: a private dcpxd per module.

Run from a build tree (make check does it through python/run-tests.sh):
DCPX_LIBRARY=<build>/libclient/.libs/libdcpx.so.0 DCPXD=<build>/daemon/dcpxd
PYTHONPATH=<src>/python python3 -m pytest <src>/python/tests
"""

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # the package, uninstalled

np = pytest.importorskip("numpy", reason="numpy is not installed "
                         "(apt-get install python3-numpy)")

import dcpx  # noqa: E402
import dcpx.testing  # noqa: E402


def pytest_report_header(config):
    try:
        return [f"dcpx {dcpx.version()} from {dcpx.library_path()}; "
                f"dcpxd {dcpx.testing.find_dcpxd()}; "
                f"torch ops: {dcpx.torch_ops_available}"]
    except dcpx.LibraryNotFound as e:
        return [f"libdcpx not found: {e}"]


@pytest.fixture(scope="session")
def libdcpx():
    try:
        return dcpx.load()
    except dcpx.LibraryNotFound as e:
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def daemon(libdcpx):
    """A private dcpxd (socket and state dir in a temp dir)."""
    if not dcpx.testing.find_dcpxd():
        pytest.skip("dcpxd not found (set DCPXD)")
    d = dcpx.testing.PrivateDaemon().start()
    yield d
    rc = d.stop()
    assert rc == 0, f"dcpxd did not exit cleanly: {rc}"


_n = [0]


@pytest.fixture
def group(request):
    """A fresh group name per test."""
    _n[0] += 1
    name = "py-" + request.node.name.replace("[", "-").replace("]", "")
    return "".join(c if c.isalnum() or c in "._-" else "-"
                   for c in name)[:50] + f"-{os.getpid()}-{_n[0]}"


@pytest.fixture
def small_shape():
    """One rank, 4 rows, K=16 of N=4 over 128 logits: the shape of the
    argument and error tests."""
    return dcpx.Shape(world=1, rows=4, topk=16, local_topk=4, block_size=4,
                      interleave=1, max_local=128)


@pytest.fixture
def member(daemon, group, small_shape):
    """Rank 0 of a fresh one-rank group of small_shape."""
    with dcpx.Client(daemon.socket) as c, c.join(small_shape, rank=0,
                                                 group=group) as m:
        yield m
