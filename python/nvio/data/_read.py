"""How nvio.data reads: one file per process, the direct-or-cached choice,
and a batch as ONE vectored submission into one buffer.

Deciding is separate from doing: :func:`plan_reads` (pure) turns a batch's
byte ranges into reads: with O_DIRECT each sample's covering aligned range
(neighbours merged), one request per sample straight into an aligned slot
of the buffer, the sample a view inside it; through the page cache the
exact ranges, in lanes of increasing, non-overlapping ranges
(:func:`plan_lanes`), the form a vectored read with per-piece offsets takes
(nvio_file_preadv with NVIO_OFFSET_PER_IOV). :class:`PendingBatch` hands
every lane to libnvio in one ``submit`` (one op per lane, all in flight at
once, the pieces at the handle's queue depth, refilled as each completes)
and waits for their futures.
"""
import ctypes
import errno as _errno
import heapq
import mmap
import os
import threading

import numpy as np

import nvio
from nvio import _nvio

from ._errors import DataReadError
from ._index import regular_size

#: Default requests in flight (the handle's queue_depth).
QUEUE_DEPTH = 128
#: Default request size: samples are small; staging is block_size * depth.
BLOCK_SIZE = 128 << 10
#: Sliding window: a request is refilled as soon as any completes (scattered
#: small samples finish out of order; waiting for a whole round of
#: queue_depth before the next left the device idle in the tail).
OVERLAP = True
#: The least alignment libnvio keeps a direct read's body at (submit.c
#: plan_align: the file's O_DIRECT alignment, at least a sector).
LIB_READ_ALIGN = 512
#: Page cache kept free beyond the dataset before it is read cached.
MARGIN = 256 << 20
#: A dataset is warm, and read through the page cache where it fits, when
#: no more than this fraction of it (or MARGIN) is still uncached.
COLD_LEFT = 0.1


# --- direct or cached --------------------------------------------------------


def _meminfo_available():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("no MemAvailable in /proc/meminfo")


def _read_int(path):
    with open(path) as f:
        v = f.read().strip()
    return None if v == "max" else int(v)


def _cgroup_room():
    """(bytes this process's memory cgroup can still charge, where the limit
    is), or (None, why) without a limit. Walks up to the tightest ancestor
    with a limit; cgroup v2 (memory.max) and v1 (memory.limit_in_bytes, which
    charges the page cache too)."""
    best = (None, "no memory cgroup limit")
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError as e:
        return None, "/proc/self/cgroup: %s" % e
    for line in lines:
        _, ctrl, rel = line.split(":", 2)
        if ctrl == "":
            root, lim, use = "/sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in ctrl.split(","):
            root = "/sys/fs/cgroup/memory"
            lim, use = "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        d = os.path.join(root, rel.lstrip("/"))
        while d.startswith(root):
            try:
                limit = _read_int(os.path.join(d, lim))
                usage = _read_int(os.path.join(d, use))
            except (OSError, ValueError):
                limit = None
            if limit is not None and limit < (1 << 60):
                room = max(0, limit - usage)
                if best[0] is None or room < best[0]:
                    best = (room, "%s/%s" % (d, lim))
            if d == root:
                break
            d = os.path.dirname(d)
    return best


#: Pages per mincore call: its vector is this many bytes (256 KiB for each
#: GiB of the file), so the check of a corpus of terabytes costs no more
#: memory than that of one GiB.
MINCORE_PAGES = 1 << 18


