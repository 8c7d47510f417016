"""Completions -> futures: the one place where nvio's async results become futures.

Every Python module that does asynchronous I/O with nvio goes through
:class:`Completions`: it submits tagged ops to a completion queue of its
own (``Handle.queue()``, libnvio's ``nvio_queue``) and resolves an
:class:`NvioFuture` per op from ONE reaper thread per handle (started on
the first submit; it blocks in ``Queue.reap`` with the GIL released, at
most ``POLL_S`` at a time so that it notices a shutdown, and stops when
the handle closes). No thread per op.

``done()`` on a future whose op is still pending takes what has ended
from the queue itself, on the calling thread, without waiting (a reap
with min 0, which keeps the GIL), and resolves those futures there. A
thread that polls ``done()`` thus sees an ended op at once, even while
the reaper cannot get the GIL: a thread that releases and retakes it
every few microseconds (a system call per item in a loop) keeps a
waiting thread from ever getting it (the futures of ended writes were
resolved 30-100 ms late in a DCP save whose layout made a getrandom call
per item, since removed). Callbacks stay the reaper's: while any pending
future of the handle has one (``add_done_callback``, ``await``), done()
does not reap, so that no callback ever runs on a thread that merely
asked, perhaps holding a lock the callback takes.

A future's result is the number of bytes the op moved; a failed op's
future carries the original :class:`nvio.NvioError` (errno, filename,
offset, op). Futures are ``concurrent.futures.Future`` objects (so
``concurrent.futures.wait`` / ``as_completed`` work) and awaitable
(``await fut`` inside asyncio).

Tagged ops are not seen by ``nvio_wait()``: ``AioHandle.wait()`` and
``pending()`` neither wait for nor count them. The futures' queue is
nobody else's: ``Handle.submit``/``Handle.reap`` (the handle's default
queue) and blocking calls (a private queue each) never see the futures'
completions, and the reaper never sees theirs.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import os
import threading
import weakref

from . import _nvio

__all__ = ["NvioFuture", "Completions", "completions", "POLL_S"]

#: Longest time the reaper blocks in one reap() call, in seconds.
POLL_S = 0.2
#: Most completions one reap() call returns.
REAP_MAX = 256

#: ``Future.done`` without NvioFuture.done's reap.
resolved = concurrent.futures.Future.done


class NvioFuture(concurrent.futures.Future):
    """The future of one nvio op: ``result()`` is the bytes moved.

    ``user_data`` is what the op was submitted with (None for the helpers).
    Awaitable: ``await fut`` in a coroutine.
    """

    def __init__(self, user_data=None):
        super().__init__()
        self.user_data = user_data
        self._owner = None      # the Completions of an op's future
        self._counted = False   # in its owner's count of futures with callbacks
        # The op runs from submit on: like an executor's running future it
        # cannot be cancelled (cancel() returns False), and the reaper never
        # meets a cancelled future it would have to resolve.
        self.set_running_or_notify_cancel()

    def done(self):
        """True once resolved. An op's pending future first resolves every
        future whose op has ended (on this thread, without waiting), unless
        a pending future of the handle has callbacks (they run on the
        reaper)."""
        if super().done():
            return True
        c = self._owner
        if c is None:
            return False
        c.poll()
        return super().done()

    def add_done_callback(self, fn):
        c = self._owner
        if c is not None:
            with c._lock:       # against _resolve's uncount: never counted once resolved
                if not self._counted and not resolved(self):
                    self._counted = True
                    c._with_callbacks += 1
        super().add_done_callback(fn)

    def __await__(self):
        return asyncio.wrap_future(self).__await__()


class Completions:
    """Submits tagged ops on one handle and resolves their futures.

    Made once per handle (:func:`completions`); thread safe.
    """

    def __init__(self, handle):
        self._handle = weakref.ref(handle)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)   # pending became empty
        self._work = threading.Condition(self._lock)   # pending became non-empty
        # The futures of the ops in flight. Queue.submit adds an accepted
        # op's future in C (the future is the op's user_data), so no
        # exception can come between an op's acceptance and its entry
        # here; the reaper takes it out once the future is resolved.
        self._pending = set()
        self._queue = None     # the handle's Queue for futures, made on first submit
        self._thread = None
        self._stop = False
        self._forked = False
        self._with_callbacks = 0    # pending futures with callbacks: no poll()
        _all.add(self)

    # -- submitting -------------------------------------------------------

    def submit(self, ops, *, refused="raise"):
        """Submit ops, each ``(opcode, file, buf, offset[, user_data[, flags[,
        crc32]]])`` as for ``Handle.submit``; returns one future per op, in
        order.

        ``refused="raise"``: an op libnvio refuses at submit (bad argument,
        read past the end, ENOSPC when growing) raises its NvioError; the
        ops before it are in flight and their futures are dropped from the
        error's ``futures`` attribute. ``refused="future"``: the refused op's
        future fails with that error and the rest are still submitted.
        """
        if refused not in ("raise", "future"):
            raise ValueError("nvio: refused must be 'raise' or 'future'")
        if self._forked:
            raise _forked_error()
        h = self._handle()
        if h is None or h.closed:
            raise ValueError("nvio: I/O operation on a closed handle")
        futs, tagged = [], []
        for op in ops:
            op = tuple(op)
            if not 4 <= len(op) <= 7:
                raise TypeError("nvio: an op is (opcode, file, buf, offset"
                                "[, user_data[, flags[, crc32]]])")
            fut = NvioFuture(op[4] if len(op) > 4 else None)
            fut._owner = self
            flags = op[5] if len(op) > 5 else 0
            futs.append(fut)
            tagged.append((op[0], op[1], op[2], op[3], fut, flags) + op[6:])
        i = 0
        while i < len(tagged):
            with self._lock:
                if self._stop:
                    raise ValueError("nvio: I/O operation on a closed handle")
                self._start_locked()
            try:
                n = self._queue_of(h).submit(tagged[i:], pending=self._pending)
            except BaseException as e:
                n, err = 0, e
            else:
                err = None
            with self._lock:
                if self._pending:
                    # a close() that raced this submit may have stopped the
                    # reaper: the ops just accepted still get one
                    self._start_locked()
                    self._work.notify()
                else:
                    self._idle.notify_all()
            i += n
            if err is not None:
                # Only an NvioError is op i's refusal; a TypeError or
                # ValueError may be about any op of the batch: raise it.
                if refused == "raise" or not isinstance(err, _nvio.NvioError):
                    err.futures = futs[:i]
                    raise err
                futs[i].set_exception(err)
                i += 1
        return futs

    def _queue_of(self, h):
        """This layer's queue on handle h (made once; closed with h)."""
        with self._lock:
            if self._queue is None:
                self._queue = h.queue()
            return self._queue

    # -- the reaper -------------------------------------------------------

    def _start_locked(self):
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="nvio-reaper",
                                            daemon=True)
            self._thread.start()

    def _run(self):
        try:
            self._loop()
        except BaseException as e:     # never leave futures unresolved
            self._fail_pending("nvio: the reaper stopped: %r" % (e,))
            raise

    def _loop(self):
        while True:
            with self._lock:
                # Idle: sleep without holding the handle (it may be collected).
                while not self._pending and not self._stop:
                    self._work.wait(POLL_S)
                    if self._handle() is None:
                        self._thread = None
                        return
                if self._stop and not self._pending:
                    self._thread = None    # a racing submit starts another
                    return
            h = self._handle()
            q = self._queue
            if h is None or h.closed or q is None or q.closed:
                self._fail_pending("nvio: the handle was closed before the op was reaped")
                return
            try:
                # min 1 is capped in C at the ops in flight: with none (a
                # submit between its pending entry and nvio_submit) this
                # returns at once, and the loop comes back here. h is held
                # meanwhile: the queue lives in it.
                done = q.reap(REAP_MAX, 1, POLL_S)
            except Exception as e:     # the handle closed under us
                del h, q
                self._fail_pending("nvio: reaping failed: %s" % e)
                return
            del h, q
            self._resolve(done)
            # Idle, the reaper must not keep the last future alive: a failed
            # one's exception, raised by result(), pins its caller's frames
            # (and the buffers they hold) through its traceback.
            done = None

    def _resolve(self, done):
        """Resolve the reaped (future, result) pairs, each before it leaves
        pending: drain() returning means every future is resolved."""
        for fut, res in done:
            if not resolved(fut):
                try:
                    if isinstance(res, BaseException):
                        fut.set_exception(res)
                    else:
                        fut.set_result(res)
                except concurrent.futures.InvalidStateError:
                    pass           # failed meanwhile by a close or a fork
            with self._lock:
                self._pending.discard(fut)
                if fut._counted:
                    fut._counted = False
                    self._with_callbacks -= 1
                if not self._pending:
                    self._idle.notify_all()

    def poll(self):
        """Resolve, on this thread and without waiting, the futures of the
        ops that have ended and that the reaper has not taken yet
        (:meth:`NvioFuture.done` calls it); nothing while a pending future
        has callbacks. Errors are left to the reaper: it reports a closed
        handle or a failed reap to every future."""
        q = self._queue
        if q is None or self._forked or self._stop or self._with_callbacks:
            return
        try:
            done = q.reap(REAP_MAX, 0, 0)
        except Exception:
            return
        if done:
            self._resolve(done)

    def _fail_pending(self, why):
        left = []
        with self._lock:
            self._stop = True
            while self._pending:       # pop() by pop(): C may add meanwhile
                left.append(self._pending.pop())
                left[-1]._counted = False
            self._with_callbacks = 0
            self._idle.notify_all()
        for fut in left:
            if not resolved(fut):
                try:
                    fut.set_exception(RuntimeError(why))
                except concurrent.futures.InvalidStateError:
                    pass

    @property
    def pending(self):
        """Futures not yet resolved."""
        with self._lock:
            return len(self._pending)

    def drain(self, timeout=None):
        """Wait until every submitted op's future is resolved. False on timeout."""
        with self._lock:
            return self._idle.wait_for(lambda: not self._pending, timeout)

    def close(self):
        """Resolve every pending future, then stop the reaper (idempotent).

        Called from a future's callback (on the reaper thread) it cannot
        wait for the reaper: the futures still pending then fail when the
        handle closes.
        """
        if threading.current_thread() is not self._thread:
            self.drain()
        with self._lock:
            self._stop = True
            self._work.notify_all()
            t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()


