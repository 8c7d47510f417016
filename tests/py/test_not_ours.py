"""Whole-file writes never destroy what is not ours; full disks and file
size limits fail cleanly; random arguments never crash (hypothesis)."""
import errno
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time

import pytest

import nvio
from nvio_testutil import pattern, read_file, write_file

ROOT = os.geteuid() == 0


def _whole_writes(h, buf, path):
    yield "write", lambda: h.write(buf, path)
    yield "aio_write", lambda: __import__("nvio.compat", fromlist=["x"]).aio_write(buf, path)
    yield "nvio.open", lambda: nvio.open(path, "wb", handle=h).__enter__().write(buf) and None


def test_fifo_refused_and_intact(tmp_path):
    p = str(tmp_path / "fifo")
    os.mkfifo(p)
    with nvio.AioHandle() as h:
        for name, call in _whole_writes(h, b"x" * 10, p):
            with pytest.raises((nvio.NvioError, ValueError)) as ei:
                call()
            assert p in str(ei.value) or getattr(ei.value, "filename", None) == p, name
            assert stat.S_ISFIFO(os.lstat(p).st_mode), name
    assert os.listdir(tmp_path) == ["fifo"]


@pytest.mark.skipif(not ROOT, reason="mknod of a device node needs root")
def test_device_node_refused_and_intact(tmp_path):
    p = str(tmp_path / "null")
    os.mknod(p, 0o666 | stat.S_IFCHR, os.makedev(1, 3))    # our own /dev/null node
    with nvio.AioHandle() as h:
        for name, call in _whole_writes(h, b"x" * 10, p):
            with pytest.raises((nvio.NvioError, ValueError)):
                call()
            st = os.lstat(p)
            assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3), name
    assert os.listdir(tmp_path) == ["null"]


def test_symlink_target_replaced_link_kept(tmp_path):
    target = tmp_path / "real.bin"
    write_file(target, b"old" * 100)
    link = tmp_path / "link.bin"
    os.symlink("real.bin", link)
    with nvio.AioHandle() as h:
        h.write(bytearray(b"new" * 10), str(link))
    assert os.path.islink(link) and os.readlink(link) == "real.bin"
    assert read_file(target) == b"new" * 10
    assert sorted(os.listdir(tmp_path)) == ["link.bin", "real.bin"]


KILLED_WRITER = textwrap.dedent(r"""
    import sys, nvio, numpy as np
    path = sys.argv[1]
    buf = np.ones(1 << 30, np.uint8)
    h = nvio.AioHandle(engine="psync", direct=False)
    print("ready", flush=True)
    for _ in range(1000):
        h.write(buf, path)
""")


def test_sigkill_mid_write_leaves_old_file(tmp_path):
    pytest.importorskip("numpy")
    d = tmp_path / "d"
    d.mkdir()
    p = d / "ckpt.bin"
    write_file(p, b"old" * 1000)
    w = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(p)],
                         stdout=subprocess.PIPE, text=True)
    try:
        assert w.stdout.readline().strip() == "ready"
        time.sleep(0.3)
    finally:
        w.send_signal(signal.SIGKILL)
        w.wait(timeout=30)
    assert os.listdir(d) == ["ckpt.bin"]      # O_TMPFILE: nothing stray
    assert read_file(p) == b"old" * 1000


# ---------------------------------------------------------------- full disks

@pytest.fixture
def small_fs(tmp_path):
    if not ROOT or not shutil.which("mount"):
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip("cannot mount tmpfs: " + r.stderr.strip())
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def _free(d):
    s = os.statvfs(d)
    return s.f_bavail * s.f_frsize


