"""nvio.open(): binary file objects over nvio streams.

    with nvio.open("/nvme/model.pt", "wb") as f:
        torch.save(state_dict, f)            # replaces the file only if this succeeds
    with nvio.open("/nvme/model.pt", "rb") as f:
        state_dict = torch.load(f)

A writer appends through double-buffered, page-locked staging buffers that
go to the file with O_DIRECT while the caller produces the next bytes; a
reader reads ahead. Both are ordinary ``io.BufferedIOBase`` objects: what
takes a binary file (``torch.save``, ``torch.load``, ``pickle``,
``zipfile``, ``shutil.copyfileobj``) takes them as they are.
"""
from __future__ import annotations

import io
import os

from . import _nvio
from . import _renamed

__all__ = ["open", "BufferedIO"]


def open(file, mode="rb", *, handle=None, buffer_bytes=0, atomic=True, fsync=False):
    """Open ``file`` for reading (``"rb"``) or writing (``"wb"``) through nvio.

    Writers: with ``atomic=True`` (the default) the data goes to a new,
    unnamed file that replaces ``file`` only when ``close()`` succeeds
    (fsync, rename, fsync of the directory): leaving a ``with`` block by an
    exception, a failed write, or a writer dropped without ``close()``
    leaves ``file`` as it was. ``atomic=False`` truncates ``file`` at open
    and writes in place; ``fsync=True`` then makes it durable at close.
    Readers read ahead ``buffer_bytes``-sized windows (0: 8 MiB).

    ``handle``: an :class:`nvio.AioHandle` to use (left open at close);
    by default the file object makes its own and closes it.
    """
    if mode in ("r", "rb"):
        return BufferedIO(file, "rb", handle, buffer_bytes, atomic, fsync)
    if mode in ("w", "wb"):
        return BufferedIO(file, "wb", handle, buffer_bytes, atomic, fsync)
    raise ValueError("nvio.open: mode must be 'rb' or 'wb', not %r" % (mode,))


class BufferedIO(io.BufferedIOBase):
    """A binary file object over an :class:`nvio.Stream` (made by
    :func:`nvio.open`). Called ``NvioFile`` before 0.3: in nvio, File means
    the open file of a handle (:class:`nvio.File`), which this wraps."""

    def __init__(self, file, mode, handle, buffer_bytes, atomic, fsync):
        super().__init__()
        self.name = os.fspath(file)
        self.mode = mode
        self._atomic = _nvio.check_flag(atomic, "atomic")
        self._fsync = _nvio.check_flag(fsync, "fsync")
        self._own = handle is None
        self._stream = self._file = None
        if self._own:
            from .handles import AioHandle
            handle = AioHandle()
        self._handle = handle
        try:
            if mode == "rb":
                flags = _nvio.FILE_READ
            elif self._atomic:
                flags = _nvio.FILE_ATOMIC
            else:
                flags = _nvio.FILE_WRITE | _nvio.FILE_CREATE | _nvio.FILE_TRUNC
            self._file = handle.open(file, flags)
            self._size = self._file.size
            self._stream = self._file.stream(mode[0], 0, buffer_bytes)
        except BaseException:
            self._teardown()
            raise

    # -- what it is -------------------------------------------------------

    def readable(self):
        self._check_open()
        return self.mode == "rb"

    def writable(self):
        self._check_open()
        return self.mode == "wb"

    def seekable(self):
        self._check_open()
        return self.mode == "rb"

    def _check_open(self):
        if self.closed:
            raise ValueError("I/O operation on closed file.")

    def _need(self, mode):
        self._check_open()
        if self.mode != mode:
            raise io.UnsupportedOperation("not readable" if mode == "rb" else "not writable")

    # -- reading ----------------------------------------------------------

    def read(self, size=-1):
        self._need("rb")
        left = max(0, self._size - self._stream.tell())
        if size is None or size < 0 or size > left:
            size = left
        return self._stream.read(size)

    read1 = read

    def readinto(self, b):
        self._need("rb")
        return self._stream.readinto(b)

    readinto1 = readinto

    def seek(self, offset, whence=io.SEEK_SET):
        self._need("rb")
        if whence == io.SEEK_SET:
            pos = offset
        elif whence == io.SEEK_CUR:
            pos = self._stream.tell() + offset
        elif whence == io.SEEK_END:
            pos = self._size + offset
        else:
            raise ValueError("invalid whence (%r, should be 0, 1 or 2)" % (whence,))
        if pos < 0:
            raise OSError(22, "Invalid argument: negative seek position %d" % pos)
        return self._stream.seek(pos)

    def tell(self):
        self._check_open()
        return self._stream.tell()

    # -- writing ----------------------------------------------------------

    def write(self, b):
        self._need("wb")
        try:
            return self._stream.write(b)
        except ValueError:
            if not hasattr(b, "__buffer__") and not isinstance(b, (bytes, bytearray, memoryview)):
                raise
            # a strided view: nvio never copies a whole buffer itself
            return self._stream.write(memoryview(b).tobytes())

    def flush(self):
        if self.closed or self._stream is None:
            return       # closing: io.IOBase.close() flushes once more
        if self.mode == "wb":
            self._stream.flush()

    # -- the end ----------------------------------------------------------

    def close(self):
        """Writers: write the rest, then (atomic) put the file in place or
        (fsync) make it durable. Raises if any of it failed; an atomic
        writer then leaves the old file. Idempotent."""
        if self.closed:
            return
        try:
            if self._stream is not None and self.mode == "wb":
                s, self._stream = self._stream, None
                s.close(fsync=self._fsync and not self._atomic, commit=self._atomic)
        finally:
            self._teardown()
            super().close()

    def abandon(self):
        """Close without putting an atomic writer's file in place."""
        if self.closed:
            return
        try:
            self._teardown()
        finally:
            super().close()

    def _teardown(self):
        """Frees the stream, the file and an own handle, each whatever the
        one before did. A stream still here is being abandoned (close()
        takes it first): its error (writing its tail to a file that is
        being discarded, on a full disk say) must not keep the file, and
        the space its temporary holds, alive until the exception that
        carries it is collected."""
        s, self._stream = self._stream, None
        f, self._file = self._file, None
        try:
            if s is not None:
                try:
                    s.close()
                except Exception:   # noqa: BLE001 - abandoned: its bytes go anyway
                    pass
        finally:
            try:
                if f is not None:
                    f.close()        # an atomic file not committed is abandoned
            finally:
                if self._own and self._handle is not None:
                    h, self._handle = self._handle, None
                    h.close()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and self.mode == "wb" and self._atomic:
            self.abandon()
        else:
            self.close()
        return False

    def __del__(self):
        # Dropped without close(): an atomic writer is abandoned (the file is
        # replaced only by an explicit close); anything else closes as usual.
        try:
            if not self.closed and self.mode == "wb" and self._atomic:
                self.abandon()
            else:
                self.close()
        except Exception:
            pass

    def __repr__(self):
        return "<nvio.io.BufferedIO name=%r mode=%r%s>" % (self.name, self.mode,
                                                           " closed" if self.closed else "")


__getattr__ = _renamed.renamed(__name__, {"NvioFile": "BufferedIO"}, globals())
