"""nvio.offload.Swapper: tensors out to NVMe files and back, through a bounded pool.

Layout (decided here, moved by libnvio):

* One swap file per directory, opened once as an nvio File (O_CREAT|O_EXCL
  under a fresh name) and unlinked at once: the data lives as long as the
  open descriptor, so nothing is left behind on close, on exit, or after a
  SIGKILL, and nobody else's file can be reached through its name.
* A key's bytes are padded to ALIGN (4 KiB) and cut into one piece per
  directory, each piece's size proportional to the directory's bandwidth
  weight (``bandwidth=``, default equal), rounded to ALIGN; keys of less
  than ``stripe_min`` bytes go whole to the directory with the least
  weighted load. A directory whose free space (``statvfs`` at open, or
  ``capacity=``) would be exceeded drops out of the split.
* Writes are copy-on-write: a key's new bytes go to fresh extents and
  replace the old ones only when every piece has been written; the old
  extents are freed once no read uses them. So a key is never overwritten
  while a read of it is pending, and a failed write (a full disk, EIO)
  leaves the previous value readable. A read of a key waits for that key's
  pending write; writes of one key from several threads take effect in the
  order their swap_out calls return.
* Memory: one LockedBuffer of ``pool_bytes`` (page-aligned, locked when
  RLIMIT_MEMLOCK allows), cut by a first-fit allocator into 4 KiB-aligned
  regions. ``swap_out`` copies into a region (so the caller may change its
  tensor at once) or writes from it directly when the tensor IS a region;
  ``swap_in`` without ``out`` returns a tensor over a region, held until
  ``release(key)``. When the pool is full the call waits for in-flight ops
  to free regions; when nothing in flight would free any, it raises naming
  the keys that hold the pool.

Every op goes through ``Completions.submit`` (python/nvio/_futures.py); an
async call's result is an :class:`nvio.NvioFuture`.
"""
from __future__ import annotations

import atexit
import bisect
import errno
import json
import os
import threading
import weakref

import torch

from .. import _device, _nvio
from .._base.views import numel, tensor_u8
from .._futures import NvioFuture, completions
from ..handles import AioHandle
from . import _trust

__all__ = ["Swapper", "SwapError", "SwapCorruptError", "ALIGN"]

#: Every piece of a key starts and ends on this many bytes (O_DIRECT's and
#: the page's size).
ALIGN = 4096
#: Keys smaller than this are not split over directories.
STRIPE_MIN = 1 << 20
#: Swap files are preallocated this many bytes at a time.
GROW = 64 << 20
_INDEX = "index.json"
_DATA = "data.bin"
#: 2: each key's CRC-32 in the index, and the index's own over its keys
#: (absent in the first format 2 files); 1 (still read): none.
_FORMAT = 2
#: Keys in one checkpoint at most (a limit on what an index may make restore allocate).
_KEYS_MAX = 1 << 24


def _up(n, a=ALIGN):
    return (n + a - 1) // a * a


class SwapError(OSError):
    """A swap failed: ``errno``, ``filename`` (the swap file), ``key`` and
    ``offset`` say what, where and why."""

    def __init__(self, err, msg, filename=None, key=None, offset=None):
        super().__init__(err, msg, filename)
        self.key = key
        self.offset = offset


class SwapCorruptError(SwapError):
    """A Swapper checkpoint that fails its checks: an index field outside
    what nvio writes (``field`` names it, e.g. ``keys[3].dtype``), a data
    file shorter than its index, or bytes whose CRC-32 differs from the
    index's (``key`` and ``offset`` say where). ``filename`` is the file."""

    def __init__(self, err, msg, filename=None, key=None, offset=None, field=None):
        super().__init__(err, msg, filename, key, offset)
        self.field = field


def _wrap(e, what, key):
    """A SwapError naming the key, from an NvioError (or any exception)."""
    if isinstance(e, SwapError):
        return e
    err = getattr(e, "errno", None) or errno.EIO
    fn = getattr(e, "filename", None)
    off = getattr(e, "offset", None)
    where = ""
    if fn:
        where = " %s (unlinked swap file)" % fn
        if off is not None:
            where += " at offset %d" % off
    msg = "nvio.offload: %s of key %r failed:%s: %s" % (
        what, key, where, getattr(e, "strerror", None) or e)
    return SwapError(err, msg, fn, key, off)


class _Extents:
    """First-fit allocator of ALIGN-multiple ranges (a file's or the pool's)."""

    def __init__(self, limit=None):
        self.holes = []          # sorted (offset, length)
        self.end = 0
        self.limit = limit       # None: grows without bound
        self.used = 0

    def alloc(self, n):
        for i, (off, ln) in enumerate(self.holes):
            if ln >= n:
                if ln == n:
                    del self.holes[i]
                else:
                    self.holes[i] = (off + n, ln - n)
                self.used += n
                return off
        if self.limit is not None and self.end + n > self.limit:
            return None
        off = self.end
        self.end += n
        self.used += n
        return off

    def room(self, n):
        """Could alloc(n) succeed?"""
        if any(ln >= n for _, ln in self.holes):
            return True
        return self.limit is None or self.end + n <= self.limit

    def free(self, off, n):
        self.used -= n
        i = bisect.bisect(self.holes, (off, n))
        if i > 0 and self.holes[i - 1][0] + self.holes[i - 1][1] == off:
            i -= 1
            off, n = self.holes[i][0], self.holes[i][1] + n
            del self.holes[i]
        if i < len(self.holes) and off + n == self.holes[i][0]:
            n += self.holes[i][1]
            del self.holes[i]
        if off + n == self.end:
            self.end = off
        else:
            self.holes.insert(i, (off, n))


