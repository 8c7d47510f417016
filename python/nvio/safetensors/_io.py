"""Reading and writing one safetensors file through libnvio.

Load: two small reads (length, header), the header validated whole, then
ONE read of the data region into one page-aligned buffer (private memory
with transparent huge pages, page-locked with ``pin_memory=True``, or CUDA
memory) starting at the page below the data region, so that libnvio moves
it with O_DIRECT; tensors are views into it. ``copy=True`` reads every
tensor straight into memory of its own with one vectored op instead.

Save: the layout (header bytes, offsets) is decided first (``_format``),
then the file is an ATOMIC nvio file like nvio.save's: one vectored write
of the header and every tensor's bytes from their memory, fsync, rename
over the destination, fsync of the directory. Any error leaves the old
file as it was.
"""
from __future__ import annotations

import sys

import torch

from .. import _device, _nvio
from .._base.handle import default_handle
from .._base.pieces import alloc_host as _alloc_host
from .._base.pieces import read_pieces as _read_pieces
from .._base.pieces import write_device
from .._base.plan import gc_paused
from .._base.space import open_atomic, reserve_space
from .._base.stformat import (BY_TORCH, PACKED, PREFIX, SafetensorsError, _open_error, _path,
                              header_length, layout, parse_header)
from .._base.views import u8
from ._shared import shared_groups

#: Bytes of a file read with the length prefix in one go (most headers fit).
FIRST_READ = 64 << 10
#: Tensors are read in runs of up to this many bytes, each into a buffer of
#: its own: filling a fresh buffer (faulting its pages in) costs about as
#: much CPU time as reading it here, so run k+1's buffer is made while run k
#: is read instead of one buffer for the file first and all reads after.
RUN_BYTES = 64 << 20
PAGE = 4096


#: safetensors' ``backend`` values. nvio never maps a file: both read
#: through libnvio; what each means for nvio is in :func:`check_backend`.
BACKENDS = ("mmap", "pread")


def check_backend(backend):
    """The ``backend`` argument as safetensors 0.8 takes it: "mmap" (its
    default) or "pread"; anything else is refused as safetensors refuses it
    (TypeError for a non-str, SafetensorsError, a SafetensorError, for an
    unknown name). Neither changes how nvio reads the file (libnvio reads
    it, never mapping it); in load_file "pread" gives each tensor memory of
    its own (as ``copy=True``), "mmap" makes them views into buffers shared
    by runs of tensors."""
    if not isinstance(backend, str):
        raise TypeError("nvio.safetensors: backend must be a str (%s), not %s"
                        % (" or ".join(map(repr, BACKENDS)), type(backend).__name__))
    if backend not in BACKENDS:
        raise SafetensorsError("nvio.safetensors: backend %r is not one of %s"
                               % (backend, ", ".join(map(repr, BACKENDS))))
    return backend


def open_file(h, path, flags):
    """h.open(path, flags); a failure to open raises :func:`_open_error`."""
    try:
        return h.open(path, flags)
    except OSError as e:
        if not e.errno:
            raise
        raise _open_error(e, path) from None


def target_device(device, path=None):
    """torch.device for a device argument as safetensors takes it (a string,
    an int meaning a CUDA device, a torch.device); only CPU and CUDA."""
    if isinstance(device, int) and not isinstance(device, bool):
        device = torch.device("cuda", device)
    try:
        d = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError("nvio.safetensors: bad device %r: %s" % (device, e)) from None
    if d.type == "cpu":
        return d
    if d.type != "cuda":
        raise ValueError("nvio.safetensors: device %r: only 'cpu' and CUDA devices are "
                         "supported (load to 'cpu' and move the tensors)" % (device,))
    if not _device.cuda_available():
        raise RuntimeError("nvio.safetensors: %sdevice %r asked for, but CUDA is not "
                           "available here (torch.cuda.is_available() is False)"
                           % ("%s: " % path if path else "", str(d)))
    return d


def read_header(f, path):
    """(Header, first bytes read) of an open nvio File."""
    size = f.size
    first = bytearray(min(size, FIRST_READ))
    if first:
        f.pread(first, 0)
    n = header_length(first, size, path)
    if PREFIX + n <= len(first):
        raw = memoryview(first)[PREFIX:PREFIX + n]
    else:
        raw = bytearray(n)
        f.pread(raw, PREFIX)
    return parse_header(raw, size, path)


