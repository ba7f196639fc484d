"""Where the package looks for libdcpx (dcpx._lib._candidates): a source
checkout's build folders only when the package lies in one, never in a
folder others may write. A package installed with `pip install --target
/tmp/x` used to take /tmp as its checkout once /tmp/include/dcpx.h
existed, and loaded /tmp/build*/libclient/.libs/libdcpx.so.0, which any
local user can plant."""
import os
import shutil

import pytest

from dcpx import _lib


def _tree(base, world_writable, markers=True):
    """base/python/dcpx/_lib.py, base/build-x/libclient/.libs/libdcpx.so.0
    and (markers) base/configure.ac and base/include/dcpx.h."""
    pkg = os.path.join(base, "python", "dcpx")
    os.makedirs(pkg)
    shutil.copy(_lib.__file__, os.path.join(pkg, "_lib.py"))
    libs = os.path.join(base, "build-x", "libclient", ".libs")
    os.makedirs(libs)
    open(os.path.join(libs, "libdcpx.so.0"), "w").close()
    if markers:
        os.makedirs(os.path.join(base, "include"))
        open(os.path.join(base, "include", "dcpx.h"), "w").close()
        open(os.path.join(base, "configure.ac"), "w").close()
    os.chmod(base, 0o777 if world_writable else 0o755)
    return os.path.join(pkg, "_lib.py")


def test_checkout_root_taken(tmp_path):
    here = _tree(str(tmp_path / "src"), world_writable=False)
    assert _lib._checkout_root(here) == str(tmp_path / "src")


@pytest.mark.parametrize("case", ["world-writable", "group-writable",
                                  "no-markers", "target-install"])
def test_checkout_root_refused(tmp_path, case):
    base = str(tmp_path / "src")
    if case == "target-install":
        # pip install --target BASE/pyt: BASE/pyt/dcpx/_lib.py, whose third
        # folder up, BASE, has the markers planted
        os.makedirs(os.path.join(base, "pyt", "dcpx"))
        os.makedirs(os.path.join(base, "include"))
        open(os.path.join(base, "include", "dcpx.h"), "w").close()
        open(os.path.join(base, "configure.ac"), "w").close()
        here = os.path.join(base, "pyt", "dcpx", "_lib.py")
        shutil.copy(_lib.__file__, here)
    else:
        here = _tree(base, world_writable=case == "world-writable",
                     markers=case != "no-markers")
        if case == "group-writable":
            os.chmod(base, 0o775)
    assert _lib._checkout_root(here) is None


def test_refused_checkout_named(tmp_path, monkeypatch):
    """A checkout refused for its mode is named in LibraryNotFound's text,
    with what to do: a clone made under umask 002 was skipped without a
    word, and the loader's "not found" was all the user saw."""
    here = _tree(str(tmp_path / "src"), world_writable=False)
    os.chmod(str(tmp_path / "src"), 0o775)
    root, why = _lib._checkout(here)
    assert root is None
    assert str(tmp_path / "src") in why and "mode 0775" in why
    assert "DCPX_LIBRARY" in why and "chmod go-w" in why
    # what lib() says once nothing loads: the reason comes first (not with
    # DCPX_LIBRARY set: the checkout is not searched then anyway)
    monkeypatch.delenv("DCPX_LIBRARY", raising=False)
    monkeypatch.setattr(_lib, "_lib", None)
    monkeypatch.setattr(_lib, "__file__", here)
    monkeypatch.setattr(_lib, "_candidates", lambda: ["/nonexistent/x.so"])
    with pytest.raises(_lib.LibraryNotFound) as e:
        _lib.lib()
    text = str(e.value)
    assert why in text and text.index(why) < text.index("/nonexistent/x.so")
    monkeypatch.setenv("DCPX_LIBRARY", "/nonexistent/x.so")
    with pytest.raises(_lib.LibraryNotFound) as e:
        _lib.lib()
    assert why not in str(e.value)
    assert _lib._checkout(os.path.join(str(tmp_path), "x", "_lib.py")) == \
        (None, None)
