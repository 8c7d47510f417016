"""Data-parallel save and load of replicated state over torch.distributed.

``nvio.save(obj, path, group=pg)``: every rank of ``pg`` holds the same
state. Each rank lays the file out (the layout is a pure function of the
state, so it is the same everywhere, and the ranks check that it is). The
tensor bytes, taken in file order, are cut into one contiguous share per
writer, evenly by bytes with cuts on page boundaries; each writer writes its
share of the one output file straight from its tensors and computes the
CRC-32 of each piece. Rank 0 creates the file (a hidden temporary beside
``path``, created exclusively), gathers the pieces' CRCs, combines them per
record, writes the headers and directory, and, once every rank reported its
writes durable, renames it over ``path`` and fsyncs the directory. Every
step's outcome goes through a collective, so a failure on any rank fails the
save on every rank, the temporary is removed and ``path`` keeps its old
checkpoint. The file is an ordinary nvio checkpoint: plain ``torch.load``
reads it on one process.

With ``spare=True`` rank 0 opens ``path`` with libnvio's FILE_SPARE: the
temporary is the spare, the previous version's file kept beside ``path``,
whose blocks every rank overwrites (it opens the spare by its name), and
the commit cuts it to size, fsyncs it and swaps it with ``path``, as a
single writer's spare save does. Where there is no spare to take yet (a
new ``path``) the save makes a named temporary as above.

``nvio.load(path, group=pg)``: every rank unpickles the (small) pickle and
allocates the same storages; each rank reads one share of the tensor bytes
from the file and broadcasts it to the others (``share=True``), or every
rank reads the whole file (``share=False``); ``share="auto"``, the default,
is False when every rank of the group runs on one host (a broadcast there
costs more than reading the shared device again) and True otherwise. With
an NCCL group the shares travel through the current CUDA device (NCCL
broadcasts CUDA tensors only); gloo, MPI and "cpu:gloo,cuda:nccl" groups
broadcast them from host memory.

Only torch.distributed is used for coordination: collectives on ``pg``
(gloo for CPU tensors) and its store. A rank that dies is named by number
on every surviving rank, from what the store knows rather than from the
transport's wording: each process beats a heartbeat counter in the store
while it saves or loads, and each rank counts itself in before each step's
collective. A rank that stopped beating before it came, or while the others
were in the collective, is named as dead; one that is alive but not there
when the group's timeout runs out is named as late.
"""
from __future__ import annotations

import datetime
import hashlib
import os
import socket

import torch
import torch.distributed as dist

from .. import _device, _nvio
from .._atomic import join_shared, replaced_held
from .._base.crc import crc32_combine, crc_submit
from .._base.group import Group as _Group
from .._base.group import GroupFailure  # noqa: F401  (nvio.checkpoint._dist.GroupFailure)
from .._base.handle import default_handle
from .._base.pieces import read_pieces
from .._base.plan import DEFAULT_ALIGN, CheckpointError, Plan
from .._base.space import atomic_flags, reserve_space
from .._base.views import u8

__all__ = ["save_group", "load_group", "split_shares", "GroupFailure"]

def split_shares(sizes, nshares, align=DEFAULT_ALIGN):
    """Cut records of ``sizes`` bytes (in file order) into ``nshares``
    contiguous shares of about equal bytes. Cuts fall on multiples of
    ``align`` inside a record (records start aligned, so pieces do too).
    Returns per share a list of (record index, offset in record, length)."""
    total = sum(sizes)
    starts = []
    acc = 0
    for s in sizes:
        starts.append(acc)
        acc += s
    cuts = [0]
    for j in range(1, nshares):
        want = total * j // nshares
        # the record holding byte `want`, and the aligned cut inside it
        i = _bisect(starts, sizes, want)
        if i is None:
            cuts.append(total)
            continue
        local = (want - starts[i]) // align * align
        cuts.append(max(cuts[-1], starts[i] + local))
    cuts.append(total)
    shares = []
    for j in range(nshares):
        lo, hi = cuts[j], cuts[j + 1]
        pieces = []
        for i, s in enumerate(sizes):
            a, b = max(lo, starts[i]), min(hi, starts[i] + s)
            if a < b:
                pieces.append((i, a - starts[i], b - a))
        shares.append(pieces)
    return shares


