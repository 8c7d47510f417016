"""nvio.async_save: snapshot now, write in the background, a future for the end.

``async_save`` pickles the object and copies every storage into a buffer of
page-locked memory laid out exactly as the file will be (each record's data
at its aligned offset; CUDA storages by a device-to-host copy,
``nvio._device.copy_to_host``); then it returns an :class:`nvio.NvioFuture`, and the
caller may change or free its tensors at once. A writer thread then
checksums the image and fills in the descriptors and directory window by
window, each window written with O_DIRECT as soon as it is complete
(``_base.plan.write_images``), into an ATOMIC file, commits it (durable unless
``durable=False``) and resolves the future with the file's size, or with
the error. Saves are written one after another, in call order.

The snapshot buffers form a pool that is reused by later saves: memory is
allocated once for a state of a given size. ``pool_bytes`` bounds it; a save
that does not fit waits for earlier saves to release their buffers (and is
refused, with the sizes, when it could never fit).

At interpreter exit pending saves are waited for (``on_exit="wait"``, the
default) or abandoned (``"abandon"``: each is closed without a commit, so
the destinations keep their old content and no temporary is left).
"""
from __future__ import annotations

import atexit
import collections
import concurrent.futures
import errno
import os
import threading
import weakref

import torch

from .. import _device, _nvio
from .._base.handle import default_handle
from .._base.plan import DEFAULT_ALIGN, Plan, gc_paused, write_image
from .._base.space import open_atomic, reserve_space
from .._futures import NvioFuture

__all__ = ["AsyncCheckpointer", "async_save", "default_checkpointer"]

_ROUND = 2 << 20        # pool buffers are sized in multiples of this


#: A snapshot of at least this many bytes of host storages is copied by
#: several threads (torch's copy releases the GIL): one core's memcpy would
#: bound how soon async_save returns.
PARALLEL_COPY_MIN = 64 << 20
#: The pieces the copy is cut into, taken by the threads in turn.
COPY_CHUNK = 16 << 20

_copier = None
_copier_lock = threading.Lock()


def _copy_threads():
    """Helper threads for snapshots (the caller copies too): one less than
    the CPUs this process may use, at most 7."""
    global _copier
    with _copier_lock:
        if _copier is None:
            try:
                cpus = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                cpus = os.cpu_count() or 1
            n = max(0, min(7, cpus - 1))
            _copier = concurrent.futures.ThreadPoolExecutor(
                max_workers=n, thread_name_prefix="nvio-snapshot") if n else False
        return _copier


def _forget_copier_after_fork():
    global _copier, _copier_lock
    _copier = None              # its threads did not survive the fork
    _copier_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_copier_after_fork)


