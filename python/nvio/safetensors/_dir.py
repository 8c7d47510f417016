"""Hugging Face model directories: sharded loads, in-place loads, streams.

A directory holds ``model.safetensors`` or shards listed by
``model.safetensors.index.json`` (``{"weight_map": {tensor: shard file}}``).
Every shard's header is read and validated first; then every shard's data
is read by ONE nvio handle (its workers and queue depth are the one bounded
pool), all shards' ops in flight together.
"""
from __future__ import annotations

import collections

import torch

from .. import _nvio
from .._base.handle import default_handle
from .._base.stformat import _err, _path, resolve
from ._io import (check_torch, open_file, pin_flag, read_header,
                  read_runs, runs, submit_run, target_device, tensors_of_runs, view, wait_all)

def _check_index(where, headers):
    """Every tensor the index places in a shard is in that shard's header."""
    if where is None:
        return
    for name, shard in where.items():
        if name not in headers[shard].entries:
            raise _err(shard, "the index places tensor %r in this shard, but its header "
                       "does not list it" % name)


class _Shards:
    """Open files and validated headers of every shard (closed on exit)."""

    def __init__(self, path_or_dir, handle):
        self.paths, self.where = resolve(path_or_dir)
        self.h = handle if handle is not None else default_handle()
        self.files = {}
        self.headers = {}

    def __enter__(self):
        try:
            for p in self.paths:
                self.files[p] = f = open_file(self.h, p, _nvio.FILE_READ)
                self.headers[p] = read_header(f, p)
                check_torch(self.headers[p], p)
            _check_index(self.where, self.headers)
            seen = {}
            for p in self.paths:
                for name in self.headers[p].entries:
                    if name in seen:
                        raise _err(p, "tensor %r is also in %s" % (name, seen[name]))
                    seen[name] = p
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def close(self):
        for f in self.files.values():
            f.close()


def load_model_dir(path, device="cpu", *, pin_memory=None, handle=None):
    """Every tensor of a Hugging Face model directory (sharded with
    ``model.safetensors.index.json``, or one ``model.safetensors``) or of one
    file: {name: tensor}, shards in name order, each in file order.

    All shards are read at once by one nvio handle (its workers and queue
    depth bound the I/O in flight), in runs of whole tensors (up to 64 MiB)
    each into a page-aligned buffer (or CUDA memory) of which its tensors
    are views; a run's buffer is made while the runs before it are read.
    """
    dev = target_device(device, _path(path))
    pin = pin_flag(pin_memory)
    with _Shards(path, handle) as sh:
        parts, futs = [], []
        try:
            for p in sh.paths:
                parts += read_runs(sh.files[p], sh.headers[p], dev, pin, futs)
        finally:
            wait_all(futs)
    return tensors_of_runs(parts)


def _tied(sd, loaded):
    """Names of state_dict tensors whose memory is that of a loaded one."""
    ptrs = {(sd[n].device, sd[n].data_ptr()) for n in loaded if sd[n].numel()}
    return {n for n, t in sd.items() if t.numel() and (t.device, t.data_ptr()) in ptrs}


def load_into(module, path, *, strict=True, handle=None):
    """Fill an existing module's parameters and buffers in place from a
    model directory or file: each tensor's bytes are read straight into the
    parameter's memory (no second copy of the model); a parameter of another
    dtype is read into a temporary and converted.

    Returns (missing, unexpected) names like
    ``safetensors.torch.load_model``; with ``strict=True`` either raises
    RuntimeError. Tied parameters (sharing memory with a loaded one) are not
    missing. A shape mismatch raises SafetensorsError; a parameter on the
    meta device raises ValueError (load with :func:`load_model_dir` and
    ``module.load_state_dict(sd, assign=True)`` instead).
    """
    if not isinstance(module, torch.nn.Module):
        raise TypeError("nvio.safetensors.load_into: expected a torch.nn.Module, not %s"
                        % type(module).__name__)
    sd = module.state_dict()
    with _Shards(path, handle) as sh:
        loaded, unexpected, converts, futs = [], [], [], []
        try:
            for p in sh.paths:
                f, hd = sh.files[p], sh.headers[p]
                pieces = []
                for e in hd.by_offset():
                    t = sd.get(e.name)
                    if t is None:
                        unexpected.append(e.name)
                        continue
                    if tuple(t.shape) != e.torch_shape():
                        raise _err(p, "tensor %r has shape %s in the file but %s in the module"
                                   % (e.name, list(e.torch_shape()), list(t.shape)))
                    if t.device.type == "meta":
                        raise ValueError("nvio.safetensors.load_into: %r is on the meta device: "
                                         "load_model_dir() and load_state_dict(assign=True) "
                                         "instead" % e.name)
                    loaded.append(e.name)
                    if not e.nbytes:
                        continue
                    if t.dtype == e.dtype.torch and t.is_contiguous() and \
                            t.device.type in ("cpu", "cuda"):
                        dst = t
                    else:
                        dst = torch.empty(e.torch_shape(), dtype=e.dtype.torch, device=t.device)
                        converts.append((t, dst))
                    pieces.append((dst.reshape(-1).view(torch.uint8), hd.data_start + e.begin))
                step = _nvio.MAX_IOV
                for i in range(0, len(pieces), step):
                    futs.append(f.preadv_async(pieces[i:i + step], _nvio.OFFSET_PER_IOV))
        finally:
            wait_all(futs)
    with torch.no_grad():
        for t, tmp in converts:
            t.copy_(tmp)
    tied = _tied(sd, loaded)
    missing = [n for n in sd if n not in loaded and n not in tied]
    if strict and (missing or unexpected):
        msg = "Error(s) in loading state_dict for %s:" % type(module).__name__
        if missing:
            msg += "\n    Missing key(s) in state_dict: %s" % ", ".join(
                '"%s"' % k for k in sorted(missing))
        if unexpected:
            msg += "\n    Unexpected key(s) in state_dict: %s" % ", ".join(
                '"%s"' % k for k in sorted(unexpected))
        raise RuntimeError(msg)
    return missing, unexpected


def iter_tensors(path, *, window_bytes=256 << 20, device="cpu", pin_memory=None, handle=None):
    """Yield (name, tensor) of a file or model directory in file order
    (shards in name order) as their bytes arrive.

    The tensors are read ahead in runs of up to ``window_bytes // 2`` bytes,
    two runs in flight at most, so nvio holds at most ``window_bytes`` of
    buffers beyond those whose tensors the caller still keeps (a tensor
    larger than half the window is read alone). Each yielded tensor is a
    view of its run's buffer, valid as long as the caller keeps it.
    (``stream`` before 0.3: in nvio a Stream is libnvio's sequential
    reader or writer.)
    """
    window = int(window_bytes)
    if window < 2:
        raise ValueError("nvio.safetensors.iter_tensors: window_bytes must be >= 2, not %r"
                         % (window_bytes,))
    dev = target_device(device, _path(path))
    pin = pin_flag(pin_memory)
    pending = collections.deque()    # (future, storage, skip, entries)
    with _Shards(path, handle) as sh:
        try:
            for p in sh.paths:
                f, hd = sh.files[p], sh.headers[p]
                for run in runs(hd, window // 2):
                    while len(pending) >= 2:
                        yield from _deliver(pending.popleft())
                    pending.append(submit_run(f, hd, run, dev, pin))
            while pending:
                yield from _deliver(pending.popleft())
        finally:
            wait_all([p[0] for p in pending if p[0] is not None])


def _deliver(item):
    fut, storage, skip, run = item
    if fut is not None:
        fut.result()
    for e in run:
        yield e.name, view(storage, skip + e.begin, e)