def view(storage, byte_off, entry):
    """A tensor of entry's dtype and shape over storage's bytes from
    byte_off: a view when the offset suits the dtype's alignment, else a
    copy (files not written by safetensors may place tensors anywhere)."""
    dtype = entry.dtype.torch
    shape = entry.torch_shape()
    if entry.nbytes == 0:
        return torch.empty(shape, dtype=dtype, device=storage.device)
    es = torch._utils._element_size(dtype)
    if byte_off % es == 0:
        t = torch.empty(0, dtype=dtype, device=storage.device)
        return t.set_(storage, byte_off // es, shape)
    raw = u8(storage)[byte_off:byte_off + entry.nbytes].clone()
    return raw.view(dtype).reshape(shape)


def check_torch(header, path):
    """Every tensor has a torch dtype and a shape torch can hold."""
    for e in header.entries.values():
        if e.dtype.torch is None:
            raise SafetensorsError("nvio.safetensors: %s: tensor %r: dtype %s has no torch "
                                   "dtype in torch %s" % (path, e.name, e.dtype.code,
                                                          torch.__version__), path)
        k = PACKED.get(e.dtype.code)
        if k and (not e.shape or e.shape[-1] % k):
            raise SafetensorsError("nvio.safetensors: %s: tensor %r: %s shape %r: the last "
                                   "dimension must be a multiple of %d to load as %s"
                                   % (path, e.name, e.dtype.code, e.shape, k, e.dtype.torch),
                                   path)


def alloc(nbytes, device, pin):
    """An untyped storage of nbytes for O_DIRECT reads: CUDA memory, or
    page-aligned host memory: with pin None nvio's own (LockedBuffer: 2 MiB
    aligned, huge pages, page-locked where RLIMIT_MEMLOCK allows; on the
    development VMs filling it is 3x faster than faulting in private mmap
    memory), with True memory that must be locked, with False private mmap
    memory (swappable)."""
    if device.type == "cpu":
        if pin is None:
            if nbytes < (64 << 10):
                return torch.UntypedStorage(nbytes)
            return torch.frombuffer(_nvio.LockedBuffer(nbytes), dtype=torch.uint8).untyped_storage()
        return _alloc_host(nbytes, pin)
    return _device.empty(nbytes, device)


def tensors_from(header, storage, skip, order=None):
    """{name: view} of every tensor over a buffer holding the data region
    from byte skip on, in file order."""
    es = order if order is not None else header.by_offset()
    return {e.name: view(storage, skip + e.begin, e) for e in es}


def runs(header, limit):
    """Runs of consecutive tensors (file order) of at most limit bytes each
    (a larger tensor is a run of its own)."""
    run, size = [], 0
    for e in header.by_offset():
        if run and size + e.nbytes > limit:
            yield run
            run, size = [], 0
        run.append(e)
        size += e.nbytes
    if run:
        yield run


def submit_run(f, header, run, device, pin):
    """Allocate a buffer for a run of tensors and start reading it, from the
    page below its first byte: (future or None, storage, skip, run)."""
    lo = (header.data_start + run[0].begin) & ~(PAGE - 1)
    hi = header.data_start + run[-1].end
    storage = alloc(hi - lo, device, pin)
    fut = f.pread_async(u8(storage), lo) if hi > lo else None
    return fut, storage, header.data_start - lo, run


def read_runs(f, header, device, pin, futs, limit=None):
    """Start reading a whole file, run by run: each run's buffer is filled
    (its pages faulted in) while the runs before it are read. Appends the
    futures to futs; returns [(storage, skip, run)] for tensors_of_runs."""
    out = []
    for run in runs(header, RUN_BYTES if limit is None else limit):
        fut, storage, skip, run = submit_run(f, header, run, device, pin)
        if fut is not None:
            futs.append(fut)
        out.append((storage, skip, run))
    return out


def tensors_of_runs(parts):
    out = {}
    for storage, skip, run in parts:
        for e in run:
            out[e.name] = view(storage, skip + e.begin, e)
    return out


def wait_all(futs):
    """Wait for every future (also after a failure: buffers stay busy until
    then), then raise the first error."""
    first = None
    for fu in futs:
        try:
            fu.result()
        except BaseException as e:  # noqa: BLE001  (re-raised below)
            if first is None:
                first = e
    if first is not None:
        raise first


def read_owned(f, header, device, pin):
    """{name: tensor}, each tensor in memory of its own, filled by one
    vectored read (in file order)."""
    out = {}
    pieces = []
    for e in header.by_offset():
        shape = e.torch_shape()
        if (device.type == "cpu" and e.nbytes >= (64 << 10)) or device.type == "cuda":
            t = view(alloc(e.nbytes, device, pin), 0, e)
        else:
            t = torch.empty(shape, dtype=e.dtype.torch, device=device)
        out[e.name] = t
        if e.nbytes:
            pieces.append((t.view(-1).view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8),
                           header.data_start + e.begin))
    _read_pieces(f, pieces)
    return out


