"""Space for a file before its bytes move, and the flags of a crash-safe one."""
from __future__ import annotations

import errno

from .. import _nvio


def reserve_space(f, size):
    """Allocate size bytes of the open file f up front, so that a full disk
    fails the save (ENOSPC) before any data moves; where the file system has
    no fallocate (EOPNOTSUPP, EINVAL) the writes allocate as they go. Files
    under 1 MiB are left alone."""
    if size >= 1 << 20:
        try:
            f.allocate(0, size)
        except _nvio.NvioError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise


def atomic_flags(durable, spare=False):
    """The nvio File flags of a crash-safe save (``durable``, ``spare``:
    see :func:`nvio.save`)."""
    return (_nvio.FILE_ATOMIC | (0 if durable else _nvio.FILE_NOSYNC) |
            (_nvio.FILE_SPARE if spare else 0))
