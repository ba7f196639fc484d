"""Client and Member hold C pointers of this process: pickling one (as
multiprocessing's spawn does with a Process's arguments) or copying one
is refused with a TypeError that says what to do, instead of handing
another process a dangling pointer (it crashed there) or freeing the
pointer twice (copy.copy: a double free at the second close)."""

import copy
import multiprocessing as mp
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

import dcpx


def test_client_not_picklable(daemon):
    with dcpx.Client(daemon.socket) as c:
        with pytest.raises(TypeError, match="connect in the process"):
            pickle.dumps(c)
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            copy.copy(c)
        with pytest.raises(TypeError, match="cannot be pickled or copied"):
            copy.deepcopy(c)


def test_member_not_picklable(member):
    with pytest.raises(TypeError, match="each process connects and joins"):
        pickle.dumps(member)
    with pytest.raises(TypeError, match="cannot be pickled or copied"):
        copy.copy(member)
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(member.prepare(*_args()))


def _args():
    import numpy as np
    lg = np.zeros((4, 128), np.uint16)
    return (lg, np.full(4, 128, np.int32), np.arange(4, dtype=np.int32),
            np.arange(128, dtype=np.int32).reshape(4, 32))


def _child(c):  # never runs: the Client is refused when pickled
    c.close()


def test_spawn_with_a_client_is_refused_in_the_parent(daemon):
    ctx = mp.get_context("spawn")
    with dcpx.Client(daemon.socket) as c:
        p = ctx.Process(target=_child, args=(c,))
        with pytest.raises(TypeError, match="cannot be pickled"):
            p.start()


def test_copy_then_close_both_does_not_crash(daemon):
    # Before: copy.copy shared the pointer, the second close freed it
    # again (glibc aborted the process).
    code = textwrap.dedent(f"""
        import copy, dcpx
        c = dcpx.Client({daemon.socket!r})
        try:
            c2 = copy.copy(c)
        except TypeError:
            c2 = None
        c.close()
        if c2 is not None:
            c2.close()
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
