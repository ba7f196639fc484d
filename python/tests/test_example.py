"""examples/decode_step.py, small, on the host backend (its own private
dcpxd): every row exact."""

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLE = os.path.join(HERE, "..", "examples", "decode_step.py")


def test_decode_step_host(daemon):
    out = subprocess.run(
        [sys.executable, EXAMPLE, "--world", "3", "--layers", "3",
         "--steps", "2", "--rows", "6", "--topk", "64", "--local-len",
         "700", "--interleave", "2", "--backend", "host",
         "--socket", daemon.socket],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "exact: 108/108 rows" in out.stdout, out.stdout


def test_decode_step_context_below_topk(daemon):
    """A context of fewer positions than K/2 (W * local_len < K / 2): every
    row holds fewer than K candidates, and the example still runs."""
    out = subprocess.run(
        [sys.executable, EXAMPLE, "--world", "2", "--layers", "1",
         "--steps", "1", "--rows", "2", "--topk", "256", "--local-len",
         "10", "--backend", "host", "--socket", daemon.socket],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "exact: 4/4 rows" in out.stdout, out.stdout


def test_decode_step_without_dcpxd_leaves_nothing(tmp_path):
    """No dcpxd to start: a one-line error and exit 1, and no temp dir
    left behind (its run dir was made before the daemon's start, outside
    the try that removes it)."""
    env = dict(os.environ, DCPXD=str(tmp_path / "no-dcpxd"),
               TMPDIR=str(tmp_path / "tmp"))
    os.mkdir(env["TMPDIR"])
    out = subprocess.run(
        [sys.executable, EXAMPLE, "--world", "2", "--backend", "host"],
        capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "cannot start a private dcpxd" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert os.listdir(env["TMPDIR"]) == []


def test_decode_step_shape_beyond_the_limits():
    """A shape dcpx refuses is one usage error naming the limit, before
    any rank starts: each rank's join printed its own traceback, and the
    run ended "exact: 0/0 rows"."""
    for args, why in ((["--topk", "5000"], "topk 5000 exceeds the limit"),
                      (["--topk", "64", "--local-topk", "64"],
                       "local_topk 64 must be less than topk 64")):
        out = subprocess.run(
            [sys.executable, EXAMPLE, "--world", "2", "--backend", "host",
             "--socket", "/nonexistent"] + args,
            capture_output=True, text=True, timeout=120)
        assert out.returncode == 2, out.stdout + out.stderr
        assert why in out.stderr, out.stderr
        assert "Traceback" not in out.stderr, out.stderr
