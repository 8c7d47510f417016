"""Files several processes write (_nvio.file_share/file_join over libnvio's
NVIO_FILE_SHARED) and writer streams over the caller's staging memory
(_nvio.StagedStream over nvio_stream_open_config).

Every I/O test runs on every engine with direct I/O on and off; bytes are
checked with Python's own file I/O.
"""
import errno
import os
import subprocess
import sys

import pytest

import nvio
from nvio import _nvio
from nvio_testutil import pattern, read_file, write_file

N = (3 << 20) + 4097


def _share_of(i, n):
    return N * i // n, N * (i + 1) // n - N * i // n


CHILD = r"""
import sys, nvio
from nvio import _nvio
tmp, dev, ino, i, n, engine, direct, seed = sys.argv[1:]
sys.path.insert(0, %r)
from nvio_testutil import pattern
N = %d
a, b = N * int(i) // int(n), N * (int(i) + 1) // int(n)
data = pattern(N, int(seed))
h = nvio.AioHandle(engine=engine, direct=direct == "True")
with _nvio.file_join(h, tmp, int(dev), int(ino)) as f:
    f.pwrite(data[a:b], a)
h.close()
""" % (os.path.dirname(os.path.abspath(__file__)), N)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "abandon"])
def test_shares_from_processes(handle, engine, direct, tmp_path, commit):
    p = tmp_path / "target"
    old, new = pattern(N, 1), pattern(N, 2)
    write_file(p, old)
    f = handle.open(p, nvio.FILE_ATOMIC | _nvio.FILE_SHARED)
    try:
        tmp, dev, ino = _nvio.file_share(f)
        assert os.path.dirname(tmp) == str(tmp_path)
        f.allocate(0, N)
        kids = [subprocess.run([sys.executable, "-c", CHILD, tmp, str(dev), str(ino), str(i),
                                "3", engine, str(direct), "2"], capture_output=True, text=True,
                               timeout=120) for i in (1, 2)]
        for k in kids:
            assert k.returncode == 0, k.stderr
        a, n = _share_of(0, 3)
        f.pwrite(new[a:a + n], a)
        assert read_file(p) == old             # nothing visible before the commit
        if commit:
            f.commit()
    finally:
        f.close()                              # uncommitted: abandoned
    assert read_file(p) == (new if commit else old)
    assert sorted(os.listdir(tmp_path)) == ["target"]     # no temporary left


def test_join_refuses(tmp_path):
    h = nvio.AioHandle(engine="psync")
    try:
        victim = tmp_path / "victim"
        write_file(victim, b"x" * 100)
        name = tmp_path / ".t.nvio-0000000100000001-1-1-00000001"
        os.symlink(victim, name)
        st = os.stat(victim)
        with pytest.raises(OSError) as e:
            _nvio.file_join(h, name, st.st_dev, st.st_ino)
        assert e.value.errno == errno.ELOOP
        os.unlink(name)
        write_file(name, b"y" * 10)
        st = os.stat(name)
        with pytest.raises(OSError) as e:
            _nvio.file_join(h, name, st.st_dev, st.st_ino + 1)   # not the creator's
        assert e.value.errno == errno.ESTALE
        with pytest.raises(OSError) as e:
            _nvio.file_join(h, victim, os.stat(victim).st_dev, os.stat(victim).st_ino)
        assert e.value.errno == errno.EINVAL                     # not a temporary's name
        assert read_file(victim) == b"x" * 100
        with h.open(tmp_path / "plain", nvio.FILE_ATOMIC) as f:
            with pytest.raises(ValueError):
                _nvio.file_share(f)                              # not SHARED
    finally:
        h.close()


def _refused(call, err, path, reason):
    """call() raises the NvioError of errno err naming path and libnvio's
    reason (not a ValueError about the flags)."""
    with pytest.raises(nvio.NvioError) as e:
        call()
    assert e.value.errno == err, e.value
    assert os.fspath(e.value.filename) == os.fspath(path)
    assert reason in str(e.value) and str(path) in str(e.value)


def test_open_and_join_refusals_name_path_and_reason(handle, tmp_path):
    """Every refusal of a SHARED open (Handle.open with FILE_WRITE |
    FILE_SHARED, what _atomic.join_shared uses) and of _nvio.file_join is an
    NvioError with the path, the errno and libnvio's reason: a FIFO and a
    name not of an nvio temporary are EINVAL (no longer a ValueError about
    "invalid file flags"), a link ELOOP, a file of other names EPERM, a
    file not the creator's ESTALE. Flags that break the rules stay a
    ValueError. Nothing refused is written."""
    w = nvio.FILE_WRITE | _nvio.FILE_SHARED
    victim = tmp_path / "victim"
    write_file(victim, b"x" * 100)
    vst = os.stat(victim)
    name = tmp_path / ".t.nvio-0000000100000001-1-1-00000001"

    def both(err, reason, dev=vst.st_dev, ino=vst.st_ino):
        _refused(lambda: handle.open(name, w), err, name, reason)
        _refused(lambda: _nvio.file_join(handle, name, dev, ino), err, name, reason)

    os.mkfifo(name)                                    # opens without blocking
    both(errno.EINVAL, "not a regular file")
    os.unlink(name)
    os.symlink(victim, name)
    both(errno.ELOOP, "symbolic link")
    os.unlink(name)
    os.link(victim, name)                              # a file of two names
    both(errno.EPERM, "other names")
    os.unlink(name)
    _refused(lambda: handle.open(victim, w), errno.EINVAL, victim, "not the name of an nvio")
    _refused(lambda: _nvio.file_join(handle, victim, vst.st_dev, vst.st_ino), errno.EINVAL,
             victim, "not the name of an nvio")
    write_file(name, b"y" * 10)
    st = os.stat(name)
    _refused(lambda: _nvio.file_join(handle, name, st.st_dev, st.st_ino + 1), errno.ESTALE,
             name, "not the creator's")
    for flags in (nvio.FILE_READ | _nvio.FILE_SHARED,              # no WRITE
                  w | nvio.FILE_CREATE, w | nvio.FILE_TRUNC):      # a join creates nothing
        with pytest.raises(ValueError, match="invalid file flags"):
            handle.open(name, flags)
    for flags in (nvio.FILE_READ, nvio.FILE_WRITE | nvio.FILE_ATOMIC):
        with pytest.raises(ValueError, match="invalid file flags"):
            _nvio.file_join(handle, name, st.st_dev, st.st_ino, flags)
    assert read_file(victim) == b"x" * 100
    assert read_file(name) == b"y" * 10
    with _nvio.file_join(handle, name, st.st_dev, st.st_ino) as f:     # the real one opens
        f.pwrite(b"z" * 4, 2)
    assert read_file(name) == b"yyzzzzyyyy"