def cached_bytes(path):
    """Bytes of path in the page cache now (mincore of a read-only mapping,
    MINCORE_PAGES at a time; 0 where that cannot be checked)."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return 0
            m = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
    except (OSError, ValueError):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        page = mmap.PAGESIZE
        pages = (size + page - 1) // page
        step = max(1, min(MINCORE_PAGES, pages))
        vec = (ctypes.c_ubyte * step)()
        flags = np.frombuffer(vec, np.uint8)
        view = np.frombuffer(m, dtype=np.uint8)
        resident = 0
        try:
            base = view.ctypes.data
            for first in range(0, pages, step):
                n = min(step, pages - first)
                if libc.mincore(base + first * page, min(n * page, size - first * page),
                                ctypes.addressof(vec)) != 0:
                    return 0
                resident += int(np.count_nonzero(flags[:n] & 1))
        finally:
            del view
        return resident * page
    except (OSError, AttributeError, TypeError):
        return 0
    finally:
        m.close()


def choose_direct(direct, paths_sizes):
    """(use O_DIRECT, why) for a dataset of [(path, bytes)].

    direct=True/"on": O_DIRECT; False/"off": the page cache. "auto": the
    page cache when the dataset is WARM (at most COLD_LEFT of it, or
    MARGIN, is not cached yet) and what is left to read plus MARGIN fits in
    the memory this process can still use for page cache (min of
    MemAvailable and its memory cgroup's room: limit - usage, whose usage
    counts the cached part); else O_DIRECT: a cold dataset read through the
    page cache pays a page fault or a buffered read per sample plus readahead
    of bytes nobody asked for, while O_DIRECT reads exactly the sample's
    blocks at queue depth (faster than warm page-cache reads on this class
    of machine), and random samples neither evict each other nor the
    model's memory (a cgroup charges the page cache)."""
    if direct in (True, "on", 1):
        return True, "direct=on"
    if direct in (False, "off", 0):
        return False, "direct=off"
    if direct not in ("auto", None):
        raise ValueError("nvio.data: direct must be True, False or 'auto', not %r" % (direct,))
    total = sum(n for _, n in paths_sizes)
    cached = sum(min(cached_bytes(p), n) for p, n in paths_sizes)
    try:
        avail = _meminfo_available()
    except OSError as e:
        return True, "O_DIRECT: the memory free for page cache is unknown (%s)" % e
    room, where = _cgroup_room()
    room = avail if room is None else min(avail, room + cached)
    need = total - cached + MARGIN
    gib = lambda v: "%.2f GiB" % (v / 2**30)
    fits = need <= room
    warm = total - cached <= max(MARGIN, COLD_LEFT * total)
    why = "%s: %s to read (%s of %s cached: %s) + %s margin %s %s of room (MemAvailable %s, %s)" % (
        "page cache" if fits and warm else "O_DIRECT", gib(total - cached), gib(cached),
        gib(total), "warm" if warm else "cold", gib(MARGIN), "fit in" if fits else "exceed",
        gib(room), gib(avail), where)
    return not (fits and warm), why


def read_align(f):
    """The alignment batches are read at from f, an open nvio File: where
    its handle reads with O_DIRECT, the larger of the file's O_DIRECT
    offset and memory alignments and libnvio's least (it cuts what is not
    aligned so into a buffered head and tail); else 1. On a disk of
    512-byte sectors a sample of 8196 bytes is then read as 8.5 or 9 KiB,
    not as the 12 KiB of the pages it touches."""
    info = f.info()
    if not info.get("direct") or not info.get("dio_offset_align"):
        return 1
    return max(LIB_READ_ALIGN, int(info["dio_offset_align"]),
               int(info.get("dio_mem_align") or 0))


# --- one file per process ------------------------------------------------------


#: Held while a Source opens this process's handle (threads share it); made
#: anew in a forked child, where another thread may have held it.
_open_lock = [threading.Lock()]
os.register_at_fork(after_in_child=lambda: _open_lock.__setitem__(0, threading.Lock()))


class Source:
    """A file nvio.data reads, opened on first use in each process: a forked
    or spawned DataLoader worker opens its own handle (a parent's handle is
    never used in a child: libnvio refuses it there)."""

    def __init__(self, path, *, engine="auto", direct=False, queue_depth=QUEUE_DEPTH,
                 block_size=BLOCK_SIZE, gds=False):
        self.path = os.fspath(path)
        self.size = regular_size(self.path)
        self.engine = engine
        self.direct = bool(direct)
        self.queue_depth = queue_depth
        self.block_size = block_size
        self.gds = gds
        self._pid = None
        self._handle = None
        self._file = None
        self._align = 1

    def __getstate__(self):
        s = dict(self.__dict__)
        s.update(_pid=None, _handle=None, _file=None, _align=1)
        return s

    def file(self):
        """This process's open file (an nvio File of its own handle; threads
        share it, the first opens it)."""
        if self._pid == os.getpid():
            return self._file
        with _open_lock[0]:
            return self._open()

    def _open(self):
        if self._pid != os.getpid():
            cls = nvio.GdsHandle if self.gds else nvio.AioHandle
            h = cls(block_size=self.block_size, queue_depth=self.queue_depth,
                    overlap_events=OVERLAP, engine=self.engine,
                    direct="on" if self.direct else "off")
            f = h.open(self.path)
            if f.size != self.size:
                size, f_size = self.size, f.size
                f.close()
                h.close()
                raise DataReadError("%s changed size since the dataset was opened: %d bytes, "
                                    "was %d" % (self.path, f_size, size), self.path,
                                    errno=_errno.ESTALE)
            self._align = read_align(f) if self.direct else 1
            self._handle, self._file, self._pid = h, f, os.getpid()
        return self._file

    def align(self):
        """The alignment this process's batches are read at (see
        read_align; 1 when reading through the page cache)."""
        self.file()
        return self._align

    @property
    def handle(self):
        self.file()
        return self._handle

    def close(self):
        if self._pid == os.getpid() and self._handle is not None:
            self._file.close()
            self._handle.close()
        self._pid = self._handle = self._file = None