def pin_flag(pin_memory):
    return None if pin_memory is None else _nvio.check_flag(pin_memory, "pin_memory")


def load_file(filename, device="cpu", *, backend="mmap", copy=False, pin_memory=None,
              handle=None):
    """Load a safetensors file like ``safetensors.torch.load_file``: a dict
    of tensors in file order.

    The data region is read by libnvio in parallel with direct I/O into
    page-aligned buffers (one per run of up to 64 MiB of whole tensors, each
    made while the runs before it are read) and the tensors are views into
    them; with ``copy=True``
    each tensor gets memory of its own (read straight into it). The buffer
    is CUDA memory for a CUDA ``device``; on the CPU (``pin_memory``) nvio's
    huge-page memory, page-locked where RLIMIT_MEMLOCK allows (None, the
    default), memory that must be locked (True, else an error naming the
    limit), or private swappable memory (False).
    ``backend``: safetensors' argument, "mmap" (the default: runs of tensors
    share buffers, as above) or "pread" (each tensor in memory of its own,
    as ``copy=True``); libnvio reads the file either way and never maps it.
    ``handle``: the :class:`nvio.AioHandle` to use (by default the one
    shared by nvio's checkpoint functions). Every malformed file raises
    :class:`SafetensorsError` naming the file and the tensor.
    """
    path = _path(filename)
    pread = check_backend(backend) == "pread"
    h = handle if handle is not None else default_handle()
    with open_file(h, path, _nvio.FILE_READ) as f:
        header = read_header(f, path)
        check_torch(header, path)
        dev = target_device(device, path)
        pin = pin_flag(pin_memory)
        if _nvio.check_flag(copy, "copy") or pread:
            return read_owned(f, header, dev, pin)
        futs = []
        try:
            parts = read_runs(f, header, dev, pin, futs)
        finally:
            wait_all(futs)
    return tensors_of_runs(parts)


def load(data, *, device="cpu"):
    """``safetensors.torch.load``: tensors from the bytes of a whole file,
    owning their memory (one copy of the data region)."""
    mv = memoryview(data).cast("B")
    n = header_length(mv[:PREFIX], len(mv))
    header = parse_header(mv[PREFIX:PREFIX + n], len(mv))
    check_torch(header, "<bytes>")
    dev = target_device(device)
    region = mv[header.data_start:]
    storage = torch.frombuffer(bytearray(region), dtype=torch.uint8) if len(region) else \
        torch.empty(0, dtype=torch.uint8)
    if dev.type != "cpu":
        storage = storage.to(dev)
    return tensors_from(header, storage.untyped_storage(), 0)


# --- saving -------------------------------------------------------------------


# These three messages are worded as the safetensors library words them, on
# purpose: its own test suite (run against nvio by tests/peers) and code
# written for it compare them verbatim.
COMPAT_NOT_DICT = "Expected a dict of [str, torch.Tensor] but received %s"
COMPAT_NOT_TENSOR = "Key `%s` is invalid, expected torch.Tensor but received %s"
COMPAT_SPARSE = ("You are trying to save a sparse tensors: `%s` which this library does not "
                 "support. You can make it a dense tensor before saving with `.to_dense()` but "
                 "be aware this might make a much larger file than needed.")


def check_tensors(tensors):
    """Refuse what the safetensors library refuses, with the same exception
    types (code written for it catches them): not a dict of tensors or a
    sparse tensor (ValueError), a key not a str (TypeError), tensors
    sharing memory (RuntimeError), a non-contiguous tensor (ValueError), a
    meta tensor (NotImplementedError, a RuntimeError, as torch raises for
    reading one)."""
    if not isinstance(tensors, dict):
        raise ValueError(COMPAT_NOT_DICT % type(tensors))
    sparse = []
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise TypeError("nvio.safetensors: tensor names must be str; %r is %s"
                            % (k, type(k).__name__))
        if not isinstance(v, torch.Tensor):
            raise ValueError(COMPAT_NOT_TENSOR % (k, type(v)))
        if v.layout != torch.strided:
            sparse.append(k)
    if sparse:
        raise ValueError(COMPAT_SPARSE % sparse)
    shared = shared_groups(tensors)
    if shared:
        raise RuntimeError("nvio.safetensors: these tensors share memory, which safetensors "
                           "cannot store (each would be written in full, and loading would "
                           "not share them again): %s. Save one name per storage (as "
                           "save_model does) or clone them." % shared)
    for k, v in tensors.items():
        if v.device.type == "meta":
            raise NotImplementedError("nvio.safetensors: tensor %r is on the meta device: "
                                      "Cannot copy out of meta tensor (it has no data)" % k)
        if not v.is_contiguous():
            raise ValueError("nvio.safetensors: tensor %r is not contiguous, which safetensors "
                             "cannot store: call .contiguous() on it (or save the tensor it "
                             "views)" % k)
        if v.dtype not in BY_TORCH:
            raise ValueError("nvio.safetensors: tensor %r: dtype %s has no safetensors dtype"
                             % (k, v.dtype))


