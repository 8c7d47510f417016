"""Device memory for nvio's applications: the one place where they
allocate the CUDA memory a load reads into, tell a storage in device
memory from one in host memory, and copy device bytes to the host where
the host must see them (CRC-32s, snapshots).

With torch's CUDA build this is ``torch.empty(..., device="cuda")``. A
*provider* may be installed instead (private: the tests install one that
allocates device memory of the simulated CUDA driver, tests/sim/, and
presents it to torch's CPU build as a CPU storage whose bytes the host
cannot touch). libnvio finds such memory to be device memory through the
driver loaded in the process, exactly as it finds a real CUDA tensor's, so
the bytes travel nvio's GPU paths (bounce buffers or cuFile).

A provider has these methods:

* ``is_available()``: whether it can allocate now (stands for
  ``torch.cuda.is_available()``);
* ``empty(nbytes, device)``: a ``torch.UntypedStorage`` of nbytes of
  device memory for a ``torch.device`` of type ``cuda``;
* ``owns(storage)``: whether a storage's memory is its device memory;
* ``to_host(storage)``: a CPU copy of such a storage (what ``.cpu()`` is
  for a real one);
* ``device_index(storage)``: the CUDA device its memory is on;
* ``copy_to_host(dst_address, src_address, nbytes)``: a synchronous copy
  from its device memory to host memory through the CUDA driver (what
  ``cpu_tensor.copy_(cuda_tensor)`` does for a real one);
  ``copy_to_device(dst_address, src_address, nbytes)`` the other way;
* the stream and event methods listed below (offload.run_from_disk).

Saving from device memory (nvio.save) hands the device storages to
libnvio as they are: they move to the file through its bounce buffers
(AioHandle) or cuFile (GdsHandle), never through a host copy of the whole
tensor. Only their CRC-32, which the zip format needs, is computed from a
second copy, made in small chunks by :func:`copy_to_host`.
"""
import torch

_provider = None


def _set_provider(p):
    """Install p (None: back to torch.cuda); returns the one it replaces."""
    global _provider
    old, _provider = _provider, p
    return old


def cuda_available():
    """Whether a CUDA destination can be allocated here."""
    if _provider is not None:
        return bool(_provider.is_available())
    return torch.cuda.is_available()


def empty(nbytes, device):
    """An untyped storage of nbytes on device (a torch.device or string);
    CPU devices get torch's ordinary memory."""
    d = torch.device(device)
    if d.type == "cuda" and _provider is not None:
        return _provider.empty(nbytes, d)
    return torch.empty(nbytes, dtype=torch.uint8, device=d).untyped_storage()


def is_device(storage):
    """Whether a storage's memory is device memory (not readable by the host)."""
    if storage.device.type == "cuda":
        return True
    return _provider is not None and _provider.owns(storage)


def has_provider():
    """Whether a device provider is set (its memory may look like the CPU's)."""
    return _provider is not None


def any_provided(storages):
    """Whether any of these storages is a device provider's memory (never
    without a provider: no call per storage then)."""
    return _provider is not None and any(_provider.owns(s) for s in storages)


def to_host(storage):
    """A storage the host can read: itself on the CPU, else a CPU copy."""
    if _provider is not None and _provider.owns(storage):
        return _provider.to_host(storage)
    return storage if storage.device.type == "cpu" else storage.cpu()


def index(storage):
    """The CUDA device index of a device storage."""
    if _provider is not None and _provider.owns(storage):
        return int(_provider.device_index(storage))
    return storage.device.index if storage.device.index is not None else 0


def location(storage):
    """torch's location tag of a storage, as a checkpoint records it
    ("cpu", "cuda:0")."""
    if _provider is not None and _provider.owns(storage):
        return "cuda:%d" % index(storage)
    if storage.device.type == "cpu" and not _custom_tags():
        return "cpu"            # torch's tag, without walking its registry per storage
    return torch.serialization.location_tag(storage)


