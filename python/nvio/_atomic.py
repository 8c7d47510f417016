"""Atomic files made from Python: a named temporary beside the target that
several writers (processes, ranks) open by name, renamed over the target
once complete.

libnvio's atomic files (``FILE_ATOMIC``) serve one writer; a file written
by many ranks, or through Python's own file object, needs a name the
others can open. The name comes from libnvio (``temp_name``: it carries
this process as the owner), so a later atomic write to the same target, or
``nvio clean``, removes it if this process is killed; dead owners'
temporaries of the target go first, as libnvio's atomic open does.
"""
from __future__ import annotations

import errno
import os
import stat

from . import _nvio


def create_temp(path, size=0):
    """Create a temporary for path exclusively and return its name; with
    ``size``, lay it out (``posix_fallocate``, or a sparse ``ftruncate``
    where the file system has no fallocate)."""
    d, base = os.path.split(os.path.abspath(path))
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
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as e:
                if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, size)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    return tmp


def commit(tmp, path, durable):
    """Give tmp the mode path has (or a new file's), rename it over path,
    fsync the directory (``durable``; the data's fsync is the caller's)."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        um = os.umask(0)
        os.umask(um)
        mode = 0o666 & ~um
    os.chmod(tmp, mode)
    os.rename(tmp, path)
    if durable:
        dfd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
