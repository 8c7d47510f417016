"""Temporaries left by killed writers: `nvio clean`, nvio._nvio's
clean_temporaries/temp_name, and the data-parallel save's shared temporary,
which must carry its owner like libnvio's own so that the sweep of the next
save (and `nvio clean`) removes it once its owner is dead, and never before."""
import os
import subprocess
from pathlib import Path

import pytest

import nvio
from nvio import _nvio

ROOT = Path(__file__).resolve().parents[2]
NVIO = ROOT / "build" / "nvio"


def _in_child(make):
    """make() in a forked child that then exits; what it returned (a str)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.write(wfd, make().encode())
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return out


def _dead_temp(target):
    """A temporary of target made by a process that has exited."""
    def make():
        t = _nvio.temp_name(str(target))
        fd = os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, b"x" * 100000)
        os.close(fd)
        return t
    return _in_child(make)


def _scene(d, outside):
    """dead: removable; kept: everything else, with its bytes."""
    dead = [_dead_temp(d / "ck.pt"), _dead_temp(d / "other.bin")]
    live = _nvio.temp_name(str(d / "ck.pt"))          # this process: running
    Path(live).write_bytes(b"live")
    victim = outside / "victim"
    victim.write_bytes(b"victim")
    link = Path(_dead_temp(d / "ln"))                   # a dead owner's name ...
    link.unlink()
    link.symlink_to(victim)                             # ... as a symbolic link
    kept = {live: b"live", str(d / ".ck.pt.nvio-0123456789abcdef"): b"0.1",
            str(d / "ck.pt"): b"data", str(d / ".ck.pt.nvio-x"): b"y"}
    for p, b in kept.items():
        if p != live:
            Path(p).write_bytes(b)
    return dead, kept, link, victim


def _check_kept(kept, link, victim):
    for p, b in kept.items():
        assert Path(p).read_bytes() == b, p
    assert link.is_symlink() and victim.read_bytes() == b"victim"


@pytest.mark.skipif(not NVIO.exists(), reason="build/nvio not built (run make)")
def test_nvio_clean(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    dead, kept, link, victim = _scene(d, tmp_path)
    before = sorted(os.listdir(d))
    r = subprocess.run([str(NVIO), "clean", "--dry-run", str(d)], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(d)) == before
    for p in dead:
        assert "would remove %s (owner has exited)" % os.path.basename(p) in r.stdout
    assert "kept         %s (owner is running)" % os.path.basename(kept_live(kept)) in r.stdout
    assert "kept         %s (not a regular file)" % link.name in r.stdout
    assert "2 temporaries would be removed" in r.stdout
    r = subprocess.run([str(NVIO), "clean", str(d)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "2 temporaries removed" in r.stdout
    assert not any(os.path.exists(p) for p in dead)
    _check_kept(kept, link, victim)
    assert len(os.listdir(d)) == len(before) - 2
    # errors: a missing directory names it (1), no directory is a usage error (2)
    r = subprocess.run([str(NVIO), "clean", str(tmp_path / "none")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and str(tmp_path / "none") in r.stderr
    assert "No such file" in r.stderr
    r = subprocess.run([str(NVIO), "clean"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2


def kept_live(kept):
    return [p for p, b in kept.items() if b == b"live"][0]


def test_clean_temporaries_binding(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    dead, kept, link, victim = _scene(d, tmp_path)
    n, seen = _nvio.clean_temporaries(str(d), "ck.pt", dry_run=True)
    assert n == 1 and {s[0] for s in seen} == {os.path.basename(dead[0]),
                                               os.path.basename(kept_live(kept))}
    assert all(os.path.exists(p) for p in dead)
    n, seen = _nvio.clean_temporaries(str(d))
    assert n == 2 and not any(os.path.exists(p) for p in dead)
    _check_kept(kept, link, victim)
    with pytest.raises(ValueError):
        _nvio.clean_temporaries(str(d), "a/b")
    with pytest.raises(TypeError):
        _nvio.clean_temporaries(str(d), dry_run="yes")
    with pytest.raises(OSError) as ei:
        _nvio.clean_temporaries(str(tmp_path / "none"))
    assert str(tmp_path / "none") in str(ei.value)


def test_atomic_write_sweeps_its_target(tmp_path):
    """h.write and nvio.save remove their target's dead temporaries, and
    no other target's."""
    d = tmp_path / "d"
    d.mkdir()
    a, b = _dead_temp(d / "a.bin"), _dead_temp(d / "b.bin")
    with nvio.AioHandle() as h:
        h.write(bytearray(b"A" * 5000), str(d / "a.bin"))
    assert not os.path.exists(a) and os.path.exists(b)
    nvio.save({"x": 1}, str(d / "b.bin"))
    assert sorted(os.listdir(d)) == ["a.bin", "b.bin"]


def test_shared_temporary_carries_its_owner(tmp_path):
    """The named temporary of a file several processes write (libnvio's
    FILE_ATOMIC | FILE_SHARED: the data-parallel save's, by rank 0; the
    compat writers') carries its maker like libnvio's unnamed ones: kept
    while the maker lives, gone when it abandons it, removed by the next
    save once the maker is dead."""
    d = tmp_path / "d"
    d.mkdir()
    p = str(d / "ck.pt")
    flags = nvio.FILE_ATOMIC | _nvio.FILE_SHARED

    kept = []

    def make():                         # kept open until the child's _exit
        kept.append(nvio.AioHandle(direct=False))
        kept.append(kept[0].open(p, flags))
        kept[1].pwrite(b"x" * (1 << 20), 0)
        return _nvio.file_share(kept[1])[0]
    with nvio.AioHandle(direct=False) as h:
        f = h.open(p, flags)
        tmp = _nvio.file_share(f)[0]
        f.pwrite(b"x" * 4096, 0)
        n, seen = _nvio.clean_temporaries(str(d), dry_run=True)
        assert n == 0 and seen == [(os.path.basename(tmp), 0, "owner is this process")]
        f.close()                       # abandoned: no commit
    assert os.listdir(d) == []
    left = _in_child(make)              # the child exits without closing it
    assert os.path.dirname(left) == str(d) and os.path.getsize(left) == 1 << 20
    n, seen = _nvio.clean_temporaries(str(d), dry_run=True)
    assert n == 1 and [x[0] for x in seen] == [os.path.basename(left)]
    nvio.save({"x": 2}, p)
    assert os.listdir(d) == ["ck.pt"] and nvio.load(p) == {"x": 2}