def plain_cpu_tags():
    """Whether every CPU storage's location tag is "cpu" (no device provider,
    whose memory looks like the CPU's, and no package's own tagger)."""
    return _provider is None and not _custom_tags()


_tags_seen = (-1, True)     # (registry length, whether some tagger is not torch's)


def _custom_tags():
    """Whether a package registered location taggers beyond torch's own
    (one could tag CPU storages differently: then torch's registry decides)."""
    global _tags_seen
    reg = getattr(torch.serialization, "_package_registry", None)
    if reg is None:
        return True
    n, custom = _tags_seen
    if n != len(reg):
        custom = any(getattr(getattr(e[1], "func", e[1]), "__module__", None)
                     != "torch.serialization" for e in reg)
        _tags_seen = (len(reg), custom)
    return custom


def synchronize(storages):
    """Wait for the work torch has queued on the current streams of the
    devices holding these storages: libnvio's copies run on streams of
    its own, which do not wait for torch's. (A provider's memory is
    written by synchronous calls only: nothing to wait for.)"""
    seen = set()
    for s in storages:
        d = s.device
        if d.type == "cuda" and d not in seen:
            seen.add(d)
            torch.cuda.current_stream(d).synchronize()


def _u8(storage):
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
        storage, 0, (storage.nbytes(),), (1,))


def copy_to_host(dst, storage, offset=0):
    """Copy ``dst.numel()`` bytes of ``storage`` from byte ``offset`` into
    ``dst``, a contiguous uint8 CPU tensor. Device memory comes over
    through the CUDA driver (torch's copy, or the provider's); host memory
    is copied by torch."""
    n = dst.numel()
    if offset < 0 or offset + n > storage.nbytes():
        raise ValueError("nvio: copy of %d bytes at %d from a storage of %d"
                         % (n, offset, storage.nbytes()))
    if n == 0:
        return
    if _provider is not None and _provider.owns(storage):
        _provider.copy_to_host(dst.data_ptr(), storage.data_ptr() + offset, n)
    else:
        dst.copy_(_u8(storage)[offset:offset + n])


def copy_to_device(dst, src):
    """Copy the contiguous uint8 CPU tensor src into the contiguous uint8
    tensor dst over device memory (same size), synchronously."""
    if dst.numel() != src.numel():
        raise ValueError("nvio: copy of %d bytes into %d" % (src.numel(), dst.numel()))
    if not dst.numel():
        return
    if _provider is not None and _provider.owns(dst.untyped_storage()):
        _provider.copy_to_device(dst.data_ptr(), src.data_ptr(), dst.numel())
    else:
        dst.copy_(src)


def alias(t):
    """A tensor equal to the contiguous tensor t whose storage holds exactly
    t's bytes, over t's own memory (no copy; the caller keeps t alive), as
    torch.save must see a view of part of a storage. Host and provider
    memory: a storage over the address range; CUDA memory: torch's
    storage over a device pointer, or (where torch lacks it) a copy made
    on the device by torch's clone."""
    n = t.numel() * t.element_size()
    if t.device.type == "cuda":
        make = getattr(torch._C, "_construct_storage_from_data_pointer", None)
        if make is None:
            return t.clone()
        s = make(t.data_ptr(), t.device, n)
    else:
        import ctypes
        mem = (ctypes.c_ubyte * n).from_address(t.data_ptr())
        s = torch.frombuffer(mem, dtype=torch.uint8).untyped_storage()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(s, 0, t.shape, t.stride())


def clone(t):
    """t's values in new memory of t's device, contiguous: torch's clone (a
    kernel on a GPU; never a copy through the host). A provider has no
    kernels: NotImplementedError."""
    if _provider is not None and t.numel() and _provider.owns(t.untyped_storage()):
        raise NotImplementedError("nvio: a strided copy within simulated device memory "
                                  "(torch's clone kernel on a GPU)")
    return t.clone(memory_format=torch.contiguous_format)


