"""Ctrl-C during Client.join and Member.recover: both wait in C for other
ranks (up to their timeouts), and used to take the KeyboardInterrupt only
when that wait returned. Now the signal stops the wait within about 50 ms
(dcpx_client_interrupt, dcpx_member_interrupt): an interrupted join leaves
no rank behind in dcpxd, so the same rank joins again; an interrupted
recovery goes on when recover() is called again.

Each case runs in a child process that sends itself SIGINT, so that a
KeyboardInterrupt that escapes cannot stop the pytest session."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

import dcpx

HERE = os.path.dirname(os.path.abspath(__file__))

_PRELUDE = textwrap.dedent("""
    import json, os, signal, sys, threading, time
    import dcpx
    # Python's own Ctrl-C handler, as in a terminal: a job started in the
    # background (CI's `... &`) inherits SIGINT ignored, and Python then
    # installs none
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sock, group = sys.argv[1], sys.argv[2]
    shape = dcpx.Shape(world=2, rows=4, topk=16, local_topk=4, block_size=4,
                       max_local=128)
    fired = []

    def sigint_in(s):
        def fire():
            fired.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGINT)
        threading.Timer(s, fire).start()

    def join_in_thread(rank, got, **kw):
        def run():
            got[rank] = dcpx.Client(sock).join(shape, rank=rank, group=group,
                                               **kw)
        t = threading.Thread(target=run)
        t.start()
        return t
    """)

_JOIN = _PRELUDE + textwrap.dedent("""
    c = dcpx.Client(sock)
    out = {}
    sigint_in(0.3)
    t0 = time.monotonic()
    try:
        c.join(shape, rank=0, group=group, join_timeout_ms=20000)
        out["first"] = "joined"
    except KeyboardInterrupt:
        out["first"] = "interrupted"
        out["after_signal_s"] = time.monotonic() - fired[0]
    # dcpxd forgot rank 0: it joins again, beside a rank 1
    got = {}
    t = join_in_thread(1, got, join_timeout_ms=20000)
    m0 = c.join(shape, rank=0, group=group, join_timeout_ms=20000)
    t.join(30)
    out["again"] = [m0.rank, got[1].rank]
    m0.leave()
    got[1].leave()
    print(json.dumps(out))
    """)

_RECOVER = _PRELUDE + textwrap.dedent("""
    import numpy as np
    got = {}
    ts = [join_in_thread(r, got, timeout_ns=300_000_000) for r in (0, 1)]
    for t in ts:
        t.join(30)
    m0, m1 = got[0], got[1]
    lg = np.zeros((4, 128), np.uint16)
    en = np.full(4, 128, np.int32)
    req = np.arange(4, dtype=np.int32)
    bt = np.arange(4 * 32, dtype=np.int32).reshape(4, 32)
    out = {}
    m0.push(lg, en)
    try:
        m0.merge(lg, en, req, bt)  # rank 1 never pushes: rank 0 fails
    except (dcpx.Failed, dcpx.Aborted) as e:
        out["merge"] = type(e).__name__
    sigint_in(0.3)
    try:
        m0.recover(timeout_ms=20000)  # rank 1 never acknowledges
        out["first"] = "recovered"
    except KeyboardInterrupt:
        out["first"] = "interrupted"
        out["after_signal_s"] = time.monotonic() - fired[0]
    try:
        m0.recover(timeout_ms=300)  # goes on: still waits for rank 1
        out["second"] = "recovered"
    except dcpx.TimedOut as e:
        out["second"] = "TimedOut"
        out["second_text"] = str(e)
    t = threading.Thread(target=lambda: m1.recover(timeout_ms=20000))
    t.start()
    m0.recover(timeout_ms=20000)
    t.join(30)
    out["third"] = m0.health().generation
    m0.leave()
    m1.leave()
    print(json.dumps(out))
    """)


_LATE = _PRELUDE + textwrap.dedent("""
    import gc, random
    def alarm(*a):
        raise KeyboardInterrupt  # as Ctrl-C's handler does
    signal.signal(signal.SIGALRM, alarm)
    rng = random.Random(int(sys.argv[3]))
    c0, c1 = dcpx.Client(sock), dcpx.Client(sock)
    out = {"interrupted": 0, "joined": 0, "left_joined": 0}
    for i in range(int(sys.argv[4])):
        g, got = f"{group}-{i}", {}
        def join1():
            try:
                got[1] = c1.join(shape, rank=1, group=g,
                                 join_timeout_ms=2000)
            except dcpx.TimedOut:
                got[1] = None
        t = threading.Thread(target=join1)
        t.start()
        time.sleep(0.005)
        m0 = None
        try:
            signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.0001, 0.004))
            m0 = c0.join(shape, rank=0, group=g, join_timeout_ms=2000)
            time.sleep(0.05)  # the alarm fires by now, here at the latest
        except KeyboardInterrupt:
            pass
        except RuntimeError as e:
            # CPython's own: a signal's exception inside Thread.start's
            # Condition.wait releases its lock twice (threading.py);
            # dcpx must still leave no rank behind, and the Client serve on
            if "release unlocked lock" not in str(e):
                raise
            out["cpython_lock"] = out.get("cpython_lock", 0) + 1
        signal.setitimer(signal.ITIMER_REAL, 0)
        t.join(30)
        if got.get(1) is None:
            continue
        if m0 is None:
            out["interrupted"] += 1
            gc.collect()
            end = time.monotonic() + 2
            while got[1].health().joined_mask & 1 and time.monotonic() < end:
                time.sleep(0.01)
            out["left_joined"] += got[1].health().joined_mask & 1
        else:
            out["joined"] += 1
            m0.leave()
        got[1].leave()
    print(json.dumps(out))
    """)


def _child(script, daemon, group, *args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(HERE), env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", script, daemon.socket, group,
                        *args],
                       capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_ctrl_c_stops_a_join(daemon, group):
    out = _child(_JOIN, daemon, group)
    assert out["first"] == "interrupted", out
    assert out["after_signal_s"] < 0.5, out  # not the 20 s join timeout
    assert out["again"] == [0, 1], out


def test_ctrl_c_stops_a_recovery(daemon, group):
    out = _child(_RECOVER, daemon, group)
    assert out["merge"] in ("Failed", "Aborted"), out
    assert out["first"] == "interrupted", out
    assert out["after_signal_s"] < 0.5, out  # not the 20 s timeout
    assert out["second"] == "TimedOut", out
    # both ranks live: the message says that one has not acknowledged
    assert "every rank is held" in out["second_text"], out
    assert out["third"] >= 2, out  # the group recovered after all


def test_ctrl_c_as_a_join_ends_leaves_no_rank(daemon, group):
    """Ctrl-C that lands as the join's wait ends (the C join has
    returned, the caller has no Member yet) leaves the group: the
    exception goes on and dcpxd holds no rank of this process. Such a
    signal skipped the undo: 6-12 of 200 joins left rank 0 joined, with
    its descriptors open, and its peer waited on it. 150 joins, each
    interrupted 0.1-4 ms after its start (a fixed seed)."""
    out = _child(_LATE, daemon, group, "35", "150")
    assert out["left_joined"] == 0, out
    assert out["interrupted"] > 0 and out["joined"] > 0, out


def test_interrupt_code_maps_to_its_class(libdcpx):
    e = dcpx.error_for(-4, "x")
    assert isinstance(e, dcpx.Interrupted) and e.name == "DCPX_E_INTR"
    assert "interrupted" in str(e)
