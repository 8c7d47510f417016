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
  (nvio.dcp's files);
* :func:`create_temp` / :func:`commit` / :func:`follow_links`: a named
  temporary for code that writes through its own file object and the
  rename of one (no save of nvio's uses them: they make and replace
  files as libnvio's atomic open and commit do, for tests and tools).
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


def follow_links(path):
    """The name a write through path reaches, as open(2) follows it (and
    libnvio's atomic open): the kernel follows the links (an ``O_PATH``
    open), so its rules apply as to any open: ``fs.protected_symlinks``
    refuses (EACCES) a link another user owns in a sticky world-writable
    directory such as /tmp. The file reached is named through
    /proc/self/fd. A dangling link gives the name it points to (a relative
    target beside its link), which open would create. A save through a
    link replaces the file it points to and keeps the link."""
    path = os.fspath(path)
    try:
        if not stat.S_ISLNK(os.lstat(path).st_mode):
            return path
    except FileNotFoundError:
        return path
    for _ in range(10):         # the target renamed meanwhile: again
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return _follow_dangling(path)
        except PermissionError as e:
            raise PermissionError(e.errno, "cannot follow the symbolic link (refused by "
                                  "the kernel: fs.protected_symlinks or permissions)",
                                  path) from None
        try:
            name = os.readlink("/proc/self/fd/%d" % fd)
            a = os.fstat(fd)
            b = os.stat(name)
            if name.startswith("/") and (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino):
                return name
        except OSError:
            pass
        finally:
            os.close(fd)
    raise OSError(errno.ESTALE, "the symbolic link's target kept moving", path)


def _protected_symlinks():
    """fs.protected_symlinks as the kernel applies it (1, its default, if
    it cannot be read)."""
    try:
        with open("/proc/sys/fs/protected_symlinks", "rb") as f:
            return f.read(1) != b"0"
    except OSError:
        return True


def _read_link(cur):
    """The target of the link at cur, read from the link itself (an
    ``O_PATH | O_NOFOLLOW`` descriptor: the link checked is the link read),
    once open(2)'s rule allows following it; None if cur is no link."""
    try:
        fd = os.open(cur, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISLNK(st.st_mode):
            return None
        d = os.stat(os.path.dirname(cur) or ".")
        if (d.st_mode & stat.S_ISVTX) and (d.st_mode & stat.S_IWOTH) and \
                st.st_uid not in (os.geteuid(), d.st_uid) and _protected_symlinks():
            raise PermissionError(errno.EACCES, "cannot follow the symbolic link (refused "
                                  "as the kernel would: fs.protected_symlinks)", cur)
        return os.readlink("", dir_fd=fd)
    finally:
        os.close(fd)


def _follow_dangling(path):
    """The name a dangling link leads to, followed here after the kernel
    found the chain dangling. The links may have been replaced since
    (another user renaming a link to root's file over the name), so each
    is checked again by open(2)'s rule as it is followed (_read_link)."""
    cur = path
    for _ in range(40):         # open's limit on links in a name
        link = _read_link(cur)
        if link is None:
            return cur
        cur = os.path.join(os.path.dirname(cur), link)
    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)


def create_temp(path, size=0):
    """Create a temporary for path (where its links lead) exclusively and
    return its name; with ``size``, lay it out (:func:`_allocate`)."""
    d, base = os.path.split(os.path.abspath(follow_links(path)))
    try:
        _nvio.clean_temporaries(d, base)
    except OSError:
        pass                    # best effort: the create below says what is wrong
    for _ in range(100):
        tmp = _nvio.temp_name(os.path.join(d, base))
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW |
                         os.O_CLOEXEC, 0o600)
            break
        except FileExistsError:
            continue
    else:
        raise FileExistsError(errno.EEXIST, "no free temporary name beside", path)
    try:
        if size:
            _allocate(fd, size)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


_alloc_handle = None
_alloc_lock = threading.Lock()


def _allocate(fd, size):
    """Reserve the first size bytes of fd with libnvio (nvio_file_allocate:
    fallocate(2)), or (a file system without it) a sparse ftruncate. Not
    posix_fallocate, which glibc emulates there by writing a byte into
    every block."""
    global _alloc_handle
    with _alloc_lock:
        if _alloc_handle is None or _alloc_handle.closed:
            _alloc_handle = _nvio.Handle(engine="psync", direct=False)
        h = _alloc_handle
    try:
        with h.open_fd(fd, _nvio.FILE_WRITE) as f:
            f.allocate(0, size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise OSError(e.errno, os.strerror(e.errno)) from None
        os.ftruncate(fd, size)


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


def commit(tmp, path, durable):
    """Give tmp the mode path has (or a new file's), rename it over path
    (where its links lead), fsync the directory (``durable``; the data's
    fsync is the caller's)."""
    path = follow_links(path)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        um = os.umask(0)
        os.umask(um)
        mode = 0o666 & ~um
    os.chmod(tmp, mode)
    old = hold_replaced(path)
    try:
        os.rename(tmp, path)
    finally:
        release_replaced(old)
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


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
