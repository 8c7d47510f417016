"""nvio._atomic: the replaced file's blocks freed off the caller's path;
saves through symbolic links."""
import os
import threading

import pytest

from nvio import _atomic

BIG = _atomic.RECLAIM_LATER_MIN


def _held(path):
    """fds of this process that lead to the (deleted) file once at path."""
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if link == path + " (deleted)":
            out.append(int(fd))
    return out


@pytest.fixture
def slow_close(monkeypatch):
    """Releases wait for `go` before closing; `entered` says one started."""
    go, entered = threading.Event(), threading.Event()
    real = _atomic._close

    def close(fd):
        entered.set()
        go.wait(30)
        real(fd)
    monkeypatch.setattr(_atomic, "_close", close)
    yield go, entered
    go.set()
    _atomic.settle_released()


def _big_file(path, head):
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(BIG)


def _held_then_freed(p, head, go, entered):
    """The file once at p (starting with head) is held by a release that
    waits for go; once let go, nothing holds it."""
    assert entered.wait(10)
    held = _held(p)
    assert len(held) == 1                   # the old inode, kept alive off the path
    with open("/proc/self/fd/%d" % held[0], "rb") as f:
        assert f.read(len(head)) == head
    go.set()
    _atomic.settle_released()
    assert _held(p) == []


def test_remove_unlinks_at_once_and_frees_later(tmp_path, slow_close):
    go, entered = slow_close
    p = str(tmp_path / "__0_0.distcp")
    _big_file(p, b"data")
    _atomic.remove(p)
    assert not os.path.lexists(p)
    assert entered.wait(10)
    assert len(_held(p)) == 1
    go.set()
    _atomic.settle_released()
    assert _held(p) == []
    with pytest.raises(FileNotFoundError):
        _atomic.remove(p)


def test_a_child_forked_meanwhile_does_not_keep_the_old_file(tmp_path, slow_close):
    go, entered = slow_close
    p = str(tmp_path / "ck.pt")
    _big_file(p, b"old")
    _atomic.remove(p)
    assert entered.wait(10) and len(_held(p)) == 1
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:                            # the child: the held fd is closed
        os.close(r)
        os.write(w, b"%d" % len(_held(p)))
        os._exit(0)
    os.close(w)
    got = os.read(r, 16)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"0"
    assert len(_held(p)) == 1               # the parent's is still closed by its thread
    go.set()
    _atomic.settle_released()
    assert _held(p) == []


def test_small_and_odd_files_are_not_held(tmp_path):
    small = str(tmp_path / "small")
    with open(small, "wb") as f:
        f.write(b"x" * 4096)
    assert _atomic.hold_replaced(small) is None
    assert _atomic.hold_replaced(str(tmp_path / "missing")) is None
    os.symlink(small, str(tmp_path / "link"))
    assert _atomic.hold_replaced(str(tmp_path / "link")) is None
    assert _atomic.hold_replaced(str(tmp_path)) is None     # a directory
    _atomic.release_replaced(None)                          # nothing to do


def test_save_through_symlinks_keeps_the_links(tmp_path):
    """nvio.save writes where a chain of links leads (a relative link in
    another directory, a link to it) and where a dangling link would
    create, as open(2) does; the links stay links and no temporary is
    left beside anything. A link that loops fails with ELOOP."""
    import errno

    import torch

    import nvio
    real = tmp_path / "real"
    real.mkdir()
    (real / "ck.pt").write_bytes(b"old")
    os.symlink("real/ck.pt", tmp_path / "mid")            # relative to its directory
    os.symlink(str(tmp_path / "mid"), tmp_path / "latest")
    os.symlink("nowhere.pt", real / "dangling")
    for i, (link, target) in enumerate(((tmp_path / "latest", real / "ck.pt"),
                                        (real / "dangling", real / "nowhere.pt"))):
        st = {"w": torch.arange(100 + i, dtype=torch.float32)}
        nvio.save(st, link)
        assert os.path.islink(link)
        assert torch.equal(nvio.load(target)["w"], st["w"])
    assert os.path.islink(tmp_path / "mid")
    assert sorted(os.listdir(real)) == ["ck.pt", "dangling", "nowhere.pt"]
    assert sorted(os.listdir(tmp_path)) == ["latest", "mid", "real"]
    os.symlink("loop", tmp_path / "loop")
    with pytest.raises(OSError) as ei:
        nvio.save({"w": torch.zeros(3)}, tmp_path / "loop")
    assert ei.value.errno == errno.ELOOP
    assert sorted(os.listdir(tmp_path)) == ["latest", "loop", "mid", "real"]


@pytest.mark.parametrize("writer", ["save", "async_save", "safetensors", "FastFileWriter",
                                    "PyFileWriter"])
def test_every_whole_file_writer_frees_the_replaced_file_off_its_path(
        tmp_path, slow_close, handle, writer):
    """nvio.save, AsyncCheckpointer.save and nvio.safetensors.save_file
    (through _base.space.open_atomic) and DeepSpeed's writers of
    nvio.compat (around their commit at close) replace a large file so
    that the call returns, the new file in place, while the old inode is
    still held, and a thread frees its blocks afterwards."""
    torch = pytest.importorskip("torch")
    import nvio
    import nvio.safetensors
    go, entered = slow_close
    p = str(tmp_path / "ck.bin")
    _big_file(p, b"old version")
    sd = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.ones(7, dtype=torch.int64)}
    if writer == "save":
        nvio.save(sd, p, handle=handle)
    elif writer == "async_save":
        ck = nvio.AsyncCheckpointer(handle=handle)
        try:
            ck.save(sd, p).result()
        finally:
            ck.close()
    elif writer == "safetensors":
        nvio.safetensors.save_file(sd, p, handle=handle)
    else:
        from nvio import compat
        w = (compat.FastFileWriter(p, compat.FastFileWriterConfig(dnvme_handle=handle))
             if writer == "FastFileWriter" else compat.PyFileWriter(p))
        torch.save(sd, w)
        w.close()
    _held_then_freed(p, b"old version", go, entered)
    got = nvio.safetensors.load_file(p) if writer == "safetensors" else nvio.load(p)
    assert set(got) == set(sd) and all(torch.equal(got[k], sd[k]) for k in sd)