# --- a batch ---------------------------------------------------------------------


def plan_lanes(offsets, nbytes):
    """Split ranges [offsets[i], offsets[i] + nbytes[i]) into lanes: lists
    of positions i whose ranges rise and do not overlap (a vectored read
    with per-piece offsets takes nothing else). Empty ranges are left out.
    Disjoint ranges (random samples of a large corpus) make one lane;
    overlapping ones (windows that share tokens) are read once per lane."""
    offsets = np.asarray(offsets, dtype=np.int64)
    nbytes = np.asarray(nbytes, dtype=np.int64)
    keep = np.flatnonzero(nbytes > 0)
    order = keep[np.argsort(offsets[keep], kind="stable")]
    if order.size == 0:
        return []
    so = offsets[order]
    se = so + nbytes[order]
    if order.size == 1 or np.all(so[1:] >= np.maximum.accumulate(se)[:-1]):
        return [order.tolist()]
    lanes, ends = [], []            # ends: a heap of (end of lane, lane number)
    for i, a, b in zip(order.tolist(), so.tolist(), se.tolist()):
        if ends and ends[0][0] <= a:
            _, k = heapq.heappop(ends)
        else:
            k = len(lanes)
            lanes.append([])
        lanes[k].append(i)
        heapq.heappush(ends, (b, k))
    return lanes


def plan_reads(offsets, nbytes, align=1, size=None):
    """Where a batch's reads go: a pure function of the samples' byte
    ranges [offsets[i], offsets[i] + nbytes[i]), the alignment O_DIRECT
    needs (1: none, the page cache reads exact ranges) and the file's size.

    align 1: each non-empty sample is one read of its exact bytes, packed
    one after the other in the buffer, in lanes (see plan_lanes).
    align > 1: each sample's covering aligned range (start rounded down,
    end rounded up to align, clamped to size), ranges that touch or overlap
    merged, in file order: ONE lane of reads that are each a whole number
    of aligned blocks at an aligned place in the buffer, so libnvio moves
    each with one O_DIRECT request straight into the buffer (an unaligned
    range would be cut into a buffered head, a direct body and a buffered
    tail: three requests, two of them through the page cache with its
    readahead). A sample is then a view at its offset inside its read.

    Returns a ReadPlan: lanes [(ro, rl, rp, members, member_read)] of
    int64 arrays (reads' file offsets, lengths, buffer positions; the
    sample positions each lane holds and, for each, its read number in the
    lane), pos (each sample's byte position in the buffer; 0 if empty) and
    total (the buffer's bytes)."""
    offsets = np.asarray(offsets, dtype=np.int64).reshape(-1)
    nbytes = np.asarray(nbytes, dtype=np.int64).reshape(-1)
    n = len(offsets)
    pos = np.zeros(n, np.int64)
    if align <= 1:
        if n > 1:
            np.cumsum(nbytes[:-1], out=pos[1:])
        lanes = []
        for lane in plan_lanes(offsets, nbytes):
            m = np.asarray(lane, np.int64)
            lanes.append((offsets[m], nbytes[m], pos[m], m, np.arange(len(m), dtype=np.int64)))
        return ReadPlan(lanes, pos, int(nbytes.sum()), 1)
    keep = np.flatnonzero(nbytes > 0)
    if keep.size == 0:
        return ReadPlan([], pos, 0, align)
    order = keep[np.argsort(offsets[keep], kind="stable")]
    so = offsets[order]
    a = so // align * align
    e = (so + nbytes[order] + align - 1) // align * align
    if size is not None:
        e = np.minimum(e, max(int(size), 0))
    reach = np.maximum.accumulate(e)
    first = np.ones(len(order), bool)
    first[1:] = a[1:] > reach[:-1]          # touching ranges merge: one larger request
    group = np.cumsum(first) - 1
    starts = np.flatnonzero(first)
    ro = a[starts]
    lasts = np.append(starts[1:] - 1, len(order) - 1)
    rl = reach[lasts] - ro
    rp = np.zeros(len(ro), np.int64)
    if len(ro) > 1:
        # every read but the last (which may end at the file's end) is a
        # whole number of blocks: each lands at an aligned place
        np.cumsum(rl[:-1], out=rp[1:])
    pos[order] = rp[group] + (so - ro[group])
    total = int(rp[-1] + rl[-1])
    return ReadPlan([(ro, rl, rp, order, group)], pos, total, align)


