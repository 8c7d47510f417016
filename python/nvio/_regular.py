"""Regular files only (private): the checks nvio's applications (offload,
safetensors) make before they open or read a path that a FIFO, a device
or a directory may have taken. open(2) of a FIFO blocks until a writer
comes, read(2) until it writes: either would hang a load forever."""
from __future__ import annotations

import fcntl
import os
import stat

__all__ = []


def kind(mode):
    """What a file of this st_mode is, in words ("a FIFO", ...)."""
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISDIR, "a directory"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "file type %o" % stat.S_IFMT(mode)


def open_regular(path, mode, error):
    """open(path, mode) ("r", "rb", "w") of a regular file only, without
    blocking: O_NONBLOCK for the open (a FIFO opens at once, or fails with
    ENXIO for writing), fstat, then blocking again. error(message) is
    raised for anything else; OSError from open(2) passes through."""
    flags = os.O_CLOEXEC | os.O_NONBLOCK
    flags |= os.O_WRONLY | os.O_CREAT | os.O_TRUNC if "w" in mode else os.O_RDONLY
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as e:
        if e.errno == getattr(os, "ENXIO", 6):      # a FIFO with no reader
            raise error("%s is a FIFO, not a regular file" % path) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error("%s is %s, not a regular file" % (path, kind(st.st_mode)))
        fl = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, fl & ~os.O_NONBLOCK)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def read_small(path, limit, error, limit_name=None):
    """The bytes of a regular file of at most limit bytes (an index, a
    manifest): error(message) for anything else, naming path and sizes
    (and limit_name, the setting that holds limit, where given)."""
    with open_regular(path, "rb", error) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise error("%s has %d bytes; it may have %d at most%s" % (
                path, size, limit, " (%s)" % limit_name if limit_name else ""))
        raw = f.read(limit + 1)
    if len(raw) > limit:
        raise error("%s grew past %d bytes while it was read" % (path, limit))
    return raw