def _snapshot(dst, data):
    """Copy every storage into its record's place in dst. Device storages
    come over through nvio._device on the calling thread; CPU storages are
    copied by ``_nvio.copy_many`` (memcpy in C, the GIL released: no torch
    call per tensor), those of a large state cut into COPY_CHUNK pieces
    dealt in file order to the caller and the helper threads, about equal
    bytes each."""
    base, size = dst.data_ptr() if dst is not None else 0, dst.numel() if dst is not None else 0
    jobs = []               # (dst address, src address, nbytes), at most COPY_CHUNK each
    total = 0
    for r, s in data:
        if not r.size:
            continue
        if r.end > size or s.nbytes() < r.size:
            raise ValueError("nvio.async_save: record %s (%d bytes at %d) does not fit the "
                             "snapshot (%d bytes) or its storage (%d bytes)"
                             % (r.name, r.size, r.data_offset, size, s.nbytes()))
        if _device.is_device(s) or s.device.type != "cpu":
            _device.copy_to_host(dst[r.data_offset:r.end], s)
            continue
        at, src = base + r.data_offset, s.data_ptr()
        for off in range(0, r.size, COPY_CHUNK):
            jobs.append((at + off, src + off, min(COPY_CHUNK, r.size - off)))
        total += r.size
    pool = _copy_threads() if total >= PARALLEL_COPY_MIN else False
    ways = min(pool._max_workers + 1, max(1, total // COPY_CHUNK)) if pool else 1
    if ways <= 1:
        _nvio.copy_many(jobs)
        return
    share = -(-total // ways)
    batches = []
    start = acc = 0
    for j, job in enumerate(jobs):
        acc += job[2]
        if acc >= share * (len(batches) + 1) or j == len(jobs) - 1:
            batches.append(jobs[start:j + 1])
            start = j + 1
    futs = [pool.submit(_nvio.copy_many, b) for b in batches[1:]]
    try:
        _nvio.copy_many(batches[0])
    finally:
        for f in futs:          # every thread is done with dst before we go on
            f.exception()
    for f in futs:
        f.result()


class _Abandoned(Exception):
    pass


class AsyncCheckpointer:
    """Asynchronous, crash-safe checkpoint saves with a reusable snapshot pool.

    ``pool_bytes``: most bytes of snapshot memory to keep (None: as much as
    the saves in flight need). ``handle``: the :class:`nvio.AioHandle` to
    write with (default: nvio's checkpoint handle). ``on_exit``: "wait" or
    "abandon" (what interpreter exit does with saves not yet written).
    """

    def __init__(self, *, pool_bytes=None, handle=None, on_exit="wait"):
        if on_exit not in ("wait", "abandon"):
            raise ValueError("nvio: on_exit must be 'wait' or 'abandon', not %r" % (on_exit,))
        if pool_bytes is not None and pool_bytes <= 0:
            raise ValueError("nvio: pool_bytes must be > 0 or None, not %r" % (pool_bytes,))
        self.pool_bytes = pool_bytes
        self.on_exit = on_exit
        self._handle = handle
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._free = []             # LockedBuffers not in use
        self._held = 0              # bytes of all pool buffers
        self._queue = collections.deque()
        self._busy = 0              # jobs queued or being written
        self._current = None        # the future of the job being written
        self._thread = None
        self._abandon = False
        self._closed = False
        _all.add(self)

    # -- the caller's side ----------------------------------------------------

    def save(self, obj, path, *, durable=True, align=DEFAULT_ALIGN, pickle_protocol=2,
             spare=False):
        """Snapshot ``obj`` and queue its write to ``path``; a future of the
        file's size in bytes (or of the error, which names the path).
        ``spare``: as :func:`nvio.save`'s."""
        durable = _nvio.check_flag(durable, "durable")
        spare = _nvio.check_flag(spare, "spare")
        # resolved now: the write may start after a chdir
        path = os.path.abspath(os.fspath(path))
        # no cyclic collection while the plan's objects are made and the
        # state copied (for 50,000 tensors, 0.2 s of collections walking the
        # records and the caller's tensors inside the call), as nvio.save;
        # but on while _acquire may wait for earlier saves (the collector is
        # the whole process's)
        with gc_paused():
            plan = Plan(obj, path, align, pickle_protocol)
        buf = self._acquire(plan.size)
        with gc_paused():
            try:
                dst = torch.frombuffer(buf, dtype=torch.uint8, count=plan.size) \
                    if plan.size else None
                _snapshot(dst, plan.data)
                del dst
            except BaseException:
                self._release(buf)
                raise
            # the write needs the records only: the caller's tensors may go now
            plan.data = [(r, None) for r, _ in plan.data]
            plan.storages = {}
        fut = NvioFuture(path)
        with self._lock:
            closed = self._closed
            if not closed:
                self._queue.append((plan, buf, path, (durable, spare), fut))
                self._busy += 1
            if not closed and self._thread is None:
                self._thread = threading.Thread(target=self._run, name="nvio-ckpt-writer",
                                                daemon=True)
                self._thread.start()
            self._cond.notify_all()
        if closed:
            self._release(buf)
            raise ValueError("nvio: save on a closed AsyncCheckpointer")
        return fut

    @property
    def pending(self):
        """Saves queued or being written."""
        with self._lock:
            return self._busy

    def wait(self, timeout=None):
        """Wait until every queued save has ended; False on timeout. Not
        from a save's done-callback (it runs on the writer, which would
        wait for itself): that raises RuntimeError."""
        self._not_on_writer("wait()")
        with self._lock:
            return self._cond.wait_for(lambda: self._busy == 0, timeout)

    def close(self, abandon=False):
        """Finish (or with ``abandon=True`` drop) pending saves, stop the
        writer and free the pool. Idempotent."""
        with self._lock:
            self._closed = True
            if abandon:
                self._abandon = True
            self._cond.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
        with self._lock:
            self._free.clear()
            self._held = 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def _not_on_writer(self, what):
        if threading.current_thread() is self._thread:
            raise RuntimeError("nvio.async_save: %s in a save's done-callback would wait "
                               "for the writer thread it runs on" % what)

    # -- the pool -------------------------------------------------------------

    def _acquire(self, n):
        need = max(_ROUND, -(-n // _ROUND) * _ROUND)
        with self._lock:
            while True:
                fits = [b for b in self._free if len(b) >= n]
                if fits:
                    b = min(fits, key=len)
                    self._free.remove(b)
                    return b
                cap = self.pool_bytes
                if cap is None or self._held + need <= cap:
                    break
                if self._free:          # too small to use: make room
                    self._held -= len(self._free.pop())
                    continue
                # nothing in use (after freeing the idle ones) will ever
                # come back: waiting cannot help
                if need > cap or self._held == 0:
                    raise ValueError(
                        "nvio.async_save: the snapshot needs %d bytes but the pool is "
                        "limited to %d (pool_bytes); raise pool_bytes or save synchronously "
                        "with nvio.save" % (need, cap))
                self._not_on_writer("a save that waits for pool memory")
                self._cond.wait()        # for an earlier save to release its buffer
            self._held += need
        try:
            return _nvio.LockedBuffer(need)
        except BaseException:
            with self._lock:
                self._held -= need
            raise

    def _release(self, buf):
        with self._lock:
            if self._closed:
                self._held -= len(buf)
            else:
                self._free.append(buf)
            self._cond.notify_all()

    # -- the writer thread ----------------------------------------------------

    def _run(self):
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    self._thread = None
                    return
                job = self._queue.popleft()
                self._current = job[4]
            plan, buf, path, (durable, spare), fut = job
            del job
            err = size = None
            try:
                size = self._write(plan, buf, path, durable, spare)
            except BaseException as e:  # noqa: BLE001 - it goes to the future
                err = e
                if isinstance(e, _Abandoned):
                    err = _nvio.NvioError(errno.ECANCELED,
                                          "nvio.async_save: abandoned at exit before it "
                                          "was written; %s is unchanged" % path, path)
            # the buffer first: a done-callback may queue the next save
            self._release(buf)
            del plan, buf
            try:
                if err is None:
                    fut.set_result(size)
                else:
                    fut.set_exception(err)
            finally:
                with self._lock:
                    self._busy -= 1
                    self._current = None
                    self._cond.notify_all()
            del fut, err

    def _check(self):
        if self._abandon:
            raise _Abandoned()

    def _write(self, plan, buf, path, durable, spare):
        self._check()
        h = self._handle
        if h is None:
            h = default_handle()
        with open_atomic(h, path, durable, spare) as f:
            reserve_space(f, plan.size)
            write_image(plan, f, buf.address, WRITE_WINDOW, buf, self._check)
            self._check()
            f.commit()
        return plan.size


#: The snapshot is written WRITE_WINDOW bytes at a time, in file order: a
#: window's tensor bytes are checksummed, its descriptors (and at the end
#: the directory) filled in, its write started, and the next window is
#: checksummed while it runs (``write_image``).
WRITE_WINDOW = 64 << 20


_all = weakref.WeakSet()
_default = None
_default_lock = threading.Lock()


def default_checkpointer():
    """The AsyncCheckpointer that :func:`async_save` uses."""
    global _default
    with _default_lock:
        if _default is None:
            _default = AsyncCheckpointer()
        return _default


def async_save(obj, path, *, durable=True, align=DEFAULT_ALIGN, pickle_protocol=2,
               spare=False):
    """Save like :func:`nvio.save`, in the background: returns a future once
    the state is copied (the caller may then change its tensors); the
    future's result is the file's size once it is in place (durably unless
    ``durable=False``). Saves are written in call order; interpreter exit
    waits for them (see :class:`AsyncCheckpointer` to change that or to
    bound the snapshot memory). ``spare=True``: write into the previous
    version's blocks, as :func:`nvio.save`'s ``spare``."""
    return default_checkpointer().save(obj, path, durable=durable, align=align,
                                       pickle_protocol=pickle_protocol, spare=spare)


@atexit.register
def _at_exit():
    for c in list(_all):
        c.close(abandon=c.on_exit == "abandon")


def _after_fork_in_child():
    """The writer thread did not survive fork; the parent's queued saves are
    the parent's to write: fail their futures here, start afresh."""
    global _default_lock
    _default_lock = threading.Lock()
    for c in list(_all):
        c._lock = threading.Lock()
        c._cond = threading.Condition(c._lock)
        left = [job[4] for job in c._queue]
        if c._current is not None:     # the one being written when it forked
            left.append(c._current)
        c._current = None
        c._queue.clear()
        c._busy = 0
        c._thread = None
        c._free = []
        c._held = 0
        for fut in left:
            try:
                fut.set_exception(_nvio.NvioError(
                    errno.ECHILD, "nvio.async_save: queued in the parent process "
                    "before fork; the parent writes it", fut.user_data))
            except Exception:   # noqa: BLE001 - its lock was held at fork
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