def _bisect(starts, sizes, pos):
    lo, hi = 0, len(starts) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if pos < starts[mid]:
            hi = mid - 1
        elif pos >= starts[mid] + sizes[mid]:
            lo = mid + 1
        else:
            return mid
    return None


def _writers(g, writers_per_node):
    hosts = g.gather("finding the writers", socket.gethostname())
    if not writers_per_node:
        return list(range(g.size))
    if writers_per_node < 1:
        raise ValueError("nvio: writers_per_node must be >= 1 or None")
    seen = {}
    out = []
    for r, h in enumerate(hosts):
        if seen.get(h, 0) < writers_per_node:
            seen[h] = seen.get(h, 0) + 1
            out.append(r)
    return out


def _digest(plan):
    """What every rank's state must share with rank 0's for the ranks to
    write shares of one file: its storages, in the order pickling met them,
    with their sizes and dtypes. Not the pickle's bytes: rank 0's pickle is
    the one written, and the ranks' may differ where the state does not
    (each rank's "cuda:N" location tag, a set's order under hash
    randomisation); the data offsets come from rank 0's layout."""
    h = hashlib.sha256()
    for (r, _), dtype in zip(plan.data, plan.dtypes):
        h.update(b"%d %s\0" % (r.size, str(dtype).encode()))
    return "%d:%s" % (len(plan.data), h.hexdigest())


def _err_text(e):
    return "%s: %s" % (type(e).__name__, e)


def save_group(obj, path, group, *, durable=True, handle=None, align=DEFAULT_ALIGN,
               pickle_protocol=2, writers_per_node=None, timeout=None, spare=False):
    """nvio.save with ``group``: see the module's docstring."""
    path = os.fsdecode(path)
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        timeout = datetime.timedelta(seconds=timeout)
    g = _Group(group, path, timeout)
    plan = err = None
    try:
        plan = Plan(obj, path, align, pickle_protocol)
        digest = _digest(plan)
        # rank 0's offsets and size are the file's: only its are sent
        layout = ([r.data_offset for r, _ in plan.data], plan.size) if g.rank == 0 else None
    except Exception as e:  # noqa: BLE001 - every rank must hear of it
        err, digest, layout = _err_text(e), None, None
    got = g.gather("laying out the checkpoint", (err, digest, layout))
    for r, (e, _, _) in enumerate(got):
        if e:
            raise CheckpointError("nvio.save: %s: rank %d could not lay out the state: %s"
                                  % (path, r, e), path)
    for r, (_, d, _) in enumerate(got):
        if d != got[0][1]:
            raise CheckpointError("nvio.save: %s: the state on rank %d differs from rank 0's "
                                  "(its tensors' storages, their sizes or dtypes); a "
                                  "data-parallel save needs the same state on every rank"
                                  % (path, r), path)
    offsets, plan.size = got[0][2]
    for (r, _), off in zip(plan.data, offsets):
        r.data_offset = off
    writers = _writers(g, writers_per_node)
    if handle is None:
        handle = default_handle()

    # rank 0 makes the file; the others learn its name and identity
    share = err = af = None
    if g.rank == 0:
        try:
            af = _open_shared(handle, path, plan.size, durable, spare)
            share = _nvio.file_share(af)
        except Exception as e:  # noqa: BLE001
            err = _err_text(e)
    try:
        made = g.gather("creating the file", (err, share))
        if made[0][0]:
            raise CheckpointError("nvio.save: %s: rank 0 could not create the file: %s"
                                  % (path, made[0][0]), path)
        return _write_share(g, plan, made[0][1], path, handle, writers, durable, af)
    finally:
        if af is not None:
            af.close()          # committed: nothing to do; else abandoned (a spare kept)


