"""Policy around libnvio's atomic files, in Python.

Durability is libnvio's: an atomic file (``FILE_ATOMIC``) is a temporary
that its commit makes durable and renames over the target; a file several
processes write is one opened with ``FILE_ATOMIC | FILE_SHARED`` by its
creator, whose writers open it with :func:`join_shared`
(``FILE_SHARED``: libnvio refuses a link, a FIFO, another user's file, a
file of other names) and whose creator commits or abandons it. Here:

* :func:`join_shared`, a writer's open of such a file, checked to be the
  creator's very file;
* :func:`hold_replaced` / :func:`release_replaced` / :func:`remove`:
  freeing a replaced or removed big file's blocks off the caller's path;
* :func:`fsync_dir`, for directories whose entries a save made itself
  (nvio.dcp's files).

Temporaries, their names, links and renames are libnvio's alone (its
atomic open and commit): no Python copy of them is kept.
"""
from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading

from . import _nvio

#: A replaced or removed file at least this large is freed off the
#: caller's path (hold_replaced).
RECLAIM_LATER_MIN = 64 << 20
_releasing = []                 # threads closing held files (release_replaced)
_held = set()                   # fds of hold_replaced not closed yet
_releasing_lock = threading.Lock()


def join_shared(handle, share, flags=_nvio.FILE_WRITE):
    """A writer's File of a file several processes write: ``share`` is
    ``(temp_path, dev, ino)`` from ``_nvio.file_share`` of the creator's
    ``FILE_ATOMIC | FILE_SHARED`` File. Opened through ``handle.open`` with
    ``FILE_SHARED`` (libnvio opens the temporary and nothing else: no link
    followed, nothing created or truncated, a regular file of one name,
    the caller's), then refused (ESTALE) unless it is the creator's very
    file. Close it; the creator commits."""
    tmp, dev, ino = share
    f = handle.open(tmp, flags | _nvio.FILE_SHARED)
    try:
        st = os.fstat(f.fd)
        if (st.st_dev, st.st_ino) != (dev, ino):
            raise OSError(errno.ESTALE, "not the creator's temporary (replaced, or the "
                          "save was abandoned)", tmp)
    except BaseException:
        f.close()
        raise
    return f


def fsync_dir(d):
    """Make the entries of directory d durable."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def hold_replaced(path):
    """An fd of the regular file at path, which is about to be replaced or
    removed (None if there is none, or a small one). Held across the
    rename or unlink, it keeps the old inode alive, so that step does not
    free its blocks (0.1-0.5 s for 2 GiB on ext4 with discard);
    release_replaced frees them in the background afterwards."""
    try:
        st = os.stat(path, follow_symlinks=False)
        if not stat.S_ISREG(st.st_mode) or st.st_size < RECLAIM_LATER_MIN:
            return None
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    _held.add(fd)
    return fd


def release_replaced(fd):
    """Close an fd of hold_replaced on a thread of its own: the last close
    of a replaced file frees its blocks, which neither the caller nor the
    CRC threads (a next save's) should wait for."""
    if fd is None:
        return
    t = threading.Thread(target=_close, args=(fd,), name="nvio-release", daemon=True)
    with _releasing_lock:
        _releasing[:] = [x for x in _releasing if x.is_alive()]
        _releasing.append(t)
    t.start()


@contextlib.contextmanager
def replaced_held(path, hold=True):
    """hold_replaced(path) for the block (which replaces the file: a commit),
    release_replaced after it, whatever happens; ``hold=False`` (a spare
    save, whose old file is kept anyway) does nothing."""
    old = hold_replaced(path) if hold else None
    try:
        yield
    finally:
        release_replaced(old)


def _close(fd):
    _held.discard(fd)           # first: a fork from here on must not close it again
    os.close(fd)


def _forget_releases_after_fork():
    """In a child: the parent's release threads are not here, but its held
    fds are, and would keep the replaced files (their blocks) for as long
    as the child lives: close them."""
    global _releasing, _releasing_lock, _alloc_handle, _alloc_lock
    _alloc_handle, _alloc_lock = None, threading.Lock()    # the parent's: not usable here
    for fd in list(_held):
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()
    _releasing = []
    _releasing_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_releases_after_fork)


def settle_released():
    """Wait until every file released so far is freed (benchmarks call it so
    that one run's freeing does not land on the next run's time)."""
    with _releasing_lock:
        threads = list(_releasing)
    for t in threads:
        t.join()


def remove(path):
    """Unlink path, its blocks freed in the background (hold_replaced)."""
    fd = hold_replaced(path)
    try:
        os.unlink(path)
    finally:
        release_replaced(fd)
