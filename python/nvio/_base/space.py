"""Space for a file before its bytes move, and how a crash-safe one is opened."""
from __future__ import annotations

import contextlib
import errno

from .. import _nvio
from .._atomic import replaced_held


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


@contextlib.contextmanager
def open_atomic(h, path, durable=True, spare=False, opener=None):
    """The crash-safe replacement of ``path`` (an ATOMIC nvio File, opened
    with ``opener(path, flags)``, by default ``h.open``), for a ``with``
    block that writes it and commits it; leaving the block closes it
    (abandoned if not committed). The file it replaces, if it is large, is
    held open across the commit and closed on a thread afterwards, so that
    neither the rename nor the caller waits for its blocks to be freed
    (0.1-0.5 s for 2 GiB on ext4 mounted with discard). A spare save keeps
    the old file anyway. nvio.save, AsyncCheckpointer and
    nvio.safetensors.save_file replace files through here (the
    data-parallel commit holds the old file around its own commit)."""
    with replaced_held(path, hold=not spare):
        with (opener or h.open)(path, atomic_flags(durable, spare)) as f:
            yield f
