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