def _open_shared(handle, path, size, durable, spare):
    """On rank 0: the atomic nvio File of a file several ranks write
    (libnvio's FILE_SHARED: a named temporary, or with ``spare`` path's
    spare, which the other ranks join by name and identity; committed or
    abandoned by libnvio), its space reserved."""
    f = handle.open(path, atomic_flags(durable, spare=spare) | _nvio.FILE_SHARED)
    try:
        reserve_space(f, size)
    except BaseException:
        f.close()
        raise
    return f


def _write_share(g, plan, share, path, handle, writers, durable, af):
    sizes = [r.size for r, _ in plan.data]
    shares = split_shares(sizes, len(writers), plan.align)
    mine = shares[writers.index(g.rank)] if g.rank in writers else []
    crcs, err = [], None
    try:
        with join_shared(handle, share) as f:
            hosts = {}
            regions, pieces = [], []
            for i, off, n in mine:
                r, s = plan.data[i]
                if i not in hosts:
                    hosts[i] = _device.to_host(s)   # CUDA: a host copy (untested on the simulator)
                h = hosts[i]
                regions.append((h.data_ptr() + off, n))
                pieces.append((u8(h)[off:off + n], r.data_offset + off))
            wait = crc_submit(regions)
            fut = None
            try:
                fut = f.pwritev_async(pieces, _nvio.OFFSET_PER_IOV) if pieces else None
                crcs = [(i, off, n, c) for (i, off, n), c in zip(mine, wait())]
            finally:
                wait.settle()           # they read hosts (CUDA: copies freed after)
                if fut is not None:
                    fut.result()
            if durable and pieces:
                f.sync()
    except Exception as e:  # noqa: BLE001 - every rank must hear of it
        err = _err_text(e)
    got = g.gather("writing the shares", (err, crcs))
    bad = [(r, e) for r, (e, _) in enumerate(got) if e]
    if bad:
        r, e = bad[0]
        raise CheckpointError("nvio.save: %s: rank %d failed writing its share: %s; the "
                              "previous checkpoint (if any) is unchanged" % (path, r, e), path)
    err = None
    if g.rank == 0:
        try:
            parts = {}
            for _, (_, lst) in enumerate(got):
                for i, off, n, c in lst:
                    parts.setdefault(i, []).append((off, n, c))
            for i, (r, _) in enumerate(plan.data):
                crc = 0
                for off, n, c in sorted(parts.get(i, [])):
                    crc = crc32_combine(crc, c, n)
                r.crc = crc
            meta = [(b, off) for off, b in plan.meta_pieces()]
            af.pwritev(meta, _nvio.OFFSET_PER_IOV)
            af.truncate(plan.size)      # the size the ranks wrote, not af's own
            with replaced_held(path):   # the old file's blocks freed off this path
                af.commit()             # fsync, rename (a spare: swap), fsync of the dir
            g.committed = True
        except Exception as e:  # noqa: BLE001
            # renamed, and then the directory's fsync failed: the new file is there
            g.committed = af.committed
            err = _err_text(e)
    g.stage = "committing"
    done = g.gather("committing", (err, g.committed))
    if done[0][0]:
        raise CheckpointError("nvio.save: %s: rank 0 could not commit the file: %s; %s"
                              % (path, done[0][0], "the new file replaced the old one but "
                                 "may not be durable" if done[0][1] else
                                 "the previous checkpoint (if any) is unchanged"), path)
    return None


