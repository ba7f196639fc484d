"""A private dcpxd for tests and examples (not for production: run the
systemd unit there, see README.md).

    import dcpx.testing   # a submodule: `import dcpx` does not load it

    with dcpx.testing.PrivateDaemon() as d:  # $DCPXD, the build tree's, PATH
        client = dcpx.Client(d.socket)
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import weakref
from typing import List, Optional

from .core import Client
from .errors import DcpxError

__all__ = ["PrivateDaemon", "find_dcpxd"]


def find_dcpxd() -> Optional[str]:
    """``$DCPXD``, a dcpxd of the checkout's build tree, or dcpxd on PATH
    (also /usr/sbin, /usr/local/sbin)."""
    env = os.environ.get("DCPXD")
    if env:
        return env
    root = os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))))
    lp = os.environ.get("DCPX_LIBRARY")
    cands: List[str] = []
    if lp:  # <build>/libclient/.libs/libdcpx.so -> <build>/daemon/dcpxd
        b = os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(lp))))
        cands.append(os.path.join(b, "daemon", "dcpxd"))
    import glob
    cands += sorted(glob.glob(os.path.join(root, "build*", "daemon",
                                           "dcpxd")))
    cands.append(os.path.join(root, "daemon", "dcpxd"))
    for c in cands:
        if os.access(c, os.X_OK):
            return c
    path = os.environ.get("PATH", "") + ":/usr/local/sbin:/usr/sbin"
    return shutil.which("dcpxd", path=path)


def _reap(proc: "subprocess.Popen", path: str, owner: int) -> None:
    """A PrivateDaemon's dcpxd and temp dir, when nobody stopped them; in
    the process that started it only (a forked child's exit leaves its
    parent's daemon alone)."""
    if os.getpid() != owner:
        return
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shutil.rmtree(path, ignore_errors=True)


def _rmdir(path: str, owner: int) -> None:
    """A PrivateDaemon's temp dir, when it was never started."""
    if os.getpid() == owner:
        shutil.rmtree(path, ignore_errors=True)


class PrivateDaemon:
    """dcpxd on a private socket in a temp dir, with its own state dir;
    started by :meth:`start` (or ``with``), stopped by SIGTERM."""

    def __init__(self, binary: Optional[str] = None,
                 extra_args: Optional[List[str]] = None,
                 join_timeout_ms: int = 20000,
                 fault_injection: bool = True) -> None:
        self.binary = binary or find_dcpxd()
        if not self.binary:
            raise FileNotFoundError(
                "dcpxd not found: build dcpx (make) and set DCPXD to "
                "<build>/daemon/dcpxd, or install it")
        self.dir = tempfile.mkdtemp(prefix="dcpx-py.")
        self.socket = os.path.join(self.dir, "d.sock")
        self.state = os.path.join(self.dir, "state")
        self.args = [self.binary, "--socket", self.socket, "--state-dir",
                     self.state, "--join-timeout-ms", str(join_timeout_ms),
                     "--config="]
        if fault_injection:
            self.args.append("--enable-fault-injection")
        self.args += list(extra_args or [])
        self.proc: Optional[subprocess.Popen] = None
        self.log = os.path.join(self.dir, "dcpxd.log")
        # the temp dir of one never started (start() hands it to _reap)
        self._dir_reaper = weakref.finalize(self, _rmdir, self.dir,
                                            os.getpid())

    def start(self, timeout_s: float = 10.0) -> "PrivateDaemon":
        """Starts dcpxd and waits until it answers; raises RuntimeError
        (with its log) if it does not, leaving nothing behind (its temp
        dir goes too). A daemon never stopped is stopped when this object
        is collected or the interpreter exits (not when the process is
        killed: use ``with``, or :meth:`stop`, in a ``finally``); so is
        the temp dir of one never started. After :meth:`stop` it starts
        again on the same socket, with a fresh state dir. Called while
        its dcpxd runs, it raises RuntimeError: a second dcpxd on the same
        socket and state dir would orphan the first."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError(f"dcpxd (pid {self.proc.pid}) is running on "
                               f"{self.socket}: stop() it first")
        try:
            os.makedirs(self.dir, mode=0o700, exist_ok=True)  # after stop()
            with open(self.log, "ab") as log:
                self.proc = subprocess.Popen(self.args, stdout=log,
                                             stderr=log,
                                             stdin=subprocess.DEVNULL)
        except OSError as e:
            self.stop()
            raise RuntimeError(f"cannot run {self.args[0]}: {e}") from e
        self._reaper = weakref.finalize(self, _reap, self.proc, self.dir,
                                        os.getpid())
        self._dir_reaper.detach()
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                why = (f"dcpxd exited {self.proc.returncode}: "
                       f"{self.read_log()}")
                self.stop()
                raise RuntimeError(why)
            if os.path.exists(self.socket):
                try:
                    Client(self.socket).close()
                    return self
                except DcpxError:
                    pass
            time.sleep(0.01)
        why = "dcpxd did not come up: " + self.read_log()
        self.stop()
        raise RuntimeError(why)

    def read_log(self) -> str:
        try:
            with open(self.log, "rb") as f:
                return f.read().decode("utf-8", "replace")[-4000:]
        except OSError:
            return ""

    def stop(self) -> int:
        """SIGTERM, wait; returns dcpxd's exit status (0: clean)."""
        reaper = getattr(self, "_reaper", None)
        if reaper is not None:
            reaper.detach()
        rc = 0
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait()
        elif self.proc is not None:
            rc = self.proc.returncode
        self.proc = None
        shutil.rmtree(self.dir, ignore_errors=True)
        return rc

    def client(self) -> Client:
        return Client(self.socket)

    def __enter__(self) -> "PrivateDaemon":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
