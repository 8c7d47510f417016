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
#
# Small file systems made by the test: tmpfs with size=, and ext4 and xfs on
# a loop device over an image file in the test's directory (xfs needs 300
# MiB, sparse). A ballast file fills each but FREE bytes, so that a write of
# BIG bytes cannot fit. Unmounted in every case; skipped (with the reason)
# when not root or when mkfs/mount/loop devices are missing.

FREE = 6 << 20
BIG = 16 << 20
FS_KINDS = ("tmpfs", "ext4", "xfs")
IMAGE = {"ext4": 48 << 20, "xfs": 300 << 20}


def _run(cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=120)


def _umount(mnt):
    for _ in range(20):
        if _run(["umount", mnt]).returncode == 0:
            return
        time.sleep(0.1)
    _run(["umount", "-l", mnt])


@pytest.fixture(params=FS_KINDS)
def small_fs(request, tmp_path):
    kind = request.param
    if not ROOT or not shutil.which("mount"):
        pytest.skip("mounting a small %s needs root and mount(8)" % kind)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    if kind == "tmpfs":
        cmd = ["mount", "-t", "tmpfs", "-o", "size=%d" % (FREE + (4 << 20)), "tmpfs", mnt]
    else:
        mkfs = shutil.which("mkfs." + kind)
        if not mkfs:
            pytest.skip("mkfs.%s is not installed (scripts/deps.sh installs it)" % kind)
        img = tmp_path / (kind + ".img")
        with open(img, "wb") as f:
            f.truncate(IMAGE[kind])
        r = _run([mkfs, "-q"] + (["-F"] if kind == "ext4" else []) + [img])
        if r.returncode:
            pytest.skip("mkfs.%s failed: %s" % (kind, r.stderr.strip()))
        cmd = ["mount", "-o", "loop", img, mnt]
    r = _run(cmd)
    if r.returncode:
        pytest.skip("cannot mount %s (loop devices?): %s" % (kind, r.stderr.strip()))
    try:
        ballast = mnt / ".ballast"
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.posix_fallocate(fd, 0, max(_free(mnt) - FREE, 4096))
        finally:
            os.close(fd)
        os.sync()
        yield kind, str(mnt)
    finally:
        _umount(str(mnt))


def _free(d):
    s = os.statvfs(d)
    return s.f_bavail * s.f_frsize


def _space_back(d, free, tolerance=64 << 10):
    """Whether d's free space is back to free (less metadata): ext4 and xfs
    count blocks freed by a closed, unlinked file once their journal
    commits, so a sync and a short wait are allowed."""
    deadline = time.monotonic() + 5
    while _free(d) < free - tolerance:
        if time.monotonic() > deadline:
            return False
        os.sync()
        time.sleep(0.05)
    return True


def _entries(d):
    return sorted(n for n in os.listdir(d) if n not in (".ballast", "lost+found"))


ENGINES = ("io_uring", "libaio", "psync")


def _full_disk_calls(h, p, big):
    """Every way a write reaches a full disk: (name, call, grows p)."""
    def file_pwrite():
        with h.open(p, nvio.FILE_WRITE) as f:
            f.pwrite(big, 4096)

    def async_pwrite():
        h.async_pwrite(big, p, 4096)
        h.wait()

    def stream_write():
        with h.open(p, nvio.FILE_ATOMIC) as f:
            with f.stream("w") as s:
                for i in range(0, len(big), 1 << 20):
                    s.write(big[i:i + (1 << 20)])

    yield "sync_pwrite", lambda: h.sync_pwrite(big, p, 4096)
    yield "pwrite", lambda: h.pwrite(big, p, False, False, 4096)
    yield "File.pwrite", file_pwrite
    yield "async_pwrite+wait", async_pwrite
    yield "write", lambda: h.write(big, p)
    yield "stream", stream_write
    yield "nvio.open", lambda: _open_write(h, p, big)