class _Region:
    """A range of the pool, held by the caller (resident) and by ops in flight."""

    __slots__ = ("off", "size", "refs", "u8")

    def __init__(self, off, size, u8):
        self.off, self.size, self.refs, self.u8 = off, size, 1, u8


class _Entry:
    """Where a key's bytes are: pieces (dir, file offset, byte offset in the
    tensor, padded length)."""

    __slots__ = ("nbytes", "dtype", "shape", "pieces", "readers", "retired")

    def __init__(self, nbytes, dtype, shape, pieces):
        self.nbytes, self.dtype, self.shape, self.pieces = nbytes, dtype, tuple(shape), pieces
        self.readers = 0
        self.retired = False


class _Key:
    __slots__ = ("entry", "write", "region", "tensor", "read")

    def __init__(self):
        self.entry = None        # committed _Entry
        self.write = None        # future of the pending write
        self.region = None       # resident pool region (swap_in without out)
        self.tensor = None       # the tensor over it
        self.read = None         # future of the read filling it


def _dtype_name(dt):
    return str(dt).replace("torch.", "")


_live = weakref.WeakSet()


@atexit.register
def _close_all():
    for s in list(_live):
        try:
            s.close()
        except Exception:   # noqa: BLE001 - exit must go on
            pass


class Swapper:
    """Tensors out to NVMe and back.

    ``dirs``: a directory or a list (one per SSD); each gets one unlinked swap
    file. ``pool_bytes``: the locked memory the swapper may use (its only
    memory, besides nvio's bounded staging for ``out`` tensors it cannot
    read into directly). ``bandwidth``: relative weights of the directories
    (e.g. GB/s from ``nvio bench``; default equal); ``capacity``: bytes each
    may hold (default: its free space at open). ``engine``/``direct``/
    ``handle``: how the I/O is done (a handle given is used, not closed).
    """

    def __init__(self, dirs, pool_bytes=256 << 20, *, bandwidth=None, capacity=None,
                 stripe_min=STRIPE_MIN, engine="auto", direct="auto", handle=None,
                 block_size=1 << 20, queue_depth=32, intra_op_parallelism=None):
        if isinstance(dirs, (str, bytes, os.PathLike)):
            dirs = [dirs]
        self.dirs = [os.fsdecode(d) for d in dirs]
        if not self.dirs:
            raise ValueError("nvio.offload: Swapper needs at least one directory")
        n = len(self.dirs)
        bw = [1.0] * n if bandwidth is None else [float(b) for b in bandwidth]
        if len(bw) != n or any(not b > 0 for b in bw):
            raise ValueError("nvio.offload: bandwidth must be %d positive weights, not %r"
                             % (n, bandwidth))
        if capacity is not None and len(capacity) != n:
            raise ValueError("nvio.offload: capacity must give %d sizes" % n)
        pool_bytes = int(pool_bytes)
        if pool_bytes < 0:
            raise ValueError("nvio.offload: pool_bytes must be >= 0")
        self.weights = bw
        self.stripe_min = stripe_min
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._keys = {}
        self._errors = []
        self._inflight = 0
        self._closed = True
        self._files = []
        self._own_handle = handle is None
        if handle is None:
            handle = AioHandle(block_size=block_size, queue_depth=queue_depth,
                               intra_op_parallelism=intra_op_parallelism or
                               max(1, min(4, os.cpu_count() or 1)),
                               engine=engine, direct=direct)
        self._h = handle
        self._space = []
        try:
            for i, d in enumerate(self.dirs):
                self._files.append(self._open_swap_file(d))
                cap = capacity[i] if capacity is not None else _free_bytes(d)
                self._space.append(_Extents(cap))
        except BaseException:
            self._close_files()
            raise
        self._placed = [0] * n            # bytes placed per dir (for weighting)
        self._grown = [0] * n             # bytes preallocated per swap file
        self.pool_bytes = pool_bytes // ALIGN * ALIGN
        self._pool = _nvio.LockedBuffer(self.pool_bytes) if self.pool_bytes else None
        self._pool_u8 = (torch.frombuffer(self._pool, dtype=torch.uint8)
                         if self.pool_bytes else torch.empty(0, dtype=torch.uint8))
        self._pool_ext = _Extents(self.pool_bytes)
        self._regions = {}                # pool offset -> _Region
        self._closed = False
        _live.add(self)

    # -- files -------------------------------------------------------------

    def _open_swap_file(self, d):
        if not os.path.isdir(d):
            err = errno.ENOENT if not os.path.exists(d) else errno.ENOTDIR
            raise SwapError(err, "nvio.offload: swap directory %s: %s"
                            % (d, os.strerror(err)), d)
        if not os.access(d, os.W_OK | os.X_OK):
            raise SwapError(errno.EACCES, "nvio.offload: swap directory %s is not "
                            "writable (read-only or no permission)" % d, d)
        flags = _nvio.FILE_READ | _nvio.FILE_WRITE | _nvio.FILE_CREATE | _nvio.FILE_EXCL
        for _ in range(100):
            path = os.path.join(d, ".nvio-swap-%d-%s" % (os.getpid(), os.urandom(6).hex()))
            try:
                f = self._h.open(path, flags)
            except FileExistsError:
                continue
            except OSError as e:
                raise SwapError(e.errno or errno.EIO, "nvio.offload: cannot create a swap "
                                "file in %s: %s" % (d, e.strerror or e), path) from e
            # Unlinked at once: the space is ours while the descriptor is
            # open, and gone with it (close, exit, even SIGKILL).
            os.unlink(path)
            return f
        raise SwapError(errno.EEXIST, "nvio.offload: no free swap file name in %s" % d, d)

    def _close_files(self):
        for f in self._files:
            try:
                f.close()
            except OSError:
                pass
        self._files = []

    @property
    def files(self):
        """The swap files (nvio Files; their names are already unlinked)."""
        return list(self._files)

    # -- pool --------------------------------------------------------------

    def _alloc_region(self, size, key, what):
        """A pool region of size bytes (a multiple of ALIGN); waits for ops in
        flight to free space; raises when nothing would."""
        if size > self.pool_bytes:
            raise ValueError(
                "nvio.offload: %s of key %r needs %d bytes of pool, but pool_bytes is %d: "
                "make pool_bytes >= %d" % (what, key, size, self.pool_bytes, size))
        with self._cond:
            while True:
                self._check_open()
                off = self._pool_ext.alloc(size)
                if off is not None:
                    r = _Region(off, size, self._pool_u8[off:off + size])
                    self._regions[off] = r
                    return r
                if self._inflight == 0:
                    held = [repr(k) for k, v in self._keys.items() if v.region is not None]
                    raise MemoryError(
                        "nvio.offload: the pool (%d bytes) has no room for %d bytes for %s of "
                        "key %r: held by swapped-in keys %s; release() them or raise "
                        "pool_bytes" % (self.pool_bytes, size, what, key,
                                        ", ".join(held[:8]) + (" ..." if len(held) > 8 else "")
                                        or "(none; fragmented)"))
                self._cond.wait()

    def _unref(self, r):
        """Drop one reference of a region (lock held)."""
        r.refs -= 1
        if r.refs == 0:
            del self._regions[r.off]
            self._pool_ext.free(r.off, r.size)
            self._cond.notify_all()

    def _region_of(self, t):
        """The live pool region t's bytes start, or None."""
        if not self.pool_bytes or t.device.type != "cpu" or not t.is_contiguous():
            return None
        off = t.data_ptr() - self._pool.address
        r = self._regions.get(off)
        if r is not None and t.numel() * t.element_size() <= r.size:
            return r
        return None

    def buffer(self, nbytes, key=None):
        """A uint8 tensor of nbytes over a pool region, held until the key it is
        swapped out under is released (or :meth:`free_buffer`). Swapping it out
        writes straight from it."""
        r = self._alloc_region(_up(max(nbytes, 1)), key, "buffer")
        return r.u8[:nbytes]

    def free_buffer(self, t):
        """Give back a region from :meth:`buffer` that was not swapped out."""
        with self._cond:
            r = self._region_of(t)
            if r is not None:
                self._unref(r)

    # -- placement ---------------------------------------------------------

    def _place(self, size, key):
        """Pieces [(dir, file offset, tensor offset, length)] for size bytes."""
        if size == 0:
            return []
        n = len(self.dirs)
        ok = [i for i in range(n) if self._space[i].room(ALIGN)]
        if n > 1 and size >= self.stripe_min:
            while ok:
                w = sum(self.weights[i] for i in ok)
                shares = {i: size * self.weights[i] / w // ALIGN * ALIGN for i in ok}
                big = max(ok, key=lambda i: self.weights[i])
                shares[big] += size - sum(shares.values())
                bad = [i for i in ok if shares[i] and not self._space[i].room(int(shares[i]))]
                if not bad:
                    break
                ok = [i for i in ok if i not in bad]
            if ok:
                pieces, toff = [], 0
                for i in ok:
                    ln = int(shares[i])
                    if ln:
                        pieces.append((i, self._space[i].alloc(ln), toff, ln))
                        self._placed[i] += ln
                        toff += ln
                return pieces
        cand = [i for i in range(n) if self._space[i].room(size)]
        if not cand:
            free = ", ".join("%s: %s bytes free" % (self.dirs[i],
                             "?" if self._space[i].limit is None else
                             self._space[i].limit - self._space[i].used) for i in range(n))
            raise SwapError(errno.ENOSPC, "nvio.offload: no room for %d bytes of key %r in "
                            "the swap directories (%s)" % (size, key, free), self.dirs[0], key)
        i = min(cand, key=lambda i: (self._placed[i] + size) / self.weights[i])
        self._placed[i] += size
        return [(i, self._space[i].alloc(size), 0, size)]

    def _grow(self, pieces, key):
        """Preallocate the swap files for pieces, GROW bytes at a time: a write
        that grows a file makes libnvio allocate at submit (so that a full disk
        fails before any byte moves), a few ms per op; growing ahead keeps
        that out of the path of each swap."""
        for d, foff, _, ln in pieces:
            end = foff + ln
            if end <= self._grown[d]:
                continue
            limit = self._space[d].limit
            want = max(end, self._grown[d] + GROW)
            if limit is not None:
                want = max(end, min(want, limit))
            for target in (want, end):
                try:
                    self._files[d].allocate(self._grown[d], target - self._grown[d])
                except OSError as e:
                    if e.errno in (errno.EOPNOTSUPP, errno.EINVAL):
                        self._grown[d] = float("inf")   # no fallocate here: let it grow
                        break
                    if target == end:
                        self._free_pieces(pieces)
                        raise _wrap(e, "swap_out", key) from e
                    continue
                self._grown[d] = target
                break

    def _free_pieces(self, pieces):
        for d, foff, _, ln in pieces:
            self._space[d].free(foff, ln)
            self._placed[d] -= ln

    def _retire(self, e):
        """An entry no key points at any more: free it once unread (lock held)."""
        e.retired = True
        if e.readers == 0:
            self._free_pieces(e.pieces)

    # -- submitting --------------------------------------------------------

    def _ops(self, opcode, pieces, u8, start, stop):
        """Ops moving tensor bytes [start, stop) of a piece list to/from u8
        (u8[0] is tensor byte start)."""
        ops = []
        for d, foff, toff, ln in pieces:
            a, b = max(start, toff), min(stop, toff + ln)
            if a < b:
                ops.append((opcode, self._files[d], u8[a - start:b - start], foff + a - toff))
        return ops

    def _submit(self, ops, done):
        """Submit ops; call done(error or None) once, when all ended (maybe
        on the reaper thread). Returns nothing; never raises for an op that
        libnvio refused: that is the error done() gets."""
        with self._cond:
            self._inflight += 1
        if not ops:
            self._finish(done, None)
            return
        try:
            futs = completions(self._h).submit(ops, refused="future")
        except BaseException as e:  # noqa: BLE001 - a bad argument: nothing in flight
            self._finish(done, e)
            return
        left = [len(futs)]
        first = [None]
        lk = threading.Lock()

        def one(f):
            e = f.exception()
            with lk:
                if e is not None and first[0] is None:
                    first[0] = e
                left[0] -= 1
                last = left[0] == 0
            if last:
                self._finish(done, first[0])
        for f in futs:
            f.add_done_callback(one)

    def _finish(self, done, err):
        with self._cond:
            try:
                done(err)
            finally:
                self._inflight -= 1
                self._cond.notify_all()

    def _check_open(self):
        if self._closed:
            raise ValueError("nvio.offload: the swapper is closed")

    # -- swap out ----------------------------------------------------------

    def swap_out(self, key, tensor, *, async_op=False):
        """Write tensor under key (any dtype, shape, size, device). Returns when
        written, or at once with a future of the key when ``async_op``; the
        caller may change the tensor as soon as the call returns, except a
        contiguous CPU or CUDA tensor bigger than the whole pool, which is
        written straight from its memory (CUDA: through the handle's bounce
        buffers or cuFile) and must stay unchanged until the future
        resolves."""
        if not isinstance(tensor, torch.Tensor):
            raise TypeError("nvio.offload: swap_out(%r) needs a torch.Tensor, not %s"
                            % (key, type(tensor).__name__))
        if tensor.layout != torch.strided or tensor.is_quantized:
            raise TypeError("nvio.offload: swap_out(%r): only dense tensors can be swapped, "
                            "not layout %s" % (key, tensor.layout))
        tensor = tensor.detach()
        nbytes = tensor.numel() * tensor.element_size()
        size = _up(nbytes)
        fut = NvioFuture(key)
        with self._cond:
            self._check_open()
            k = self._keys.get(key)
            while k is not None and k.write is not None:
                self._cond.wait()
                self._check_open()
            src = self._region_of(tensor)
            if src is not None:
                src.refs += 1
        held = None
        if src is not None:
            start = tensor.data_ptr() - src.u8.data_ptr()
            u8 = src.u8[start:start + nbytes]
        elif size <= self.pool_bytes:
            src = self._alloc_region(size, key, "swap_out")
            u8 = src.u8[:nbytes]
            try:
                if nbytes and tensor.is_contiguous() and \
                        _device.is_device(tensor.untyped_storage()):   # CUDA: to the host
                    _device.copy_to_host(u8, tensor.untyped_storage(),
                                         tensor.storage_offset() * tensor.element_size())
                elif nbytes:
                    u8.view(tensor.dtype).view(tensor.shape).copy_(tensor)
            except BaseException:
                with self._cond:
                    self._unref(src)
                raise
        else:
            # host or CUDA memory: written from where it is (libnvio's
            # bounce buffers or cuFile for device memory)
            dev = bool(nbytes) and _device.is_device(tensor.untyped_storage())
            held = tensor_u8(tensor) if tensor.is_contiguous() and \
                (tensor.device.type == "cpu" or dev) else None
            if held is None:
                raise ValueError(
                    "nvio.offload: swap_out of key %r needs %d bytes of pool (the tensor is "
                    "%s), but pool_bytes is %d: make pool_bytes >= %d"
                    % (key, size, "not contiguous" if tensor.device.type == "cpu" or dev
                       else "on " + str(tensor.device), self.pool_bytes, size))
            if dev:
                _device.synchronize([tensor.untyped_storage()])
            u8 = held
        with self._cond:
            try:
                self._check_open()
                k = self._keys.setdefault(key, _Key())
                while k.write is not None:
                    self._cond.wait()
                    self._check_open()
                if k.region is not None and k.region is not src:
                    # resident but not taking the new value: drop it, stale
                    r0, k.region, k.tensor = k.region, None, None
                    self._unref(r0)
                pieces = self._place(size, key)
                self._grow(pieces, key)
            except BaseException:
                if src is not None:
                    self._unref(src)
                raise
            entry = _Entry(nbytes, tensor.dtype, tensor.shape, pieces)
            k.write = fut

        def done(err):
            k.write = None
            if src is not None:
                self._unref(src)
            if err is not None:
                self._free_pieces(pieces)
                e = _wrap(err, "swap_out", key)
                self._errors.append(e)
                fut.set_exception(e)
                return
            if k.entry is not None:
                self._retire(k.entry)
            k.entry = entry
            fut.set_result(key)
        self._submit(self._ops(_nvio.OP_WRITE, pieces, u8, 0, nbytes), done)
        del held
        if async_op:
            return fut
        self._result(fut)
        return None

    def _result(self, fut):
        try:
            return fut.result()
        except SwapError as e:
            with self._cond:
                if e in self._errors:
                    self._errors.remove(e)
            raise

    # -- swap in -----------------------------------------------------------

    def _committed(self, key):
        """The key's state once its pending write ended (lock held)."""
        self._check_open()
        k = self._keys.get(key)
        while k is not None and k.write is not None:
            self._cond.wait()
            self._check_open()
        if k is None or k.entry is None:
            raise KeyError("nvio.offload: key %r was never swapped out to %s"
                           % (key, ", ".join(self.dirs)))
        return k

    def swap_in(self, key, out=None, *, async_op=False):
        """Read key back. Without ``out``: a tensor over a pool region (dtype and
        shape as swapped out), valid until ``release(key)``; with ``out``: read
        into it (same dtype and number of elements; any device) and return
        it. A future of that tensor with ``async_op``."""
        if out is not None:
            return self._swap_in_out(key, out, async_op)
        while True:
            with self._cond:
                k = self._committed(key)
                fut = None
                if k.region is not None:
                    fut = k.read
                    if fut is None:
                        fut = NvioFuture(key)
                        fut.set_result(k.tensor)
                else:
                    e = k.entry
                    r = self._alloc_region(_up(max(e.nbytes, 1)), key, "swap_in")
                    # the pool may have waited: the key may have changed meanwhile
                    if self._keys.get(key) is not k or k.entry is not e or \
                            k.region is not None or k.write is not None:
                        self._unref(r)
                        continue
                    t = r.u8[:e.nbytes].view(e.dtype).view(e.shape) if e.nbytes else \
                        torch.empty(e.shape, dtype=e.dtype)
                    fut = NvioFuture(key)
                    k.region, k.tensor, k.read = r, t, fut
                    r.refs += 1                  # the read's
                    e.readers += 1
                    break
            # resident: wait (never holding the lock) for the read filling it
            return fut if async_op else self._result(fut)

        def done(err):
            e.readers -= 1
            if e.retired and e.readers == 0:
                self._free_pieces(e.pieces)
            self._unref(r)
            if k.read is fut:
                k.read = None
            if err is not None:
                if k.region is r:
                    k.region = k.tensor = None
                    self._unref(r)
                ex = _wrap(err, "swap_in", key)
                self._errors.append(ex)
                fut.set_exception(ex)
            else:
                fut.set_result(t)
        self._submit(self._ops(_nvio.OP_READ, e.pieces, r.u8, 0, e.nbytes), done)
        return fut if async_op else self._result(fut)

    def _swap_in_out(self, key, out, async_op):
        if not isinstance(out, torch.Tensor):
            raise TypeError("nvio.offload: out must be a torch.Tensor")
        with self._cond:
            k = self._committed(key)
            e = k.entry
            if out.dtype != e.dtype or out.numel() != numel(e.shape):
                raise ValueError("nvio.offload: key %r holds %s %s; out is %s %s"
                                 % (key, _dtype_name(e.dtype), list(e.shape),
                                    _dtype_name(out.dtype), list(out.shape)))
            rr = k.region
            if rr is not None:              # in the pool: copy it from there
                rr.refs += 1
                resident, rfut = k.tensor, k.read
            else:
                e.readers += 1
        if rr is not None:
            try:
                if rfut is not None:
                    self._result(rfut)
                if out.numel() and out.is_contiguous() and \
                        _device.is_device(out.untyped_storage()):
                    _device.copy_to_device(tensor_u8(out), tensor_u8(resident))
                else:
                    out.copy_(resident.view(out.shape))
            finally:
                with self._cond:
                    self._unref(rr)
            fut = NvioFuture(key)
            fut.set_result(out)
            return fut if async_op else out
        direct = tensor_u8(out) if out.is_contiguous() else None
        if direct is not None and direct.numel() and _device.is_device(out.untyped_storage()):
            _device.synchronize([out.untyped_storage()])    # torch's work on out ended
        r = None
        if direct is None:
            try:
                r = self._alloc_region(_up(max(e.nbytes, 1)), key, "swap_in")
            except BaseException:
                with self._cond:
                    e.readers -= 1
                    if e.retired and e.readers == 0:
                        self._free_pieces(e.pieces)
                raise
            dst = r.u8[:e.nbytes]
        else:
            dst = direct
        fut = NvioFuture(key)

        def done(err):
            e.readers -= 1
            if e.retired and e.readers == 0:
                self._free_pieces(e.pieces)
            try:
                if err is None and r is not None:
                    out.copy_(dst.view(e.dtype).view(out.shape))
            except BaseException as x:  # noqa: BLE001 - to the future
                err = x
            if r is not None:
                self._unref(r)
            if err is not None:
                ex = _wrap(err, "swap_in", key)
                self._errors.append(ex)
                fut.set_exception(ex)
            else:
                fut.set_result(out)
        self._submit(self._ops(_nvio.OP_READ, e.pieces, dst, 0, e.nbytes), done)
        return fut if async_op else self._result(fut)

    def prefetch(self, keys):
        """Start swap_in of each key (without out) that is not in the pool yet;
        returns their futures. swap_in(key) then waits for it."""
        return [self.swap_in(k, async_op=True) for k in keys]

    def release(self, key):
        """Give back the pool region of a swapped-in key (after its read, if
        one is pending). Tensors from swap_in(key) must not be used after."""
        with self._cond:
            k = self._keys.get(key)
            if k is None or k.region is None:
                return False
            r = k.region
            k.region = k.tensor = None
            self._unref(r)
            return True

    def discard(self, key):
        """Forget a key: its file space is freed (once pending ops end)."""
        with self._cond:
            k = self._keys.get(key)
            while k is not None and k.write is not None:
                self._cond.wait()
            if k is None:
                return False
            self.release(key)
            if k.entry is not None:
                self._retire(k.entry)
            del self._keys[key]
            return True

    # -- bulk and state ----------------------------------------------------

    def __contains__(self, key):
        with self._cond:
            k = self._keys.get(key)
            return k is not None and (k.entry is not None or k.write is not None)

    def keys(self):
        with self._cond:
            return [key for key, k in self._keys.items()
                    if k.entry is not None or k.write is not None]

    def info(self, key):
        """(dtype, shape, nbytes) of a key's committed value."""
        with self._cond:
            e = self._committed(key).entry
            return e.dtype, e.shape, e.nbytes

    def resident(self, key):
        """The tensor of a swapped-in key, or None."""
        with self._cond:
            k = self._keys.get(key)
            return None if k is None else k.tensor

    def read_range(self, key, start, dst):
        """Read bytes [start, start + len(dst)) of key's value into the uint8
        tensor dst (any memory); for streaming a key through a smaller buffer."""
        with self._cond:
            e = self._committed(key).entry
            stop = start + dst.numel()
            if start < 0 or stop > e.nbytes:
                raise ValueError("nvio.offload: bytes [%d, %d) of key %r: it has %d"
                                 % (start, stop, key, e.nbytes))
            e.readers += 1
        fut = NvioFuture(key)

        def done(err):
            e.readers -= 1
            if e.retired and e.readers == 0:
                self._free_pieces(e.pieces)
            if err is not None:
                fut.set_exception(_wrap(err, "read_range", key))
            else:
                fut.set_result(dst)
        self._submit(self._ops(_nvio.OP_READ, e.pieces, dst, start, stop), done)
        return fut.result()

    def _reserve(self, key, dtype, shape, nbytes):
        """Place an entry for key and return (entry, k) without data yet (lock held)."""
        pieces = self._place(_up(nbytes), key)
        self._grow(pieces, key)
        return _Entry(nbytes, dtype, shape, pieces)

    def _write_range(self, entry, start, src, key):
        fut = NvioFuture(key)

        def done(err):
            if err is not None:
                fut.set_exception(_wrap(err, "restore", key))
            else:
                fut.set_result(None)
        self._submit(self._ops(_nvio.OP_WRITE, entry.pieces, src, start,
                               start + src.numel()), done)
        fut.result()

    def wait(self):
        """Wait until no op is in flight; raise the first error of an async op
        since the last wait() (its future carries it too)."""
        with self._cond:
            while self._inflight:
                self._cond.wait()
            errs, self._errors = self._errors, []
        if errs:
            raise errs[0]

    @property
    def bytes_on_disk(self):
        """Bytes of swap file space in use, per directory."""
        with self._cond:
            return [s.used for s in self._space]

    def close(self):
        """Wait for ops in flight, close (and so delete) the swap files, free the pool."""
        with self._cond:
            if self._closed:
                return
            while self._inflight:
                self._cond.wait()
            self._closed = True
            self._cond.notify_all()
        self._close_files()
        if self._own_handle:
            self._h.close()
        self._keys.clear()
        self._regions.clear()
        self._pool_u8 = None
        self._pool = None
        _live.discard(self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            if not self._closed:
                self.close()
        except Exception:   # noqa: BLE001
            pass

    # -- checkpoint --------------------------------------------------------

    def checkpoint(self, path, *, chunk_bytes=None):
        """Write every key's committed value to directory ``path`` (made if
        missing): ``data.bin`` then ``index.json`` (format 2: each key's
        dtype, shape, size, offset and CRC-32, and the CRC-32 of all those
        fields), each replacing an old one
        atomically; memory: one pool region of ``chunk_bytes`` (default: the
        pool, at most 64 MiB). :meth:`restore` reads it back."""
        self.wait()
        path = os.fsdecode(path)
        os.makedirs(path, exist_ok=True)
        chunk = _up(min(chunk_bytes or self.pool_bytes, 64 << 20, self.pool_bytes) or ALIGN)
        with self._cond:
            items = [(key, k.entry) for key, k in self._keys.items() if k.entry is not None]
            for _, e in items:
                e.readers += 1
        index, off = [], 0
        try:
            with self._h.open(os.path.join(path, _DATA), _nvio.FILE_ATOMIC) as f:
                r = self._alloc_region(chunk, "<checkpoint>", "checkpoint")
                try:
                    for key, e in items:
                        crc = 0
                        for a in range(0, e.nbytes, chunk):
                            n = min(chunk, e.nbytes - a)
                            self.read_range(key, a, r.u8[:n])
                            crc = _nvio.crc32(r.u8[:n], crc)
                            f.pwrite(r.u8[:n], off + a)
                        index.append({"key": _enc_key(key), "dtype": _dtype_name(e.dtype),
                                      "shape": list(e.shape), "nbytes": e.nbytes,
                                      "offset": off, "crc32": crc})
                        off += _up(e.nbytes)
                finally:
                    with self._cond:
                        self._unref(r)
                f.commit()
        finally:
            with self._cond:
                for _, e in items:
                    e.readers -= 1
                    if e.retired and e.readers == 0:
                        self._free_pieces(e.pieces)
        tmp = os.path.join(path, ".%s.tmp" % _INDEX)
        with _trust.open_regular(tmp, "w", _ck_error) as fp:
            json.dump({"format": _FORMAT, "keys": index, "crc32": _index_crc(index)}, fp)
            fp.flush()
            os.fsync(fp.fileno())
        os.replace(tmp, os.path.join(path, _INDEX))
        dfd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return len(index)

    @classmethod
    def restore(cls, path, dirs, pool_bytes=256 << 20, **kwargs):
        """A new Swapper over ``dirs`` holding what :meth:`checkpoint` wrote to
        ``path`` (copied in pool-sized pieces; the checkpoint stays).

        The index is checked completely before anything is allocated by it
        (every field of every key: dtypes from a table, shapes, sizes,
        offsets inside the data file, no two keys' bytes overlapping), then
        against the index's own CRC-32 (where it has one), and each key's
        bytes against the CRC-32 the index holds (checkpoints of format 1,
        without CRCs, are read unchecked). A failed check raises
        :class:`SwapCorruptError` naming the file and the field or key."""
        path = os.fsdecode(path)
        ipath = os.path.join(path, _INDEX)
        dpath = os.path.join(path, _DATA)
        try:
            raw = _trust.read_index(ipath, _ck_error)
            meta = json.loads(raw)
        except (OSError, ValueError, RecursionError) as e:
            if isinstance(e, SwapError):
                raise
            raise SwapError(getattr(e, "errno", None) or errno.EINVAL,
                            "nvio.offload: %s is no swapper checkpoint: %s" % (ipath, e),
                            ipath) from e
        _trust.check_regular(dpath, _ck_error)
        try:
            size = os.stat(dpath).st_size
        except OSError as e:
            raise SwapError(e.errno, "nvio.offload: the data file of checkpoint %s: %s"
                            % (path, e.strerror), dpath) from e
        keys = _check_index(meta, ipath, dpath, size)
        sw = cls(dirs, pool_bytes, **kwargs)
        try:
            chunk = _up(min(sw.pool_bytes, 64 << 20) or ALIGN)
            r = sw._alloc_region(chunk, "<restore>", "restore")
            with sw._h.open(dpath, _nvio.FILE_READ) as f:
                for key, dtype, shape, nb, off, want in keys:
                    with sw._cond:
                        e = sw._reserve(key, dtype, shape, nb)
                    crc = 0
                    for a in range(0, e.nbytes, chunk):
                        n = min(chunk, e.nbytes - a)
                        f.pread(r.u8[:n], off + a)
                        if want is not None:
                            crc = _nvio.crc32(r.u8[:n], crc)
                        sw._write_range(e, a, r.u8[:n], key)
                    if want is not None and crc != want:
                        raise SwapCorruptError(
                            errno.EBADMSG, "nvio.offload: %s: the %d bytes of key %r at offset "
                            "%d have CRC-32 %08x, the index %s says %08x: the checkpoint is "
                            "damaged" % (dpath, nb, key, off, crc, ipath, want),
                            dpath, key, off)
                    with sw._cond:
                        sw._keys.setdefault(key, _Key()).entry = e
            with sw._cond:
                sw._unref(r)
        except BaseException:
            sw.close()
            raise
        return sw


def _ck_error(msg, field=None):
    return SwapCorruptError(errno.EINVAL, "nvio.offload: " + msg, field=field)


def _check_index(meta, ipath, dpath, size):
    """[(key, dtype, shape, nbytes, offset, crc32 or None)] from a parsed
    index, every field checked against what checkpoint() writes."""
    def err(msg, field=None):
        return SwapCorruptError(errno.EINVAL, "nvio.offload: " + msg, ipath, field=field)
    F = _trust.Fields(ipath, err)
    F.dict(meta, "", ("format", "keys"), ("crc32",))
    fmt = F.int(meta["format"], "format", 1, _FORMAT)
    items = F.list(meta["keys"], "keys", limit=_KEYS_MAX)
    fields = ("key", "dtype", "shape", "nbytes", "offset") + (("crc32",) if fmt >= 2 else ())
    out, seen, ranges = [], set(), []
    for i, it in enumerate(items):
        at = "keys[%d]" % i
        F.dict(it, at, fields)
        key = _dec_key_checked(F, it["key"], at + ".key", 0)
        if key in seen:
            F.fail(at + ".key", "key %r is listed twice" % (key,))
        seen.add(key)
        dtype = F.dtype(it["dtype"], at + ".dtype")
        shape = F.shape(it["shape"], at + ".shape")
        nb = F.int(it["nbytes"], at + ".nbytes")
        if nb != _trust.nbytes(dtype, shape):
            F.fail(at + ".nbytes", "%d, but %s %s holds %d bytes"
                   % (nb, _dtype_name(dtype), list(shape), _trust.nbytes(dtype, shape)))
        off = F.int(it["offset"], at + ".offset", multiple=ALIGN)
        if nb and off + nb > size:
            raise SwapCorruptError(errno.ENODATA, "nvio.offload: %s is truncated: key %r "
                                   "(%s.offset) needs bytes up to %d, the file has %d"
                                   % (dpath, key, at, off + nb, size), dpath, key, off,
                                   field=at + ".offset")
        crc = F.crc(it["crc32"], at + ".crc32") if fmt >= 2 else None
        ranges.append((off, off + nb, i))
        out.append((key, dtype, shape, nb, off, crc))
    _trust.no_overlap(F, ranges, lambda i: "keys[%d].offset" % i)
    if "crc32" in meta:             # last: a field out of bounds is named first
        if fmt < 2:
            F.fail("crc32", "is not a field of format %d" % fmt)
        want, got = F.crc(meta["crc32"], "crc32"), _index_crc(items)
        if got != want:
            F.fail("crc32", "the keys' fields have CRC-32 %08x, the index says %08x: a "
                   "dtype, shape, key or offset was changed" % (got, want))
    return out


def _index_crc(keys):
    """CRC-32 of an index's keys (their canonical JSON): a changed dtype,
    shape or name that keeps every field plausible (float32 read as int32)
    fails it. Optional in format 2 (the first of its files lack it)."""
    return _nvio.crc32(json.dumps(keys, sort_keys=True, separators=(",", ":")).encode())


def _dec_key_checked(F, d, field, depth):
    """_dec_key of an index's key, refusing anything _enc_key does not write."""
    if depth > _trust.KEY_DEPTH_MAX:
        F.fail(field, "tuples nested more than %d deep" % _trust.KEY_DEPTH_MAX)
    if not isinstance(d, dict) or len(d) != 1 or next(iter(d)) not in ("s", "i", "t"):
        F.fail(field, "must be {\"s\": str}, {\"i\": int} or {\"t\": [keys]}, not %r"
               % (d,))
    tag, v = next(iter(d.items()))
    if tag == "s":
        return F.str(v, field + ".s")
    if tag == "i":
        if not _trust.is_int(v):
            F.fail(field + ".i", "must be an integer, not %r" % (v,))
        return v
    F.list(v, field + ".t")
    return tuple(_dec_key_checked(F, k, "%s.t[%d]" % (field, j), depth + 1)
                 for j, k in enumerate(v))


def _enc_key(key):
    if isinstance(key, bool) or not isinstance(key, (str, int, tuple)):
        raise TypeError("nvio.offload: checkpoint() needs keys of str, int or tuples of "
                        "them, not %r" % (key,))
    if isinstance(key, tuple):
        return {"t": [_enc_key(k) for k in key]}
    return {"s": key} if isinstance(key, str) else {"i": key}


def _free_bytes(d):
    try:
        st = os.statvfs(d)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize
