"""Where a streamed model's weights live on disk, and how a block's weights
land in a pool slot (private to nvio.offload._fromdisk).

Two sources:

* **safetensors** (headers and indexes parsed by nvio.safetensors) written by ``save_pretrained`` (one file, or shards with a
  ``model.safetensors.index.json``): each tensor's bytes sit at
  ``8 + header_len + begin`` of its file. Direct I/O wants offsets, lengths
  and memory aligned to 4 KiB, so a block is read as the aligned superset
  of its tensors' byte ranges (runs of tensors that lie together in the
  file, each run widened to 4 KiB boundaries and clamped to the file's
  end) placed at 4 KiB-aligned offsets of the slot; a tensor is then a view
  at ``slot_run + (file_offset - run_start)``. The slot pays up to 8 KiB of
  padding per run (runs, not tensors: a block's tensors lie together).
* **nvio's weight store** (``nvio-weights.bin`` + ``nvio-weights.json`` in
  ``dir``), written once from a model in memory: every block contiguous
  and starting on a 4 KiB boundary, each tensor 64-byte aligned inside it,
  so a block is one aligned read and the slot layout is the file layout.
  The resident tensors are stored too, so that a model built on the meta
  device can be filled from the store. The manifest carries a fingerprint
  (names, shapes, dtypes, block names, layout version) and a sample hash
  of the contents (64 bytes at the head, middle and tail of every tensor),
  checked against the model and against the data file before reuse. It
  also holds a CRC-32 of every block and of every tensor (stores written
  before them have none), checked as blocks are read, and every field of
  it is checked against what nvio writes (check_manifest) before use.

Everything here is pure layout or small buffered reads of headers and
samples; the bulk bytes move through libnvio in _fromdisk.py.
"""
from __future__ import annotations

import hashlib
import json
import os

import torch

from .._base import stformat as stf
from . import _trust

__all__ = []

ALIGN = 4096            # file offset / length / memory alignment of direct reads
TENSOR_ALIGN = 64       # a tensor's start inside a store block
RUN_GAP = 64 << 10      # tensors closer than this in a file are read as one run
SAMPLE = 64             # bytes sampled at each of head, middle, tail
STORE_DATA = "nvio-weights.bin"
STORE_MANIFEST = "nvio-weights.json"
STORE_FORMAT = "nvio-weight-store"
STORE_VERSION = 1

class WeightsError(ValueError):
    """A weight file that cannot be used as it is (names the file)."""


class StoreCorruptError(WeightsError):
    """nvio's weight store fails its checks: a manifest field outside what
    nvio writes (``field`` names it, e.g. ``blocks[2].tensors[0][2]``), or
    a manifest that disagrees with the store's layout. ``path``: the file."""

    def __init__(self, msg, path=None, field=None):
        super().__init__(msg)
        self.path, self.field = path, field


#: Blocks (and tensors in one block) a manifest may list at most.
STORE_BLOCKS_MAX = 1 << 20


def align_up(n, a=ALIGN):
    return (n + a - 1) // a * a


def align_down(n, a=ALIGN):
    return n // a * a


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


# --- safetensors ------------------------------------------------------------


class StEntry:
    """One tensor of a safetensors file: absolute byte range [start, end)."""

    __slots__ = ("path", "dtype", "shape", "start", "end")

    def __init__(self, path, dtype, shape, start, end):
        self.path, self.dtype, self.shape, self.start, self.end = path, dtype, shape, start, end


def read_safetensors_header(path):
    """{name: StEntry} of a safetensors file, its header validated completely
    by nvio.safetensors before anything is read by it. Tensors of a dtype
    torch lacks are left out (no model tensor can match them)."""
    try:
        with _trust.open_regular(path, "rb", WeightsError) as f:
            size = os.fstat(f.fileno()).st_size
            n = stf.header_length(f.read(stf.PREFIX), size, path)
            raw = f.read(n)
    except OSError as e:
        raise WeightsError("nvio: cannot read safetensors file %s: %s" % (path, e)) from e
    h = stf.parse_header(raw, size, path)
    return {name: StEntry(path, e.dtype.torch, e.torch_shape(), h.data_start + e.begin,
                          h.data_start + e.end)
            for name, e in h.entries.items() if e.dtype.torch is not None}


def find_safetensors(dir):
    """The safetensors files of a save_pretrained directory (one file, or
    shards with an index): {name: StEntry} over all of them, or None when
    dir holds no safetensors file."""
    if dir is None or not os.path.isdir(dir) or \
            not any(f.endswith(".safetensors") for f in os.listdir(dir)):
        return None
    files, where = stf.resolve(dir)
    out = {}
    for p in files:
        for name, e in read_safetensors_header(p).items():
            if where is None or where.get(name) == p:
                out[name] = e
    if where is not None:
        missing = [k for k in where if k not in out]
        if missing:
            raise WeightsError("nvio: %s: the index places tensor %r in this shard, but its "
                               "header does not list it" % (where[missing[0]], missing[0]))
    return out


# --- layouts ----------------------------------------------------------------


class Slice:
    """Where one tensor of a block sits in a slot: bytes [off, off + nbytes)."""

    __slots__ = ("name", "off", "nbytes", "dtype", "shape")

    def __init__(self, name, off, nbytes, dtype, shape):
        self.name, self.off, self.nbytes, self.dtype, self.shape = name, off, nbytes, dtype, shape


class BlockLayout:
    """A block's slot layout and its reads.

    slices: {tensor name: Slice}; reads: {path: [(slot_off, file_off, nbytes)]}
    sorted by file offset, no overlap; size: slot bytes the block needs."""

    __slots__ = ("slices", "reads", "size", "file_bytes")

    def __init__(self):
        self.slices, self.reads, self.size, self.file_bytes = {}, {}, 0, 0


def layout_safetensors(tensors, entries, file_sizes, align=ALIGN, gap=RUN_GAP):
    """Lay a block's tensors [(name, dtype, shape)] out in a slot from their
    safetensors entries: the aligned superset of each run of neighbouring
    tensors, each run at an aligned slot offset. A tensor whose file offset
    does not suit its dtype gets an exact read of its own."""
    lay = BlockLayout()
    by_file = {}
    for name, _dt, _shape in tensors:
        e = entries[name]
        by_file.setdefault(e.path, []).append((e.start, e.end, name))
    off = 0
    for path in sorted(by_file):
        items = sorted(by_file[path])
        fsize = file_sizes[path]
        runs = []          # [start, end, [(name, start, end)]] or exact singletons
        for s, e, name in items:
            esize = entries[name].dtype.itemsize
            if s % max(esize, 1):
                runs.append([s, e, [(name, s, e)], True])
                continue
            if runs and not runs[-1][3] and s - runs[-1][1] <= gap:
                r = runs[-1]
                r[1] = max(r[1], e)
                r[2].append((name, s, e))
            else:
                runs.append([s, e, [(name, s, e)], False])
        reads = []
        for s, e, members, exact in runs:
            if exact:
                rs, re_ = s, e
            else:
                rs, re_ = align_down(s, align), min(align_up(e, align), fsize)
            for name, ts, te in members:
                ent = entries[name]
                lay.slices[name] = Slice(name, off + ts - rs, te - ts, ent.dtype, ent.shape)
            reads.append((off, rs, re_ - rs))
            lay.file_bytes += re_ - rs
            off = align_up(off + re_ - rs, align)
        reads.sort(key=lambda r: r[1])
        lay.reads[path] = reads
    lay.size = off
    return lay


def layout_store(blocks, align=ALIGN, tensor_align=TENSOR_ALIGN):
    """The store's layout for [[(name, dtype, shape)] per block] (the last
    list: the resident tensors): [(file offset, BlockLayout)] and the file
    size. Block k starts on an aligned boundary; its slot layout is its
    file layout (slot offset = file offset - block start)."""
    out, pos = [], 0
    for tensors in blocks:
        lay = BlockLayout()
        off = 0
        for name, dt, shape in tensors:
            n = _nbytes(dt, shape)
            off = align_up(off, tensor_align)
            lay.slices[name] = Slice(name, off, n, dt, tuple(shape))
            off += n
        lay.size = align_up(off, align)
        lay.file_bytes = lay.size
        out.append((pos, lay))
        pos += lay.size
    return out, pos


def _nbytes(dtype, shape):
    n = dtype.itemsize
    for s in shape:
        n *= s
    return n


# --- fingerprints, samples, manifests ---------------------------------------


def fingerprint(block_names, blocks):
    """sha256 of the store's shape: layout version, block names, and every
    tensor's name, dtype and shape, in order."""
    desc = {"version": STORE_VERSION, "align": ALIGN, "tensor_align": TENSOR_ALIGN,
            "blocks": [[bn, [[n, dtype_name(dt), list(sh)] for n, dt, sh in ts]]
                       for bn, ts in zip(block_names, blocks)]}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()


def sample_ranges(nbytes):
    """The (offset, length) pairs sampled in a tensor of nbytes."""
    if nbytes <= 3 * SAMPLE:
        return [(0, nbytes)]
    return [(0, SAMPLE), (nbytes // 2 // SAMPLE * SAMPLE, SAMPLE), (nbytes - SAMPLE, SAMPLE)]


def sample_tensor(h, t):
    """Feed the sampled bytes of a CPU tensor to hash h."""
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    b = t.contiguous().reshape(-1).view(torch.uint8)
    for o, n in sample_ranges(b.numel()):
        h.update(b[o:o + n].numpy().tobytes())


def open_data(path):
    """A store or safetensors data file opened for sampling (regular files only)."""
    return _trust.open_regular(path, "rb", WeightsError)


def sample_file(h, f, off, nbytes):
    """Feed the sampled bytes of the file range [off, off + nbytes) to h."""
    for o, n in sample_ranges(nbytes):
        data = os.pread(f.fileno(), n, off + o)
        if len(data) != n:
            raise WeightsError("nvio: %s: %d bytes at offset %d, file ends early"
                               % (f.name, n, off + o))
        h.update(data)


def read_manifest(dir):
    """The store's manifest, or None when dir holds no store. Every field is
    checked (StoreCorruptError names the first that is not as nvio writes
    it) before anything is read by it."""
    p = os.path.join(dir, STORE_MANIFEST)

    def err(msg, field=None):
        return StoreCorruptError("nvio: weight store manifest " + msg, p, field)
    try:
        m = json.loads(_trust.read_index(p, err))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        if isinstance(e, StoreCorruptError):
            raise
        raise StoreCorruptError("nvio: bad weight store manifest %s: %s" % (p, e), p) from None
    if not isinstance(m, dict) or m.get("format") != STORE_FORMAT:
        raise StoreCorruptError("nvio: %s is no nvio weight store manifest" % p, p, "format")
    check_manifest(m, _trust.Fields(p, err))
    return m


def check_manifest(m, F):
    """Every field of a manifest, as _fromdisk's _write_store writes it:
    blocks (with their CRC-32s, absent in stores written before them)
    inside data_size, in order, not overlapping."""
    F.dict(m, "", ("format", "version", "fingerprint", "sample", "data", "data_size",
                   "blocks"))
    F.int(m["version"], "version", STORE_VERSION, STORE_VERSION)
    F.str(m["fingerprint"], "fingerprint", hexlen=64)
    F.str(m["sample"], "sample", hexlen=64)
    F.str(m["data"], "data", choices=(STORE_DATA,))
    size = F.int(m["data_size"], "data_size", 0, 1 << 62)
    pos = 0
    for i, b in enumerate(F.list(m["blocks"], "blocks", limit=STORE_BLOCKS_MAX)):
        at = "blocks[%d]" % i
        F.dict(b, at, ("name", "offset", "nbytes", "tensors"), ("crc32",))
        F.str(b["name"], at + ".name")
        off = F.int(b["offset"], at + ".offset", pos, size, multiple=ALIGN)
        if off != pos:
            F.fail(at + ".offset", "%d, but the block before ends at %d" % (off, pos))
        n = F.int(b["nbytes"], at + ".nbytes", 0, size - off, multiple=ALIGN)
        pos = off + n
        if "crc32" in b:
            F.crc(b["crc32"], at + ".crc32")
        end = 0
        for j, t in enumerate(F.list(b["tensors"], at + ".tensors", limit=STORE_BLOCKS_MAX)):
            tat = "%s.tensors[%d]" % (at, j)
            F.list(t, tat)
            if len(t) not in (4, 5):
                F.fail(tat, "must be [name, dtype, shape, offset(, crc32)], not %d items"
                       % len(t))
            F.str(t[0], tat + "[0]")
            dt = F.dtype(t[1], tat + "[1]")
            shape = F.shape(t[2], tat + "[2]")
            toff = F.int(t[3], tat + "[3]", end, n, multiple=TENSOR_ALIGN)
            end = toff + _trust.nbytes(dt, shape)
            if end > n:
                F.fail(tat + "[2]", "%s %s at offset %d ends at %d, past the block's %d bytes"
                       % (t[1], t[2], toff, end, n))
            if len(t) == 5:
                F.crc(t[4], tat + "[4]")
    if pos != size:
        F.fail("data_size", "%d, but the blocks end at %d" % (size, pos))


def write_manifest(dir, m):
    """Write the manifest all or nothing (temporary, fsync, rename)."""
    p = os.path.join(dir, STORE_MANIFEST)
    tmp = p + ".tmp.%d" % os.getpid()
    try:
        with _trust.open_regular(tmp, "w", WeightsError) as f:
            json.dump(m, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, p)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