@pytest.mark.parametrize("depth", [1, 2])
def test_staged_stream(handle, tmp_path, depth):
    p = tmp_path / "out"
    data = pattern(N, 3)
    mem = _nvio.LockedBuffer(256 << 10)
    with handle.open(p, nvio.FILE_ATOMIC) as f:
        s = _nvio.StagedStream(f, mem, depth=depth)
        assert s.write(data[:1000]) == 1000
        assert bytes(memoryview(mem)[:1000]) == data[:1000]    # staged in the caller's memory
        at = 1000
        for i, k in enumerate([1, 4095, 70000, 300000, 1 << 20] * 10):
            if at >= N:
                break
            k = min(k, N - at)
            assert s.write(data[at:at + k]) == k
            at += k
        if at < N:
            s.write(data[at:])
        assert s.tell() == N
        s.close(commit=True)
        assert s.closed
    assert read_file(p) == data


def test_staged_stream_ranges(handle, tmp_path):
    p = tmp_path / "striped"
    data = pattern(N, 4)
    stripe = 192 << 10
    mems = [_nvio.LockedBuffer(256 << 10) for _ in range(2)]
    with handle.open(p, nvio.FILE_WRITE | nvio.FILE_CREATE) as f:
        ss = [_nvio.StagedStream(f, m, ranges=True) for m in mems]
        for k, at in enumerate(range(0, N, stripe)):
            s = ss[k % 2]
            s.seek(at)
            s.write(data[at:at + stripe])
        ss[0].close()
        ss[1].close(fsync=True)
    assert read_file(p) == data


def test_staged_stream_arguments(tmp_path):
    h = nvio.AioHandle(engine="psync")
    try:
        with h.open(tmp_path / "a", nvio.FILE_WRITE | nvio.FILE_CREATE) as f:
            with pytest.raises(ValueError):
                _nvio.StagedStream(f, _nvio.LockedBuffer(4096), depth=2)   # halves < a page
            with pytest.raises(ValueError):
                _nvio.StagedStream(f, _nvio.LockedBuffer(1 << 16), depth=3)
            s = _nvio.StagedStream(f, _nvio.LockedBuffer(1 << 16))
            with pytest.raises(ValueError):
                s.seek(4096)                     # not a writer of ranges
            s.close()
            with pytest.raises(ValueError):
                s.write(b"x")
    finally:
        h.close()


def test_staged_stream_in_device_memory(handle, tmp_path):
    """CUDA staging (DeepSpeed's pinned_tensor on the GPU): the stream copies
    into device memory through the driver (the simulated one: a host access
    to device memory is counted as a violation) and writes from it."""
    import gpusim
    sim = gpusim.load()
    p = tmp_path / "dev"
    data = pattern(N, 5)
    mem = gpusim.DeviceBuffer(sim, 256 << 10)
    before = sim.violations()
    with handle.open(p, nvio.FILE_ATOMIC) as f:
        s = _nvio.StagedStream(f, mem)
        assert s.write(data[:1000]) == 1000
        assert mem.bytes()[:1000] == data[:1000]           # staged on the device
        for at in range(1000, N, 70001):
            s.write(data[at:at + 70001])
        s.close(commit=True)
    assert read_file(p) == data
    assert sim.violations() == before


def test_join_shared_checks_the_identity(tmp_path):
    """_atomic.join_shared: libnvio's open (FILE_SHARED: no link followed),
    then the creator's identity compared; a stale share is ESTALE."""
    from nvio._atomic import join_shared
    h = nvio.AioHandle(engine="psync")
    try:
        f = h.open(tmp_path / "t", nvio.FILE_ATOMIC | _nvio.FILE_SHARED)
        tmp, dev, ino = _nvio.file_share(f)
        with join_shared(h, (tmp, dev, ino)) as w:
            w.pwrite(b"abc", 0)
        with pytest.raises(OSError) as e:
            join_shared(h, (tmp, dev, ino + 1))
        assert e.value.errno == errno.ESTALE
        f.truncate(3)
        f.commit()
        f.close()
        assert read_file(tmp_path / "t") == b"abc"
        os.symlink(tmp_path / "t", tmp)                  # a link at a temporary's name
        with pytest.raises(OSError) as e:
            join_shared(h, (tmp, dev, ino))
        assert e.value.errno == errno.ELOOP
        assert read_file(tmp_path / "t") == b"abc"
    finally:
        h.close()