def plan(tensors, metadata):
    """(header bytes, [(name, data offset, flat uint8 tensor)]) of a save;
    the tensors are in host memory or CUDA memory."""
    if sys.byteorder != "little":
        raise NotImplementedError("nvio.safetensors: saving on a big-endian machine")
    check_tensors(tensors)
    specs = []
    for k, v in tensors.items():
        dt = BY_TORCH[v.dtype]
        shape = list(v.shape)
        if dt.code in PACKED:
            shape[-1] *= PACKED[dt.code]
        specs.append((k, dt, shape, v.numel() * v.element_size()))
    head, placed = layout(specs, metadata)
    data = []
    for name, begin, end in placed:
        t = tensors[name]
        if end > begin:
            if t.device.type != "cpu" and not _device.is_device(t.untyped_storage()):
                t = t.cpu()         # another device's (mps, xpu): a host copy
            data.append((name, len(head) + begin, t.reshape(-1).view(torch.uint8)))
    return head, data


def save(tensors, metadata=None):
    """``safetensors.torch.save``: the bytes of a safetensors file."""
    head, data = plan(tensors, metadata)
    size = len(head) + sum(t.numel() for _, _, t in data)
    out = bytearray(size)
    out[:len(head)] = head
    dst = torch.frombuffer(out, dtype=torch.uint8) if size else None
    for _, off, t in data:
        if _device.is_device(t.untyped_storage()):
            _device.copy_to_host(dst[off:off + t.numel()], t.untyped_storage(),
                                 t.storage_offset())
        else:
            dst[off:off + t.numel()].copy_(t)
    return bytes(out)


def save_file(tensors, filename, metadata=None, *, durable=True, handle=None, spare=False):
    """Save like ``safetensors.torch.save_file``: the same bytes, written by
    libnvio straight from the tensors' memory, crash-safe.

    The file replaces ``filename`` only once complete (an unnamed temporary
    beside it, fsync, rename, fsync of the directory, as :func:`nvio.save`);
    on any error (a refused tensor, ENOSPC, EIO, Ctrl-C) ``filename`` keeps
    its old content and no temporary is left. ``durable=False`` skips the
    fsyncs. Shared and non-contiguous tensors are refused as safetensors
    refuses them (RuntimeError, ValueError). CUDA tensors go to the file
    straight from device memory (the handle's bounce buffers, or cuFile on
    a GdsHandle), with no host copy. ``spare=True`` writes into the blocks
    of the file's previous version, kept beside it as a hidden spare (as
    :func:`nvio.save`'s ``spare``: faster on thin or loop-backed disks, one
    more copy of the file on disk).
    """
    path = _path(filename)
    with gc_paused():           # a state's thousands of pieces start no collection
        head, data = plan(tensors, metadata)
        on_dev = [(t, off) for _, off, t in data if _device.is_device(t.untyped_storage())]
        host = [(t, off) for _, off, t in data if not _device.is_device(t.untyped_storage())]
        write_planned(path, head, host, on_dev, durable=durable, spare=spare, handle=handle)


def _nbytes(b):
    if isinstance(b, torch.Tensor):
        return b.numel() * b.element_size()
    return memoryview(b).nbytes


def write_planned(path, head, host, on_dev=(), *, durable=True, spare=False, handle=None):
    """Write a planned file atomically: the header bytes at 0, then host
    pieces [(buffer, offset)] in vectored writes and CUDA pieces [(flat
    uint8 tensor, offset)] through the handle's device path."""
    size = max([len(head)] + [off + _nbytes(b) for b, off in list(host) + list(on_dev)])
    h = handle if handle is not None else default_handle()
    durable, spare = _nvio.check_flag(durable, "durable"), _nvio.check_flag(spare, "spare")
    with open_atomic(h, path, durable, spare,
                     lambda p, flags: open_file(h, p, flags)) as f:   # abandoned on errors
        reserve_space(f, size)
        pieces = [(head, 0)] + list(host)
        if on_dev:
            _device.synchronize([t.untyped_storage() for t, _ in on_dev])
        step = _nvio.MAX_IOV
        futs = write_device(f, list(on_dev)) if on_dev else []
        try:
            for i in range(0, len(pieces), step):
                f.pwritev(pieces[i:i + step], _nvio.OFFSET_PER_IOV)
        finally:
            wait_all(futs)
        f.commit()