def copy_into(dst, src):
    """Copy the CPU tensor src's values into the device tensor dst (same
    shape; dtype converted on the host first): torch's copy_, or, for a
    provider's memory, a synchronous host-to-device copy of src's bytes
    (dst contiguous; a strided one needs a kernel: NotImplementedError)."""
    if _provider is not None and dst.numel() and _provider.owns(dst.untyped_storage()):
        if not dst.is_contiguous():
            raise NotImplementedError("nvio: a strided copy into simulated device memory "
                                      "(torch's copy kernel on a GPU)")
        src = src.to(dst.dtype).contiguous()
        copy_to_device(_flat_u8(dst), _flat_u8(src))
        return
    dst.copy_(src)


def _flat_u8(t):
    """A flat uint8 view of a contiguous tensor's bytes."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(
        t.untyped_storage(), t.storage_offset() * t.element_size(),
        (t.numel() * t.element_size(),), (1,))


# --- streams and events (run_from_disk's copies to the device) -----------------
#
# A provider stands in for these with the driver's streams, events and
# asynchronous copies: ``current_device()``, ``new_stream(index)``,
# ``current_stream(index)``, ``record(stream)`` (a new event),
# ``wait_event(stream, event)``, ``event_synchronize(event)``,
# ``copy_to_device_async(dst_address, src_address, nbytes, stream)``,
# ``host_register(address, nbytes)``, ``host_unregister(address)`` and
# ``to_device(tensor, index)``.


def current_device():
    """The index of the CUDA device torch uses now."""
    if _provider is not None:
        return int(_provider.current_device())
    return torch.cuda.current_device()


def _index_of(device):
    d = torch.device(device)
    return d.index if d.index is not None else current_device()


def new_stream(device):
    """A new stream on device (torch.cuda.Stream)."""
    if _provider is not None:
        return _provider.new_stream(_index_of(device))
    return torch.cuda.Stream(device)


def current_stream(device):
    """The stream torch's work on device is queued on now."""
    if _provider is not None:
        return _provider.current_stream(_index_of(device))
    return torch.cuda.current_stream(device)


def record(stream):
    """A new event recorded on stream (done once the work queued on it so
    far is)."""
    if _provider is not None:
        return _provider.record(stream)
    ev = torch.cuda.Event()
    ev.record(stream)
    return ev


def wait_event(stream, event):
    """Work queued on stream from now on waits for event."""
    if _provider is not None:
        return _provider.wait_event(stream, event)
    stream.wait_event(event)


def event_synchronize(event):
    """Block until event is done."""
    if _provider is not None:
        return _provider.event_synchronize(event)
    event.synchronize()


def copy_to_device_async(dst, src, stream):
    """Queue a copy of the host uint8 tensor src into the device uint8
    tensor dst (same size) on stream; src must stay untouched until an
    event recorded after it is done."""
    if dst.numel() != src.numel():
        raise ValueError("nvio: copy of %d bytes into %d" % (src.numel(), dst.numel()))
    if _provider is not None:
        if dst.numel():
            _provider.copy_to_device_async(dst.data_ptr(), src.data_ptr(), dst.numel(), stream)
        return
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)


def host_register(address, nbytes):
    """Page-lock host memory for the device's asynchronous copies; raises
    on failure."""
    if _provider is not None:
        return _provider.host_register(address, nbytes)
    torch.cuda.check_error(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0))


def host_unregister(address):
    if _provider is not None:
        return _provider.host_unregister(address)
    torch.cuda.cudart().cudaHostUnregister(address)


def to_device(t, device):
    """t on device (itself if it is there already), like ``t.to(device)``."""
    if _provider is not None:
        if t.numel() and _provider.owns(t.untyped_storage()):
            return t
        return _provider.to_device(t, _index_of(device))
    return t.to(device)
