"""Device memory for nvio's applications: the one place where they
allocate the CUDA memory a load reads into.

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
  for a real one).
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


def to_host(storage):
    """A storage the host can read: itself on the CPU, else a CPU copy."""
    if _provider is not None and _provider.owns(storage):
        return _provider.to_host(storage)
    return storage if storage.device.type == "cpu" else storage.cpu()
