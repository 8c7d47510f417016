"""How much page cache this process can really use (private to nvio.offload).

run_from_disk(direct="auto") reads a model's blocks through the page cache
when all its streamed bytes can stay there (every forward after the first
is then a copy from memory) and with O_DIRECT otherwise (a model bigger
than that would only evict itself and everybody else's cache, and be read
from the disk every forward anyway). The room is the smaller of
MemAvailable (/proc/meminfo) and what the process's memory cgroup has left:
``limit - usage`` of its own group and of each ancestor that sets a limit
(cgroup v2 ``memory.max - memory.current``; v1 ``memory.limit_in_bytes -
memory.usage_in_bytes``, which charge the page cache too), plus what of the
weights is cached already (the usage counts those pages: without this a
second run in the same group would see its own cached model as no room,
and flip to O_DIRECT). ``max`` or a huge v1 limit means none. Anything
that cannot be read makes the room unknown, and an unknown room means
O_DIRECT (the choice that cannot thrash).

``page_cache_room(root)`` reads ``root/proc/...`` and ``root/sys/fs/cgroup``
(and the mounts of ``root/proc/self/mountinfo``), so tests drive it with a
fake tree.
"""
from __future__ import annotations

import os
import stat

__all__ = []

NO_LIMIT = 1 << 60          # a v1 limit this big is "unlimited" (PAGE_COUNTER_MAX * page)
MARGIN_MIN = 256 << 20      # the safety margin: MARGIN_MIN + streamed bytes / MARGIN_DIV
MARGIN_DIV = 8


def _read(path):
    with open(path) as f:
        return f.read()


def _unescape(s):
    # mountinfo writes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _mount(root, v1):
    """(mount point, cgroup root of the mount) of the memory controller's
    hierarchy, from mountinfo; the usual place when mountinfo says nothing."""
    try:
        lines = _read(os.path.join(root, "proc/self/mountinfo")).splitlines()
    except OSError:
        lines = []
    for ln in lines:
        f = ln.split()
        if "-" not in f:
            continue
        k = f.index("-")
        if len(f) < k + 4 or k < 5:
            continue
        fstype, sopts = f[k + 1], f[k + 3].split(",")
        if (v1 and fstype == "cgroup" and "memory" in sopts) or (not v1 and fstype == "cgroup2"):
            return _unescape(f[4]), _unescape(f[3])
    return ("/sys/fs/cgroup/memory", "/") if v1 else ("/sys/fs/cgroup", "/")


def _limit_file(path):
    """bytes, or None for no limit ('max', or a huge v1 number)."""
    v = _read(path).strip()
    if v == "max":
        return None
    n = int(v)
    return None if n >= NO_LIMIT else n


def page_cache_room(root="/"):
    """What this process can use for page cache now, and why: a dict with
    room (bytes; None: unknown), mem_available, cgroup ('v1 /path' or
    'v2 /path'; None: no memory cgroup), cgroup_room (None: no limit),
    cgroup_limit and cgroup_usage (of the group that binds), error (what
    could not be read, or None)."""
    r = dict(room=None, mem_available=None, cgroup=None, cgroup_room=None, cgroup_limit=None,
             cgroup_usage=None, error=None)
    p = os.path.join(root, "proc/meminfo")
    try:
        for ln in _read(p).splitlines():
            if ln.startswith("MemAvailable:"):
                r["mem_available"] = int(ln.split()[1]) * 1024
                break
    except (OSError, ValueError, IndexError) as e:
        r["error"] = "%s: %s" % (p, e)
        return r
    if r["mem_available"] is None:
        r["error"] = "%s has no MemAvailable" % p
        return r
    p = os.path.join(root, "proc/self/cgroup")
    try:
        groups = [ln.split(":", 2) for ln in _read(p).splitlines() if ln.count(":") >= 2]
    except OSError as e:
        r["error"] = "%s: %s" % (p, e)
        return r
    v1 = [g for g in groups if "memory" in g[1].split(",")]
    v2 = [g for g in groups if g[0] == "0" and g[1] == ""]
    if v1 or v2:
        own = (v1 or v2)[0][2]
        point, mroot = _mount(root, bool(v1))
        rel = own[len(mroot):] if mroot != "/" and (own + "/").startswith(mroot + "/") else own
        base = os.path.join(root, point.lstrip("/"))
        names = ("memory.limit_in_bytes", "memory.usage_in_bytes") if v1 else \
            ("memory.max", "memory.current")
        r["cgroup"] = "%s %s" % ("v1" if v1 else "v2", own)
        parts = [x for x in rel.split("/") if x]
        d = os.path.join(base, *parts)
        if not os.path.isdir(d):
            r["error"] = "the memory cgroup %s: no directory %s" % (own, d)
            return r
        for i in range(len(parts), -1, -1):     # the group, then each ancestor
            d = os.path.join(base, *parts[:i])
            lim_p, use_p = (os.path.join(d, n) for n in names)
            try:
                if not v1 and not os.path.exists(lim_p):
                    continue    # v2: the root group, or no memory controller here
                lim = _limit_file(lim_p)
                if lim is None:
                    continue
                use = int(_read(use_p).strip())
            except (OSError, ValueError) as e:
                r["error"] = "%s: %s" % (lim_p, e)
                return r
            room = max(0, lim - use)
            if r["cgroup_room"] is None or room < r["cgroup_room"]:
                r.update(cgroup_room=room, cgroup_limit=lim, cgroup_usage=use)
    r["room"] = r["mem_available"] if r["cgroup_room"] is None else \
        min(r["mem_available"], r["cgroup_room"])
    return r


