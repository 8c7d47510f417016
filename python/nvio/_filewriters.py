"""DeepSpeed's FastPersist writers (``deepspeed.io``) over nvio.

    # from deepspeed.io import FastFileWriter, FastFileWriterConfig
    from nvio.compat import FastFileWriter, FastFileWriterConfig
    cfg = FastFileWriterConfig(dnvme_handle=h, pinned_tensor=staging)
    writer = FastFileWriter(file_path=path, config=cfg)
    torch.save(state_dict, writer)
    writer.close()                  # the file appears now, complete
    writer._dump_state()            # DeepSpeed's statistics

Each writer is a binary file object for ``torch.save``: ``write``,
``flush``, ``close``, ``fileno()`` = -1 (so torch sends every byte through
``write``), plus DeepSpeed's statistics (``_dump_state()``; nvio adds
``stats()``, the same numbers as a dict).

What differs from DeepSpeed's, on purpose:

* **Atomic.** The bytes go to a new, unnamed file beside ``file_path`` that
  replaces it only when ``close()`` succeeds (fsync, rename, fsync of the
  directory; ``durable=False`` skips the fsyncs). An error, a writer left by
  an exception in a ``with`` block, or one dropped without ``close()``
  leaves ``file_path`` as it was and no temporary behind. A pre-existing
  longer file is never corrupted by a shorter checkpoint.
* **Unaligned tails** are written by libnvio in the same file (no reopen).
* **Large writes skip the staging copy:** a tensor's bytes go to the file
  straight from its memory once the staging buffer is drained.
* **Parallel writers** (``num_parallel_writers`` > 1, every writer saving
  the same object) write disjoint stripes of ONE file, which replaces
  ``file_path`` only when every writer succeeded; they coordinate through
  torch.distributed (the ``group`` field, or the default group). Each
  writer must reach ``close()`` or leave a ``with`` block: a writer that
  is merely dropped cannot tell the others, which then wait for it until
  the process group's timeout. A writer whose process dies is named by
  number on every other writer (from the process group's store, within a
  few seconds), and writer 0 removes the temporary.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import time

from . import _nvio
from ._atomic import join_shared, replaced_held
from ._base.handle import default_handle

__all__ = ["FastFileWriter", "FastFileWriterConfig", "MockFileWriter", "PyFileWriter"]

#: DeepSpeed's statistic names (the keys of stats() and _dump_state()).
CLOSE_KEY = "close"
FILENO_KEY = "fileno"
FLUSH_KEY = "flush"
WRITE_KEY = "write"
WRITE_BYTES_KEY = "bytes"
WRITE_SEC_KEY = "write_secs"
WRITE_SPEED_KEY = "write_GB/s"
AIO_WRITE_SEC_KEY = "aio_write_secs"
AIO_WRITE_BYTES_KEY = "aio_bytes"
AIO_SPEED_KEY = "aio_GB/s"
SLOW_WRITE_BYTES_KEY = "slow_bytes"
SLOW_WRITE_SEC_KEY = "slow_write_secs"
AIO_FILL_BUFFER_KEY = "fill_buffer_secs"
AIO_FILL_BUFFER_COUNT_KEY = "fill_buffer_count"
AIO_FILL_BUFFER_SPEED_KEY = "fill_buffer_GB/s"
SAVE_STORAGE_KEY = "save_storage"
SAVE_STORAGE_BYTES_KEY = "save_storage_bytes"

#: Staging halves and stripes are multiples of this (the page size: every
#: O_DIRECT alignment of a local file system divides it).
ALIGN = 4096
#: Staging memory made when the config gives no pinned_tensor (DeepSpeed's
#: default io_buffer_size).
DEFAULT_STAGING = 64 << 20
#: Writes of at least this many bytes (and of a staging half) go to the file
#: straight from the caller's memory once the staging buffer is drained.
DIRECT_MIN = 0
#: Parallel writers own the stream's stripes of this many bytes in turn.
DEFAULT_STRIPE = 16 << 20


@dataclasses.dataclass
class FastFileWriterConfig:
    """DeepSpeed's FastFileWriterConfig, with nvio's additions last.

    ``dnvme_handle``: the :class:`nvio.AioHandle` or :class:`nvio.GdsHandle`
    to write with (None: nvio's checkpoint handle). ``pinned_tensor``: the
    staging memory, a contiguous uint8 tensor (page-locked CPU, or a CUDA
    tensor for GDS; None: 64 MiB of nvio locked memory); with
    ``double_buffer`` it is split in two halves, one filling while the
    other is written. ``num_parallel_writers``/``writer_rank``: this
    writer's place among writers of one file. ``global_rank``: shown in the
    statistics.

    nvio's: ``group``, the torch.distributed process group of the parallel
    writers (default: the default group; its size must be
    num_parallel_writers and writer_rank the rank in it); ``durable``
    (fsync at close, True); ``stripe_bytes``, the unit parallel writers
    take in turn (a multiple of 4096, the same on every writer).
    """

    dnvme_handle: object = None
    pinned_tensor: object = None
    double_buffer: bool = True
    num_parallel_writers: int = 1
    writer_rank: int = 0
    global_rank: int = 0
    group: object = None
    durable: bool = True
    stripe_bytes: int = DEFAULT_STRIPE


class _BaseWriter:
    """A write-only binary file object that counts what torch does with it."""

    def __init__(self, file_path):
        if not isinstance(file_path, (str, bytes, os.PathLike)):
            raise TypeError("nvio: file_path must be a path, not %s" % type(file_path).__name__)
        self.name = self._path = os.fsdecode(file_path)
        self._stats = {}
        self._closed = False
        self._error = None              # the first failed write's exception
        self._pos = 0

    def _incr(self, key, n=1):
        self._stats[key] = self._stats.get(key, 0) + n

    # -- file-object surface --------------------------------------------------

    @property
    def closed(self):
        return self._closed

    def writable(self):
        return True

    def readable(self):
        return False

    def seekable(self):
        return False

    def tell(self):
        return self._pos

    def fileno(self):
        """-1: no descriptor, so torch.save sends every byte through write()."""
        self._incr(FILENO_KEY)
        return -1

    def flush(self):
        """Counted; nothing is durable before close()."""
        self._incr(FLUSH_KEY)

    def write(self, buffer):
        if self._closed:
            raise ValueError("nvio: write to a closed %s (%s)" % (type(self).__name__, self._path))
        mv = _bytes_view(buffer)
        if self._error is not None:
            return len(mv)              # dropped: close() raises the first error
        t0 = time.perf_counter()
        try:
            self._write(mv)
        except OSError as e:
            # Kept for close() rather than raised: torch.save cannot recover
            # from a failed write (it would report "unexpected pos" in place
            # of this error), so it runs to its end into a writer that drops
            # the bytes, and close() raises this, naming the file, and leaves
            # the old file in place.
            self._error = e
            return len(mv)
        self._incr(WRITE_SEC_KEY, time.perf_counter() - t0)
        self._incr(WRITE_KEY)
        self._incr(WRITE_BYTES_KEY, len(mv))
        self._pos += len(mv)
        return len(mv)

    def close(self):
        """Finish the file and put it in place; idempotent."""
        if self._closed:
            return
        self._incr(CLOSE_KEY)
        if self._error is not None:
            try:
                self._tell_others(self._error)
            finally:
                self.abandon()
            raise self._error
        try:
            self._finish()
        finally:
            self._closed = True

    def abandon(self):
        """Close without creating or replacing the file."""
        if not self._closed:
            self._closed = True
            self._drop()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            try:
                self._tell_others(exc)
            except Exception:  # noqa: BLE001 - the original error goes on
                pass
            finally:
                self.abandon()
        else:
            self.close()
        return False

    def _tell_others(self, exc):
        """Parallel writers: fail the other writers' close() too."""

    def __del__(self):
        try:
            if not self._closed:
                self.abandon()        # never put a file in place implicitly
        except Exception:  # noqa: BLE001 - nothing to report to at collection
            pass

    # -- statistics -----------------------------------------------------------

    def stats(self):
        """DeepSpeed's statistics as a dict (speeds in GB/s, GB = 2**30)."""
        s = dict(self._stats)
        _speed(s, WRITE_SPEED_KEY, WRITE_BYTES_KEY, WRITE_SEC_KEY)
        return s

    def _dump_state(self):
        """Print the statistics as DeepSpeed's writers do."""
        print("stats = %s" % (self.stats(),))

    def file_path(self):
        return self._path

    def _write(self, mv):  # pragma: no cover - overridden
        raise NotImplementedError

    def _finish(self):
        pass

    def _drop(self):
        pass


def _speed(s, key, nbytes_key, secs_key):
    secs = s.get(secs_key, 0)
    if secs > 0:
        s[key] = s.get(nbytes_key, 0) / secs / (1 << 30)


def _bytes_view(buffer):
    """A flat byte memoryview of what write() was given."""
    try:
        mv = memoryview(buffer)
    except TypeError:
        t = buffer
        if hasattr(t, "untyped_storage") or hasattr(t, "data_ptr"):
            # a tensor: its bytes, on the CPU
            import torch
            t = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy()
            return memoryview(t)
        raise TypeError("nvio: write() needs a bytes-like object, not %s"
                        % type(buffer).__name__) from None
    if not mv.c_contiguous:
        mv = memoryview(mv.tobytes())
    return mv.cast("B") if mv.format != "B" or mv.ndim != 1 else mv


def _storage_bytes(obj):
    """(host byte view, element count) of a storage or tensor from the
    storage-list hook: a TypedStorage, UntypedStorage, tensor, or a
    (storage, dtype) pair."""
    import torch
    dtype = None
    if isinstance(obj, tuple) and len(obj) == 2:
        obj, dtype = obj
    if isinstance(obj, torch.storage.TypedStorage):
        dtype = dtype or obj.dtype
        obj = obj._untyped_storage
    if isinstance(obj, torch.UntypedStorage):
        t = torch.empty(0, dtype=torch.uint8, device=obj.device).set_(
            obj, 0, (obj.nbytes(),), (1,))
    elif isinstance(obj, torch.Tensor):
        dtype = dtype or obj.dtype
        t = obj.detach().contiguous().reshape(-1).view(torch.uint8)
    else:
        raise TypeError("nvio: save_torch_storage_object_list takes storages or tensors, "
                        "not %s" % type(obj).__name__)
    t = t.cpu()
    esize = torch._utils._element_size(dtype or torch.uint8)
    return memoryview(t.numpy()) if t.numel() else memoryview(b""), t.numel() // esize


class MockFileWriter(_BaseWriter):
    """Counts what torch.save writes and writes nothing (measures the
    serialization alone). Creates ``file_path`` empty at close if nothing is
    there; an existing file is left untouched."""

    def _write(self, mv):
        pass

    def _finish(self):
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            return
        os.close(fd)

    def save_torch_storage_object_list(self, storage_obj_list, save_size):
        """DeepSpeed's storage-list hook (a patched torch's legacy save):
        counted as write() counts."""
        _save_list(self, storage_obj_list, save_size)


class PyFileWriter(_BaseWriter):
    """Python's buffered file writes, timed, into a temporary beside
    ``file_path`` that replaces it at close (fsync, rename, fsync of the
    directory; ``durable=False`` skips the fsyncs)."""

    def __init__(self, file_path, *, durable=True):
        self._f = self._nf = None
        super().__init__(file_path)
        self._durable = _nvio.check_flag(durable, "durable")
        try:
            # libnvio's atomic file (a named temporary: FILE_SHARED), written
            # through a Python file object on a copy of its descriptor
            self._nf = default_handle().open(
                self._path, _nvio.FILE_ATOMIC | _nvio.FILE_SHARED |
                (0 if self._durable else _nvio.FILE_NOSYNC))
            fd = os.dup(self._nf.fd)
        except OSError as e:
            self._drop()
            raise _path_error(e, self._path, "creating a temporary") from None
        self._f = os.fdopen(fd, "wb")

    def _write(self, mv):
        try:
            self._f.write(mv)
        except OSError as e:
            raise _path_error(e, self._path, "write") from None

    def _finish(self):
        try:
            f, self._f = self._f, None
            f.close()                   # flushed: a failed write shows here
            nf, self._nf = self._nf, None
            try:
                with replaced_held(self._path):
                    nf.commit()         # fsync, rename, fsync of the directory
            finally:
                nf.close()
        except BaseException:
            self._drop()
            raise

    def _drop(self):
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass
        nf, self._nf = self._nf, None
        if nf is not None:
            nf.close()                  # not committed: abandoned

    def save_torch_storage_object_list(self, storage_obj_list, save_size):
        """DeepSpeed's storage-list hook: each storage's element count (int64,
        if save_size) then its bytes."""
        _save_list(self, storage_obj_list, save_size)


def _save_list(w, storage_obj_list, save_size):
    for obj in storage_obj_list:
        mv, numel = _storage_bytes(obj)
        if save_size:
            w.write(numel.to_bytes(8, "little", signed=True))
        w.write(mv)
        w._incr(SAVE_STORAGE_KEY)
        w._incr(SAVE_STORAGE_BYTES_KEY, len(mv))


def _path_error(e, path, what):
    return type(e)(e.errno, "%s (%s of %s)" % (e.strerror, what, path), path)


def _staging(tensor, double):
    """(memory, depth) of the staging: the pinned_tensor (host or CUDA), or
    nvio locked memory; checked to give every buffer ALIGN bytes at least."""
    if tensor is None:
        mem, nbytes = _nvio.LockedBuffer(DEFAULT_STAGING), DEFAULT_STAGING
    else:
        if not hasattr(tensor, "data_ptr") or not tensor.is_contiguous():
            raise ValueError("nvio: pinned_tensor must be a contiguous tensor")
        mem, nbytes = tensor, tensor.numel() * tensor.element_size()
    parts = 2 if double else 1
    if nbytes // parts // ALIGN == 0:
        raise ValueError("nvio: pinned_tensor of %d bytes is too small: %s needs at least "
                         "%d bytes" % (nbytes, "double_buffer" if double else "a buffer",
                                       parts * ALIGN))
    return mem, parts


class FastFileWriter(_BaseWriter):
    """DeepSpeed's FastFileWriter over nvio: torch.save's bytes staged in
    ``config.pinned_tensor`` and written with the handle's engine (O_DIRECT
    where the file system allows), atomically. See the module's docstring.

    The staging and the double buffering are libnvio's (a stream over the
    caller's memory, ``_nvio.StagedStream``); so are the temporary, its
    commit and, with parallel writers, the one file they share
    (``FILE_SHARED``).

    ``file_path``: the checkpoint's path. ``config``: a
    :class:`FastFileWriterConfig` (None: all defaults).
    """

    def __init__(self, file_path, config=None):
        self._file = self._creator = self._stream = self._group = None
        self._rank, self._filled = 0, 0
        super().__init__(file_path)
        cfg = config if config is not None else FastFileWriterConfig()
        if not isinstance(cfg, FastFileWriterConfig):
            raise TypeError("nvio: config must be a FastFileWriterConfig, not %s"
                            % type(cfg).__name__)
        self._cfg = cfg
        self._durable = _nvio.check_flag(cfg.durable, "durable")
        double = _nvio.check_flag(cfg.double_buffer, "double_buffer")
        n, rank = cfg.num_parallel_writers, cfg.writer_rank
        if not isinstance(n, int) or n < 1 or not isinstance(rank, int) or not 0 <= rank < n:
            raise ValueError("nvio: writer_rank must be in [0, num_parallel_writers), not "
                             "writer_rank=%r of num_parallel_writers=%r" % (rank, n))
        if n > 1 and (cfg.stripe_bytes <= 0 or cfg.stripe_bytes % ALIGN):
            raise ValueError("nvio: stripe_bytes must be a positive multiple of %d, not %r"
                             % (ALIGN, cfg.stripe_bytes))
        self._n, self._rank, self._stripe = n, rank, cfg.stripe_bytes
        h = cfg.dnvme_handle
        if h is None:
            h = default_handle()
        if not hasattr(h, "open"):
            raise TypeError("nvio: dnvme_handle must be an nvio AioHandle or GdsHandle "
                            "(nvio.compat.AsyncIOBuilder().load().aio_handle()), not %s"
                            % type(h).__name__)
        self._handle = h
        self._mem, self._depth = _staging(cfg.pinned_tensor, double)
        self._digest = hashlib.sha256()   # parallel writers: the stream's head
        self._tail = bytearray()          # ... and its last bytes
        if n > 1:
            self._open_shared()
        else:
            self._file = h.open(self._path, self._atomic_flags())
        try:
            self._stream = _nvio.StagedStream(self._file, self._mem, depth=self._depth,
                                              ranges=n > 1)
        except BaseException:
            self._drop()
            raise

    def _atomic_flags(self):
        return _nvio.FILE_ATOMIC | (0 if self._durable else _nvio.FILE_NOSYNC)

    # -- parallel writers: one shared temporary --------------------------------------

    def _open_shared(self):
        import torch.distributed as dist   # torch is optional for nvio.compat's writers
        from ._base.group import Group
        group = self._cfg.group
        if group is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise ValueError("nvio: num_parallel_writers=%d needs torch.distributed: "
                                 "initialize the default process group or pass "
                                 "FastFileWriterConfig(group=...) with the writers' group"
                                 % self._n)
            group = dist.group.WORLD
        g = Group(group, self._path, None)
        if g.size != self._n or g.rank != self._rank:
            raise ValueError("nvio: writer_rank=%d of num_parallel_writers=%d does not match "
                             "the process group (rank %d of %d)"
                             % (self._rank, self._n, g.rank, g.size))
        g.fail = lambda what, e: OSError("nvio: FastFileWriter %s: %s failed on writer %d: %s"
                                         % (self._path, what, g.rank, e))
        self._group = g
        share = err = None
        if self._rank == 0:     # libnvio's named temporary, committed by writer 0
            try:
                self._creator = self._handle.open(
                    self._path, self._atomic_flags() | _nvio.FILE_SHARED)
                share = _nvio.file_share(self._creator)
            except OSError as e:
                err = str(_path_error(e, self._path, "creating a temporary"))
        try:
            got = g.gather("creating the file", (err, share))
        except BaseException:
            self._drop()            # a writer died: writer 0 abandons the temporary
            raise
        if got[0][0]:
            self._drop()
            raise OSError("nvio: FastFileWriter %s: writer 0 could not create the file: %s"
                          % (self._path, got[0][0]))
        err = None
        try:
            self._file = join_shared(self._handle, got[0][1])
        except OSError as e:
            err = str(e)
        self._agree("opening the file", err)

    def _tell_others(self, exc):
        if self._group is not None and not self._closed:
            self._agree("writing the stripes", "%s: %s" % (type(exc).__name__, exc))

    def _agree(self, what, err):
        """Raise on every writer if any writer failed (abandoning the temporary)."""
        try:
            got = self._group.gather(what, err)
        except BaseException:
            self._drop()            # a writer died (named): the file is not written
            raise
        bad = [(r, e) for r, e in enumerate(got) if e]
        if bad:
            self._drop()
            r, e = bad[0]
            raise OSError("nvio: FastFileWriter %s: %s failed on writer %d: %s; the file was "
                          "not written" % (self._path, what, r, e))
        return got

    def _owned(self, pos, n):
        """(start, length) of this writer's parts of stream bytes [pos, pos+n)."""
        if self._n == 1:
            return [(pos, n)]
        out = []
        s, end = self._stripe, pos + n
        k = pos // s
        while k * s < end:
            if k % self._n == self._rank:
                a, b = max(pos, k * s), min(end, (k + 1) * s)
                out.append((a, b - a))
                k += self._n
            else:
                k += (self._rank - k % self._n) % self._n
        return out

    # -- writing --------------------------------------------------------------------

    def _write(self, mv):
        pos0 = self._pos
        if self._n > 1:
            self._note_stream(mv, pos0)
        for start, n in self._owned(pos0, len(mv)):
            self._put(mv[start - pos0:start - pos0 + n], start)

    def _note_stream(self, mv, pos):
        """Parallel writers keep a digest of the stream's first MiB (the
        pickle) and its last 64 KiB (the directory with every record's
        CRC-32), to check at close that all saved the same thing."""
        if pos < 1 << 20:
            self._digest.update(mv[:(1 << 20) - pos])
        k = 1 << 16
        self._tail += mv[-k:]
        if len(self._tail) > 2 * k:         # trimmed now and then: linear time
            del self._tail[:-k]

    def _put(self, src, off):
        """src, whose stream offset is off, to libnvio's stream: copied into
        the staging memory (a full buffer written while the next fills), or
        a large aligned span straight from src."""
        t0 = time.perf_counter()
        s = self._stream
        if s.tell() != off:
            s.seek(off)             # parallel writers: this writer's next stripe
        s.write(src)
        dt = time.perf_counter() - t0
        self._incr(AIO_FILL_BUFFER_KEY, dt)
        self._incr(AIO_FILL_BUFFER_COUNT_KEY)
        self._incr(AIO_WRITE_SEC_KEY, dt)
        self._incr(AIO_WRITE_BYTES_KEY, len(src))
        self._filled += len(src)

    def _finish(self):
        try:
            t0 = time.perf_counter()
            s, self._stream = self._stream, None
            if self._n > 1:
                s.close(fsync=self._durable)
            else:
                with replaced_held(self._path):
                    s.close(commit=True)    # the size, fsync, rename, fsync of the dir
            self._incr(AIO_WRITE_SEC_KEY, time.perf_counter() - t0)
            if self._n > 1:
                self._finish_shared()
            else:
                self._file.close()
                self._file = None
        except BaseException:
            self._drop()
            raise

    def _finish_shared(self):
        err = None
        try:
            self._file.close()
            self._file = None
        except OSError as e:
            err = str(e)
        me = (self._pos, self._digest.hexdigest(),
              hashlib.sha256(self._tail[-(1 << 16):]).hexdigest())
        got = self._agree("writing the stripes", err)
        sums = self._group.gather("comparing the streams", me)
        for r, s in enumerate(sums):
            if s != sums[0]:
                self._drop()
                raise ValueError("nvio: FastFileWriter %s: writer %d saved %d bytes that differ "
                                 "from writer 0's %d: parallel writers must all save the same "
                                 "object; the file was not written"
                                 % (self._path, r, s[0], sums[0][0]))
        del got
        err = None
        if self._rank == 0:
            try:
                c, self._creator = self._creator, None
                try:
                    c.truncate(self._pos)
                    with replaced_held(self._path):
                        c.commit()      # fsync, rename, fsync of the directory
                finally:
                    c.close()
            except OSError as e:
                err = str(_path_error(e, self._path, "committing"))
        self._agree("committing", err)

    def _drop(self):
        s, self._stream = self._stream, None
        if s is not None:
            try:
                s.close()                  # its ops end; the file is abandoned below
            except (OSError, ValueError):
                pass
        for name in ("_file", "_creator"):
            f = getattr(self, name)
            setattr(self, name, None)
            if f is not None:
                try:
                    f.close()              # ATOMIC and not committed: abandoned
                except OSError:
                    pass

    # -- DeepSpeed's extras ------------------------------------------------------------

    def save_torch_storage_object_list(self, storage_obj_list, save_size):
        """DeepSpeed's storage-list hook (a patched torch's legacy save):
        each storage's element count (int64, if save_size) then its bytes,
        written like write()'s."""
        _save_list(self, storage_obj_list, save_size)

    def stats(self):
        s = super().stats()
        _speed(s, AIO_SPEED_KEY, AIO_WRITE_BYTES_KEY, AIO_WRITE_SEC_KEY)
        secs = s.get(AIO_FILL_BUFFER_KEY, 0)
        if secs > 0:
            s[AIO_FILL_BUFFER_SPEED_KEY] = self._filled / secs / (1 << 30)
        return s

    def _dump_state(self):
        print("rank %d writer %d of %d: %s" % (self._cfg.global_rank, self._rank, self._n,
                                               self._path))
        super()._dump_state()