def test_enospc_leaves_files_and_space_as_they_were(small_fs):
    kind, d = small_fs
    p = os.path.join(d, "f.bin")
    old = pattern(4096, 3)
    write_file(p, old)
    os.sync()
    free = _free(d)
    big = bytearray(pattern(BIG, 4))
    for engine in ENGINES:
        ok, why = nvio.engine_available(engine)
        if not ok:
            continue
        for direct in (True, False):
            with nvio.AioHandle(engine=engine, direct=direct if kind != "tmpfs" else False) as h:
                for name, call in _full_disk_calls(h, p, big):
                    what = "%s %s direct=%s %s" % (kind, engine, direct, name)
                    with pytest.raises(nvio.NvioError) as ei:
                        call()
                    e = ei.value
                    assert e.errno == errno.ENOSPC, (what, e)
                    assert p in str(e) or getattr(e, "filename", None) == p, (what, e)
                    assert read_file(p) == old, what          # size and bytes
                    assert _entries(d) == ["f.bin"], (what, _entries(d))
                    assert _space_back(d, free), (what, free, _free(d))
                # a one-buffer write that created its file removes it
                new = os.path.join(d, "new.bin")
                for name, call in (("sync_pwrite", lambda: h.sync_pwrite(big, new)),
                                   ("write", lambda: h.write(big, new))):
                    with pytest.raises(nvio.NvioError) as ei:
                        call()
                    assert ei.value.errno == errno.ENOSPC and new in str(ei.value), name
                    assert not os.path.exists(new), (kind, engine, name)
        # what fits still works, to the byte, after all that
        with nvio.AioHandle(engine=engine) as h:
            h.sync_pwrite(big[:1 << 20], p, 4096)
        assert read_file(p) == old + bytes(big[:1 << 20]), (kind, engine)
        write_file(p, old)
    assert _space_back(d, free)


def test_enospc_checkpoint_keeps_the_old_one(small_fs):
    torch = pytest.importorskip("torch")
    kind, d = small_fs
    p = os.path.join(d, "ck.pt")
    nvio.save({"w": torch.arange(100)}, p)
    before = read_file(p)
    os.sync()
    free = _free(d)
    big = {"w": torch.ones(BIG // 4)}
    for name, call in (("save", lambda: nvio.save(big, p)),
                       ("async_save", lambda: nvio.async_save(big, p).result())):
        with pytest.raises(OSError) as ei:
            call()
        assert ei.value.errno == errno.ENOSPC, (kind, name, ei.value)
        assert p in str(ei.value) or getattr(ei.value, "filename", None) == p, (name, ei.value)
        assert read_file(p) == before, (kind, name)
        assert _entries(d) == ["ck.pt"], (kind, name, _entries(d))
        assert _space_back(d, free), (kind, name, free, _free(d))
    assert torch.equal(nvio.load(p)["w"], torch.arange(100))


def _open_write(h, p, big):
    with nvio.open(p, "wb", handle=h) as f:
        f.write(big)


EFBIG_CHILD = textwrap.dedent(r"""
    import errno, os, resource, signal, sys, nvio
    sys.path.insert(0, sys.argv[2])
    import test_not_ours as t
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    p = sys.argv[1]
    d = os.path.dirname(p)
    old = open(p, "rb").read()
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    big = bytearray(t.pattern(4 << 20, 5))
    for engine in ("io_uring", "libaio", "psync"):
        if not nvio.engine_available(engine)[0]:
            continue
        with nvio.AioHandle(engine=engine) as h:
            for name, call in t._full_disk_calls(h, p, big):
                try:
                    call()
                    sys.exit("%s %s: no error" % (engine, name))
                except nvio.NvioError as e:
                    assert e.errno == errno.EFBIG, (engine, name, e)
                    assert p in str(e), (engine, name, e)
                assert open(p, "rb").read() == old, (engine, name, os.path.getsize(p))
                assert sorted(os.listdir(d)) == ["f"], (engine, name, os.listdir(d))
            new = os.path.join(d, "new")
            try:
                h.sync_pwrite(big, new)
                sys.exit("new: no error")
            except nvio.NvioError as e:
                assert e.errno == errno.EFBIG and new in str(e), e
            assert not os.path.exists(new), engine
    try:
        import torch
    except ImportError:
        sys.exit(0)
    ck = os.path.join(d, "ck.pt")
    nvio.save({"a": torch.arange(10)}, ck)
    before = open(ck, "rb").read()
    for call in (lambda: nvio.save({"w": torch.ones(1 << 20)}, ck),
                 lambda: nvio.async_save({"w": torch.ones(1 << 20)}, ck).result()):
        try:
            call()
            sys.exit("save: no error")
        except OSError as e:
            assert e.errno == errno.EFBIG and ck in str(e), e
        assert open(ck, "rb").read() == before
        assert sorted(os.listdir(d)) == ["ck.pt", "f"], os.listdir(d)
    sys.exit(0)
""")


def test_efbig_rlimit_fsize(tmp_path):
    """Writes past RLIMIT_FSIZE (SIGXFSZ ignored) fail with EFBIG naming the
    file, on every engine and through every call; the file keeps its size
    and bytes, a file the call created is removed, nothing is left."""
    d = tmp_path / "d"
    d.mkdir()
    p = str(d / "f")
    write_file(p, pattern(4096, 6))
    r = subprocess.run([sys.executable, "-c", EFBIG_CHILD, p, os.path.dirname(__file__)],
                       timeout=120, capture_output=True, text=True)
    assert r.returncode == 0, (r.stdout, r.stderr[-3000:])
    assert read_file(p) == pattern(4096, 6)


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