def _b(n):
    return "%.2f GiB" % (n / (1 << 30)) if n >= 1 << 30 else "%.1f MiB" % (n / (1 << 20))


def cached_bytes(ranges):
    """Bytes of the file ranges [(path, offset, length)] in the page cache
    now (mincore of a read-only mapping, whole pages); what cannot be
    checked counts as not cached."""
    import ctypes
    import mmap
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    except (OSError, AttributeError):
        return 0
    page, chunk = mmap.PAGESIZE, 1 << 30
    by_path = {}
    for path, off, n in ranges:
        by_path.setdefault(path, []).append((off, n))
    total = 0
    for path, rs in by_path.items():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)    # a FIFO: no wait
        except OSError:
            continue
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                continue                 # only a regular file's pages are cached
            size = st.st_size
            for off, n in rs:
                a, end = off // page * page, min(off + n, size)
                while a < end:
                    ln = min(chunk, end - a)
                    addr = libc.mmap(None, ln, mmap.PROT_READ, mmap.MAP_SHARED, fd, a)
                    if addr in (None, ctypes.c_void_p(-1).value):
                        break
                    vec = ctypes.create_string_buffer((ln + page - 1) // page)
                    try:
                        if libc.mincore(addr, ln, vec) == 0:
                            raw = vec.raw
                            total += (len(raw) - raw.count(0)) * page
                    finally:
                        libc.munmap(addr, ln)
                    a += ln
        finally:
            os.close(fd)
    return total


def choose_direct(streamed, pool=0, root="/", cached=0):
    """(direct, why, inputs) for a model that streams ``streamed`` bytes
    through a pool of ``pool`` bytes: buffered (False) when streamed + pool
    + margin fit in page_cache_room(), else O_DIRECT (True). ``cached``:
    bytes of the weights in the page cache already; a cgroup's usage
    counts them, so they are added back to its room (MemAvailable counts
    page cache as available already)."""
    r = page_cache_room(root)
    margin = MARGIN_MIN + streamed // MARGIN_DIV
    need = streamed + pool + margin
    cached = max(0, min(cached, streamed))
    inputs = dict(r, need=need, streamed=streamed, pool=pool, margin=margin, cached=cached)
    if r["room"] is None:
        why = "O_DIRECT: the memory left for page cache is unknown (%s)" % r["error"]
        return True, why, inputs
    room = r["room"]
    if r["cgroup_room"] is None:
        cg = "cgroup %s: no limit" % r["cgroup"] if r["cgroup"] else "no memory cgroup"
    else:
        cg = "cgroup %s: limit %s - usage %s%s = %s" % (
            r["cgroup"], _b(r["cgroup_limit"]), _b(r["cgroup_usage"]),
            " + %s of the weights cached" % _b(cached) if cached else "",
            _b(r["cgroup_room"] + cached))
        room = min(r["mem_available"], r["cgroup_room"] + cached)
    inputs["room"] = room
    fits = need <= room
    why = "%s: %s streamed + %s pool + %s margin %s %s of room (MemAvailable %s; %s)" % (
        "page cache" if fits else "O_DIRECT", _b(streamed), _b(pool), _b(margin),
        "fit in" if fits else "exceed", _b(room), _b(r["mem_available"]), cg)
    return not fits, why, inputs
