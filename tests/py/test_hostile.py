"""libnvio's file layer against hostile neighbours (issue 35, items 2-5).

- A symbolic link another user planted in a sticky world-writable
  directory (fs.protected_symlinks on) is not followed by a save: nvio.save
  (plain and spare) and safetensors save_file fail with EACCES, the file
  it points to keeps its bytes, nothing appears beside it. The caller's
  own link there still works.
- Threads spare-saving one path while others read it: every read is one
  whole saved version (nvio.save/nvio.load and safetensors
  save_file/load_file).
- ENOSPC during a spare save on a small loop-mounted ext4: the spare goes
  back to its size, the space comes back, the error names the real size.
- A FIFO at a load path: nvio.load, safetensors load_file and safe_open,
  handle.open refuse it at once, naming the path and "FIFO" (a watchdog
  opens the FIFO's other end if they block, so nothing hangs).

Every I/O test runs on every engine, direct I/O on and off.
"""
import errno
import os
import shutil
import stat
import subprocess
import threading
import time

import pytest

import nvio
from nvio import _nvio
from nvio_testutil import same

torch = pytest.importorskip("torch")
nst = pytest.importorskip("nvio.safetensors")

SYSCTL = "/proc/sys/fs/protected_symlinks"
NOBODY = 65534


def spare_of(p):
    return os.path.join(os.path.dirname(p), "." + os.path.basename(p) + ".nvio-spare")


# --- symbolic links -----------------------------------------------------------


@pytest.fixture
def protected_symlinks():
    """fs.protected_symlinks on for the test (restored after); root only."""
    if os.geteuid() != 0:
        pytest.skip("a link owned by another user needs root")
    try:
        with open(SYSCTL) as f:
            old = f.read().strip()
    except OSError:
        pytest.skip("no " + SYSCTL)
    if old != "1":
        try:
            with open(SYSCTL, "w") as f:
                f.write("1\n")
        except OSError:
            pytest.skip("protected_symlinks is off and cannot be set")
    yield
    if old != "1":
        with open(SYSCTL, "w") as f:
            f.write(old + "\n")


def _saves(handle, link):
    st = {"w": torch.arange(1000, dtype=torch.float32)}
    yield "save", lambda: nvio.save(st, link, handle=handle)
    yield "save spare", lambda: nvio.save(st, link, handle=handle, spare=True)
    yield "save_file spare", lambda: nst.save_file(st, link, handle=handle, spare=True)


def test_planted_link_refused(handle, tmp_path, protected_symlinks):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    victim = tmp_path / "victim"
    link = str(sticky / "ck.pt")
    old = os.urandom(5000)
    for target_there in (True, False):
        for name, call in _saves(handle, link):
            if target_there:
                victim.write_bytes(old)
            ino = os.stat(victim).st_ino if target_there else None
            if os.path.lexists(link):
                os.unlink(link)
            os.symlink(str(victim), link)
            os.lchown(link, NOBODY, -1)
            with pytest.raises(OSError) as ei:
                call()
            assert ei.value.errno == errno.EACCES, name
            assert link in str(ei.value) or ei.value.filename == link, name
            if target_there:
                assert victim.read_bytes() == old, name
                assert os.stat(victim).st_ino == ino, name
                assert sorted(os.listdir(tmp_path)) == ["sticky", "victim"], name
            else:
                assert sorted(os.listdir(tmp_path)) == ["sticky"], name
            assert os.listdir(sticky) == ["ck.pt"], name
            assert os.path.islink(link)
        if target_there:
            victim.unlink()


def test_own_link_followed(handle, tmp_path, protected_symlinks):
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    victim = str(tmp_path / "victim")
    link = str(sticky / "ck.pt")
    os.symlink(victim, link)
    for i in range(3):
        st = {"w": torch.full((3000 + i,), float(i))}
        nvio.save(st, link, handle=handle, spare=True)
        same(nvio.load(victim, handle=handle), st)
    assert os.path.islink(link)
    assert os.path.exists(spare_of(victim))
    assert os.listdir(sticky) == ["ck.pt"]
    f = handle.open(link, nvio.FILE_ATOMIC | _nvio.FILE_SHARED)   # a named temporary
    try:
        assert os.path.dirname(_nvio.file_share(f)[0]) == str(tmp_path)
    finally:
        f.close()               # abandoned: removed
    assert sorted(os.listdir(tmp_path)) == sorted(["sticky", "victim",
                                                   os.path.basename(spare_of(victim))])


# --- spare saves and readers ------------------------------------------------------