_all = weakref.WeakSet()


def _forked_error():
    return _nvio.NvioError(errno.ECHILD, "nvio: " + _nvio.strerror(errno.ECHILD))


def _after_fork_in_child():
    """The reaper thread did not survive fork, and the parent's ops are not
    this process's: fail the futures the child inherited (instead of leaving
    them to hang), and refuse new ones with ECHILD. Locks may have been held
    by threads that no longer exist: make new ones."""
    for c in list(_all):
        c._lock = threading.Lock()
        c._idle = threading.Condition(c._lock)
        c._work = threading.Condition(c._lock)
        left = list(c._pending)
        c._pending.clear()
        c._thread = None
        c._stop = True
        c._forked = True
        for fut in left:
            try:
                if not fut.done():
                    fut.set_exception(_forked_error())
            except Exception:    # its own lock was held at fork: leave it
                pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def completions(handle):
    """The Completions of a handle (an AioHandle keeps one, made on first use)."""
    c = getattr(handle, "_completions", None)
    if c is None:
        c = Completions(handle)
        try:
            handle._completions = c
        except AttributeError:
            raise TypeError("nvio: futures need an nvio.AioHandle (or a Handle "
                            "subclass with a _completions slot)") from None
    return c


class File(_nvio.File):
    """An open file of an :class:`nvio.AioHandle` (``h.open(path, flags)``).

    The synchronous methods are the C ones (``pread``, ``pwrite``, ``preadv``,
    ``pwritev``, ``truncate``, ``allocate``, ``sync``, ``commit``, ``close``,
    ``stream``); the ``*_async`` ones return :class:`NvioFuture` objects
    resolved by the handle's one reaper thread. Buffers are kept alive by
    nvio until their op's future is resolved.
    """

    __slots__ = ()

    def _one(self, opcode, buf, offset, flags, crc32=None):
        return completions(self.handle).submit(
            [(opcode, self, buf, offset, None, flags, crc32)])[0]

    def pread_async(self, buf, offset, flags=0, crc32=None):
        """Read len(buf) bytes at offset; a future of the bytes read.
        ``crc32``: as for :meth:`preadv_async` (one uint32)."""
        return self._one(_nvio.OP_READ, buf, offset, flags, crc32)

    def pwrite_async(self, buf, offset, flags=0, crc32=None):
        """Write buf at offset; a future of the bytes written.
        ``crc32``: as for :meth:`preadv_async` (one uint32)."""
        return self._one(_nvio.OP_WRITE, buf, offset, flags, crc32)

    def preadv_async(self, bufs, offset, flags=0, crc32=None):
        """preadv as a future (bufs: a list of buffers, or of (buf, offset)
        pairs with offset OFFSET_PER_IOV). ``crc32``: None, or a writable
        buffer of one uint32 per buffer (``array("I", bytes(4 * n))``) that
        holds the CRC-32 (zlib's) of each buffer's bytes once the future
        has resolved without error, taken by libnvio as it moved them."""
        return self._one(_nvio.OP_READ, list(bufs), offset, flags, crc32)

    def pwritev_async(self, bufs, offset, flags=0, crc32=None):
        """pwritev as a future; ``crc32`` as for :meth:`preadv_async`: the
        CRC-32 of each buffer, in the same pass as libnvio's bounce-buffer
        copy where it makes one."""
        return self._one(_nvio.OP_WRITE, list(bufs), offset, flags, crc32)