class ReadPlan:
    """What plan_reads decided (see there)."""
    __slots__ = ("lanes", "pos", "total", "align")

    def __init__(self, lanes, pos, total, align):
        self.lanes, self.pos, self.total, self.align = lanes, pos, total, align

    @property
    def compact(self):
        """Whether the samples lie packed one after the other in the buffer
        (no padding, nothing shared)."""
        return self.align <= 1


def _piece_maker(buf):
    """A function (start, n) -> a buffer nvio reads into: memoryview slices
    of host memory, tensor slices of device memory."""
    if hasattr(buf, "data_ptr"):
        return lambda s, n: buf[s:s + n]
    mv = memoryview(buf).cast("B")
    return lambda s, n: mv[s:s + n]


class PendingBatch:
    """A batch in flight: every lane of plan (a ReadPlan of the samples'
    ranges offsets/nbytes) submitted at once (one nvio submit); :meth:`wait`
    returns once all have landed or raises DataReadError naming the file,
    the samples and their byte ranges."""

    def __init__(self, source, samples, offsets, nbytes, plan, buf, finish):
        self.source = source
        self.samples = samples
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.nbytes = np.asarray(nbytes, dtype=np.int64)
        self.plan = plan
        self.buf = buf
        self._finish = finish
        self._result = None
        f = source.file()
        piece = _piece_maker(buf)
        ops = []
        mx = _nvio.MAX_IOV
        for k, (ro, rl, rp, _, _) in enumerate(plan.lanes):
            vec = [(piece(p, n), o) for o, n, p in zip(ro.tolist(), rl.tolist(), rp.tolist())]
            for j in range(0, len(vec), mx):
                ops.append((_nvio.OP_READ, f, vec[j:j + mx], _nvio.OFFSET_PER_IOV,
                            (k, j, j + mx)))
        try:
            self.futures = nvio.completions(source.handle).submit(ops) if ops else []
        except nvio.NvioError as e:
            self.futures = []
            raise self._error(e, ops[0][4] if ops else None) from e

    def done(self):
        return all(f.done() for f in self.futures)

    def wait(self):
        """The batch (what the dataset makes of the filled buffer)."""
        if self._result is None:
            err = None
            for fut in self.futures:
                e = fut.exception()
                if e is not None and err is None:
                    err = self._error(e, fut.user_data)
                    cause = e
            if err is not None:
                raise err from cause
            self._result = self._finish(self.buf)
            self.futures = []
        return self._result

    def _error(self, e, where):
        """DataReadError of e, an op's failure; where: (lane, first read,
        end read) of the op."""
        lane = []
        if where is not None:
            k, j0, j1 = where
            _, _, _, members, member_read = self.plan.lanes[k]
            lane = members[(member_read >= j0) & (member_read < j1)].tolist()
        return read_error(self.source, self.samples, self.offsets, self.nbytes, e, lane)


def read_error(source, samples, offsets, nbytes, e, lane):
    """The DataReadError of a failed read e (an NvioError) of the ranges at
    positions lane: it names the file, the samples whose bytes the failed
    request covers (all of the lane's where it says no range) and their
    bytes; errno is e's."""
    where = []
    lo, hi = getattr(e, "offset", None), None
    if lo is not None and getattr(e, "nbytes", None):
        hi = lo + e.nbytes
    hits = [i for i in lane if hi is None or
            (offsets[i] < hi and offsets[i] + nbytes[i] > lo)] or list(lane)
    for i in hits[:4]:
        where.append("sample %s (bytes %d..%d)" % (samples[i], offsets[i], offsets[i] + nbytes[i]))
    more = " and %d more" % (len(hits) - 4) if len(hits) > 4 else ""
    first = hits[0] if hits else None
    msg = "nvio.data: reading %s%s of %s failed: %s" % (
        ", ".join(where) or "a batch", more, source.path, getattr(e, "strerror", None) or e)
    return DataReadError(msg, source.path,
                         sample=None if first is None else samples[first],
                         offset=None if first is None else int(offsets[first]),
                         nbytes=None if first is None else int(nbytes[first]),
                         errno=getattr(e, "errno", None))