def version(i):
    """Version i: sizes differ, every value says i."""
    n = 20000 + 7919 * i
    return {"v": torch.tensor([i], dtype=torch.int64),
            "w": torch.arange(n, dtype=torch.float32) * i,
            "b": torch.full((n // 3,), i, dtype=torch.int16)}


VERSIONS = [version(i) for i in range(1, 7)]


def _race(save, load, rounds=25, writers=2, readers=3):
    """Threads saving versions and reading them; the reads that were not
    one whole version, and the errors."""
    bad, errors = [], []
    go = threading.Barrier(writers + readers)

    def writer(k):
        go.wait()
        try:
            for r in range(rounds):
                save(VERSIONS[(k * 7 + r) % len(VERSIONS)])
        except Exception as e:          # noqa: BLE001 - reported below
            errors.append(repr(e))

    def reader():
        go.wait()
        for _ in range(rounds):
            try:
                got = load()
            except Exception as e:      # noqa: BLE001 - reported below
                errors.append(repr(e))
                continue
            i = int(got["v"][0])
            want = VERSIONS[i - 1] if 1 <= i <= len(VERSIONS) else None
            if want is None or set(got) != set(want) or \
                    any(not torch.equal(got[k], want[k]) for k in want):
                bad.append(i)

    ts = [threading.Thread(target=writer, args=(k,)) for k in range(writers)]
    ts += [threading.Thread(target=reader) for _ in range(readers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in ts), "a thread hung"
    return bad, errors


def test_spare_saves_and_loads(handle, tmp_path):
    p = str(tmp_path / "ck.pt")
    nvio.save(VERSIONS[0], p, handle=handle, spare=True)
    bad, errors = _race(lambda st: nvio.save(st, p, handle=handle, spare=True, durable=False),
                        lambda: nvio.load(p, handle=handle))
    assert errors == [] and bad == []


def test_spare_save_file_and_load_file(handle, tmp_path):
    p = str(tmp_path / "m.safetensors")
    nst.save_file(VERSIONS[0], p, handle=handle, spare=True)
    bad, errors = _race(lambda st: nst.save_file(st, p, handle=handle, spare=True,
                                                 durable=False),
                        lambda: nst.load_file(p, handle=handle))
    assert errors == [] and bad == []


# --- ENOSPC -----------------------------------------------------------------------


@pytest.fixture
def small_ext4(tmp_path):
    """A 64 MiB ext4 file system on a loop device (root only)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("mount"):
        pytest.skip("a loop-mounted ext4 needs root, mkfs.ext4 and mount")
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    r = subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], capture_output=True)
    if r.returncode == 0:
        r = subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], capture_output=True)
    if r.returncode:
        pytest.skip("cannot mount a loop ext4: %s" % r.stderr.decode().strip())
    yield mnt
    subprocess.run(["umount", str(mnt)])


def _free(d):
    st = os.statvfs(d)
    return st.f_bfree * st.f_frsize     # root writes into the reserved blocks too


def test_spare_enospc_rolls_back(handle, small_ext4):
    d = str(small_ext4)
    p = os.path.join(d, "ck.pt")
    small = {"w": torch.ones(2 << 20)}                  # 8 MiB
    nvio.save(small, p, handle=handle, spare=True)
    nvio.save(small, p, handle=handle, spare=True)      # a spare of 8 MiB now
    spare_size = os.stat(spare_of(p)).st_size
    with open(os.path.join(d, "filler"), "wb") as f:
        f.write(b"\0" * (_free(d) - (3 << 20)))
        os.fsync(f.fileno())
    before = _free(d)
    with pytest.raises(OSError) as ei:
        nvio.save({"w": torch.ones(3 << 20)}, p, handle=handle, spare=True)  # 12 MiB
    e = ei.value
    assert e.errno == errno.ENOSPC
    if getattr(e, "nbytes", None):                      # the real size asked
        assert e.nbytes >= 12 << 20
    assert " 0 bytes" not in str(e), str(e)
    assert os.stat(spare_of(p)).st_size == spare_size
    assert _free(d) >= before - (256 << 10)
    same(nvio.load(p, handle=handle), small)
    assert sorted(os.listdir(d)) == [".ck.pt.nvio-spare", "ck.pt", "filler", "lost+found"]


# --- FIFOs --------------------------------------------------------------------------


def _loads(handle, p):
    yield "nvio.load", lambda: nvio.load(p, handle=handle)
    yield "load_file", lambda: nst.load_file(p, handle=handle)
    yield "safe_open", lambda: nst.safe_open(p, framework="pt").__enter__()
    yield "handle.open", lambda: handle.open(p, _nvio.FILE_READ)
    yield "handle.open rw", lambda: handle.open(p, _nvio.FILE_READ | _nvio.FILE_WRITE)


def test_fifo_refused_without_blocking(handle, tmp_path):
    p = str(tmp_path / "ck.pt")
    os.mkfifo(p)
    for name, call in _loads(handle, p):
        blocked = []
        done = threading.Event()

        def watchdog():
            # unblocks an open that waits for a writer, and says so
            if not done.wait(10):
                blocked.append(name)
                try:
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass

        t = threading.Thread(target=watchdog)
        t.start()
        t0 = time.monotonic()
        try:
            with pytest.raises(Exception) as ei:
                call()
        finally:
            done.set()
            t.join()
        assert blocked == [], "%s blocked on the FIFO" % name
        assert time.monotonic() - t0 < 5, name
        msg = str(ei.value)
        assert p in msg and "FIFO" in msg, (name, msg)
        assert stat.S_ISFIFO(os.lstat(p).st_mode)
    assert os.listdir(tmp_path) == ["ck.pt"]