def load_group(load_plain, path, group, *, share="auto", **kwargs):
    """nvio.load with ``group``: see the module's docstring. ``load_plain``:
    checkpoint._load's one-process load (passed in: _load imports this
    module, not the other way round)."""
    n = dist.get_world_size(group)
    if not share or n == 1 or not _nvio.check_flag(kwargs.get("weights_only", True),
                                                    "weights_only") or kwargs.get("mmap"):
        return load_plain(path, **kwargs)
    path = os.fsdecode(path)
    g = _Group(group, path, None)
    g.fail = lambda what, e: CheckpointError(
        "nvio.load: %s: %s failed on rank %d: %s" % (path, what, g.rank, e), path)
    if share == "auto" and len(set(g.gather("load: finding the hosts",
                                            socket.gethostname()))) == 1:
        return load_plain(path, **kwargs)      # one host: every rank reads it all
    entered = []

    def read_all(nf, reads):
        """Read my share, broadcast every share (reads: (storage, entry) in
        file order, the same on every rank)."""
        entered.append(True)
        sizes = [e.size for _, e in reads]
        # the same file on every rank: a save that replaced it between two
        # ranks' opens would give each rank shares of another version
        crcs = hashlib.sha256(b"".join(b"%d %d\0" % (e.size, e.crc) for _, e in reads))
        _agree(g, "load: reading the pickle", None, (len(sizes), sum(sizes), crcs.hexdigest()))
        shares = split_shares(sizes, n)
        lens = [sum(k for _, _, k in pieces) for pieces in shares]
        via = _carrier(dist.get_backend(group))
        if via == "cuda":
            via = torch.device("cuda", torch.cuda.current_device())
        err = own = other = None
        try:
            # my share, and one buffer for each other rank's in turn
            own = torch.empty(lens[g.rank], dtype=torch.uint8)
            other = torch.empty(max([k for j, k in enumerate(lens) if j != g.rank] or [0]),
                                dtype=torch.uint8)
            pos, vec = 0, []
            for i, off, k in shares[g.rank]:
                vec.append((own[pos:pos + k], reads[i][1].data_offset + off))
                pos += k
            read_pieces(nf, vec)
        except Exception as e:  # noqa: BLE001 - every rank must hear of it
            err = _err_text(e)
        _agree(g, "load: reading the shares", err, None)
        for j, pieces in enumerate(shares):
            flat = own if j == g.rank else other[:lens[j]]
            src = dist.get_global_rank(group, j) if group is not None else j
            if flat.numel():
                try:
                    if via is None:
                        dist.broadcast(flat, src=src, group=group)
                    else:               # NCCL carries CUDA tensors only
                        buf = flat.to(via) if j == g.rank else \
                            torch.empty(flat.shape, dtype=flat.dtype, device=via)
                        dist.broadcast(buf, src=src, group=group)
                        flat.copy_(buf)
                        del buf
                except RuntimeError as e:
                    what = "broadcasting rank %d's share" % j
                    raise g.fail(what, g.cause(what, e)) from None
            pos = 0
            for i, off, k in pieces:
                u8(reads[i][0])[off:off + k].copy_(flat[pos:pos + k])
                pos += k

    try:
        return load_plain(path, _read_all=read_all, **kwargs)
    except Exception as e:
        if not entered:                 # the others wait in read_all: tell them
            _agree(g, "load: reading the pickle", _err_text(e), None)
        raise


def _carrier(backend):
    """How a load's shares travel through a group whose backend is
    ``backend`` (what dist.get_backend says): None as CPU tensors (gloo,
    MPI, or a backend with a "cpu:" entry such as "cpu:gloo,cuda:nccl"),
    "cuda" through the GPU (NCCL takes CUDA tensors only: each share is
    copied to the current device, broadcast, and copied back)."""
    b = str(backend).lower()
    per_device = dict(p.split(":", 1) for p in b.split(",") if ":" in p)
    if per_device:
        if "cpu" in per_device:
            return None
        b = per_device.get("cuda", b)
    return "cuda" if b == "nccl" else None


def _agree(g, what, err, same):
    """Every rank's (err, same): raise everywhere if any rank failed or
    ``same`` differs between ranks."""
    got = g.gather(what, (err, same))
    for r, (e, _) in enumerate(got):
        if e:
            raise CheckpointError("nvio.%s failed on rank %d: %s: %s"
                                  % (what, r, g.path, e), g.path)
    for r, (_, s) in enumerate(got):
        if s != got[0][1]:
            raise CheckpointError("nvio.%s: %s: rank %d sees a different checkpoint "
                                  "than rank 0 (%r vs %r)" % (what, g.path, r, s, got[0][1]),
                                  g.path)
