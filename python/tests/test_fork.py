"""fork() after a join: the child's copy of a Member is the parent's rank.
The child's calls are refused (StateError, naming fork), and the child's
leave (explicit, or Member.__del__ at its exit) only releases its copy:
the parent's rank stays in its group and merges on."""

import os

import numpy as np
import pytest

import dcpx


def _call(m):
    lg = (np.arange(8 * 1024, dtype=np.uint16) % 97 + 0x3F00).reshape(8, 1024)
    en = np.full(8, 1024, np.int32)
    req = np.arange(8, dtype=np.int32)
    bt = np.arange(8 * 256, dtype=np.int32).reshape(8, 256)
    m.push(lg, en)
    return m.merge(lg, en, req, bt)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_forked_child_leaves_the_parent_alone(daemon, group):
    shape = dcpx.Shape(world=1, rows=8, topk=64, local_topk=0,
                       block_size=4, max_local=1024)
    c = dcpx.Client(daemon.socket)
    m = c.join(shape, rank=0, group=group, timeout_ns=2_000_000_000)
    _call(m)
    pid = os.fork()
    if pid == 0:  # the child: refused; then it leaves its copy
        code = 3
        try:
            _call(m)
            code = 1
        except dcpx.StateError as e:
            code = 0 if "fork" in str(e) else 2
        except BaseException:
            pass
        if code == 0:
            m.leave()  # as Member.__del__ does at the child's exit
            c.close()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    h = m.health()
    assert h.abort == 0 and h.joined_mask == 1
    res = _call(m)  # the parent's rank still merges
    assert (res.valid_out >= 0).all()
    m.leave()
    c.close()