def test_enospc_growing_write_rolls_back(small_fs):
    p = os.path.join(small_fs, "f.bin")
    write_file(p, b"a" * 4096)
    free = _free(small_fs)
    big = bytearray(16 << 20)
    with nvio.AioHandle() as h:
        for call in (lambda: h.sync_pwrite(big, p, 4096),
                     lambda: h.open(p, nvio.FILE_WRITE).pwrite(big, 4096)):
            with pytest.raises(nvio.NvioError) as ei:
                call()
            assert ei.value.errno == errno.ENOSPC and p in str(ei.value)
            assert os.path.getsize(p) == 4096 and read_file(p) == b"a" * 4096
            assert _free(small_fs) >= free - 4096
        new = os.path.join(small_fs, "new.bin")
        with pytest.raises(nvio.NvioError):
            h.sync_pwrite(big, new)
        assert not os.path.exists(new)                     # a new file is removed
        for call in (lambda: h.write(big, p),
                     lambda: nvio.open(p, "wb", handle=h).__exit__(None, None, None)
                     if False else _open_write(h, p, big)):
            with pytest.raises(nvio.NvioError):
                call()
            assert read_file(p) == b"a" * 4096
        assert sorted(os.listdir(small_fs)) == ["f.bin"]
        assert _free(small_fs) >= free - 4096


def _open_write(h, p, big):
    with nvio.open(p, "wb", handle=h) as f:
        f.write(big)


EFBIG_CHILD = textwrap.dedent(r"""
    import errno, os, resource, signal, sys, nvio
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    p = sys.argv[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    h = nvio.AioHandle()
    try:
        h.sync_pwrite(bytearray(4 << 20), p, 4096)
        sys.exit(3)
    except nvio.NvioError as e:
        assert e.errno == errno.EFBIG, e
    assert os.path.getsize(p) == 4096, os.path.getsize(p)
    sys.exit(0)
""")


def test_efbig_rlimit_fsize(tmp_path):
    p = str(tmp_path / "f")
    write_file(p, b"b" * 4096)
    r = subprocess.run([sys.executable, "-c", EFBIG_CHILD, p], timeout=60,
                       capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout, r.stderr)
    assert read_file(p) == b"b" * 4096


# --------------------------------------------------------- property based

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

_values = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70),
                    st.floats(allow_nan=True), st.text(max_size=4),
                    st.binary(max_size=8), st.just([]), st.just(object()))


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(method=st.sampled_from(["pread", "pwrite", "sync_pread", "sync_pwrite",
                                          "async_pread", "async_pwrite", "read", "write",
                                          "fpread", "fpwrite"]),
                  size=st.integers(0, 5000), offset=st.one_of(st.integers(-10, 9000), _values),
                  flag=_values, kind=st.sampled_from(["bytearray", "bytes", "memoryview", "junk"]))
def test_random_arguments_never_crash(tmp_path_factory, method, size, offset, flag, kind):
    d = tmp_path_factory.mktemp("h")
    p = str(d / "f")
    data = pattern(4096, 1)
    write_file(p, data)
    buf = {"bytearray": bytearray(size), "bytes": bytes(size),
           "memoryview": memoryview(bytearray(size)), "junk": object()}[kind]
    with nvio.AioHandle() as h:
        try:
            if method in ("fpread", "fpwrite"):
                with h.open(p, nvio.FILE_READ | nvio.FILE_WRITE) as f:
                    r = getattr(f, method[1:])(buf, offset)
            elif method in ("read", "write"):
                r = getattr(h, method)(buf, p, flag, offset)
            elif method.startswith(("sync", "async")):
                r = getattr(h, method)(buf, p, offset, validate=flag)
            else:
                r = getattr(h, method)(buf, p, False, flag, offset)
                h.wait()
        except (TypeError, ValueError, OverflowError, nvio.NvioError) as e:
            assert str(e)
            return
    # it worked: the bytes are right
    if method in ("pread", "sync_pread", "fpread", "async_pread") or (method == "read"):
        assert bytes(buf) == data[offset:offset + size]
    else:
        with open(p, "rb") as f:    # the range only: offsets reach GiBs (sparse)
            assert os.pread(f.fileno(), size, offset) == bytes(buf)
