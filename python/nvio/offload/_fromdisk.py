"""Run a model from disk: its weights read from NVMe block by block as the
forward reaches them (ZeRO-Inference on nvio).

``run_from_disk(model, dir)`` (``stream_model`` before 0.3) changes the
model in place: the weights of its repeated blocks (a transformer's
decoder layers) leave memory; a pool of ``prefetch + 1`` page-aligned
locked slots, each sized for the largest block, takes their place. A forward pre-hook on each block makes sure its
weights are in a slot (one vectored read per weight file, submitted as a
tagged op whose future comes from nvio._futures) and points the block's
parameters and buffers at views of that slot; the forward hook points them
back at meta placeholders and starts reading the next block into the slot
just released, so ``prefetch`` blocks are read while one computes.
Everything else (embeddings, norms, lm_head, rotary buffers, whatever the
user pins) stays resident; the KV cache and activations are untouched.

CUDA (``device="cuda"``): each slot has a device twin; a block's host slot
is copied to it on a side stream, the block's work on torch's current
stream waits for that copy (an event), the slot's next copy waits for the
block's work (another event), and a host slot is refilled only once its
copy has ended. Streams, events and copies go through ``nvio._device``
(the tests run them on the simulated driver).

Peak resident weight memory = resident tensors + (prefetch + 1) slots
(``model._nvio_from_disk.stats()`` states and measures both).

The weights come from the model's safetensors (``save_pretrained``) when
they match it, else from nvio's own weight store written once to ``dir``
(see _weights.py for both layouts). ``run_from_memory(model)`` (or the
``running_from_disk(...)`` context manager) reads the weights back and removes every
hook, leaving the model as it was.
"""
from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import mmap
import os
import threading
import time

import torch
from torch import nn

from .. import _device, _nvio
from .._base.handle import env_direct, throughput_handle
from .._base.pieces import locked_buffer
from .._futures import completions
from . import _room
from . import _weights as W

__all__ = ["run_from_disk", "run_from_memory", "running_from_disk", "WeightReadError"]

_ATTR = "_nvio_from_disk"
_OLD_ATTR = "_nvio_streamer"     # its name before 0.3: the same object, removed with it
_HF_PATHS = ("model.layers", "model.decoder.layers", "transformer.h", "transformer.layers",
             "transformer.blocks", "gpt_neox.layers", "model.language_model.layers", "layers", "h")


class WeightReadError(OSError):
    """A block's weights could not be read from disk (names the layer and
    the file; the original NvioError is the ``__cause__``). ``StreamError``
    before 0.3."""


# --- public API ---------------------------------------------------------------


def run_from_disk(model, dir=None, device="cpu", prefetch=1, pool_bytes=None, blocks=None, *,
                 pin=(), source="auto", rebuild=False, handle=None, engine="auto",
                 direct="auto", verify=True):
    """Read ``model``'s block weights from disk as each block runs; returns
    the same model.

    ``dir``: a ``save_pretrained`` directory whose safetensors hold the
    weights (by default the model's ``name_or_path`` when it is a local
    directory), and where nvio writes its weight store when they do not.
    ``device``: "cpu", or "cuda"/"cuda:N" (weights bounce through the locked
    slots to the GPU on a side stream; the resident parts move there too).
    ``prefetch``: blocks read ahead while one computes (0: read each block
    when it is about to run). ``pool_bytes``: a cap on the slots' memory
    (fewer slots lower the prefetch; less than one block is an error).
    ``blocks``: the blocks, found automatically if None (a Hugging Face
    causal LM's decoder layers, else the longest ModuleList/Sequential run
    of same-type children); a name of such a container, or a list of
    module names or modules. ``pin``: names (of modules or tensors) kept
    resident. ``source``: "auto", "safetensors" or "store". ``rebuild``:
    rewrite nvio's store even if it looks current. ``handle`` (an
    nvio.AioHandle) or ``engine``/``direct``: how reads are done.

    ``direct="auto"`` decides once, here, whether the streamed weights can
    stay in the page cache: if the streamed bytes + the pool + a margin
    (256 MiB + 1/8 of the streamed bytes) fit in the memory this process
    can use for page cache now, min(MemAvailable of /proc/meminfo, the
    room left in its memory cgroup: v2 memory.max - memory.current, v1
    memory.limit_in_bytes - memory.usage_in_bytes, of its group and each
    ancestor with a limit, plus the weights' pages cached already, which
    that usage counts), blocks are read through the page cache and
    every forward after the first copies them from memory; otherwise with
    O_DIRECT (where the file system takes it), so that a model bigger than
    the cache neither thrashes it nor evicts what other processes need.
    A file that cannot be read counts as no room (O_DIRECT). When the
    page cache was chosen but, from the third pass on, finds less than
    half of the previous pass's weights still cached (memory taken since,
    caches dropped), reads switch to O_DIRECT for good (buffered reads
    from the disk are slower than O_DIRECT). ``True``/
    ``False`` (or NVIO_DIRECT in the environment, or ``handle``'s setting)
    always win; ``True`` means O_DIRECT or an error.
    ``verify``: check each block read from nvio's weight store against the
    CRC-32 written with it (WeightReadError, errno EBADMSG, on a mismatch);
    ``stats()["crc"]`` says whether blocks are checked (stores written
    before nvio kept CRC-32s are read unchecked; rebuild=True adds them).
    ``model._nvio_from_disk.stats()`` says what was chosen: ``direct``,
    ``why`` (the numbers), ``direct_inputs`` and ``o_direct`` (whether
    the open weight files do use O_DIRECT).

    Inference only: a block run with autograd recording an input that
    requires grad raises RuntimeError.
    """
    if hasattr(model, _ATTR):
        raise RuntimeError("nvio: the model runs from disk already (nvio.offload.run_from_memory first)")
    if not isinstance(model, nn.Module):
        raise TypeError("nvio: run_from_disk takes an nn.Module, not %s" % type(model).__name__)
    if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
        raise ValueError("nvio: prefetch must be an int >= 0, not %r" % (prefetch,))
    if source not in ("auto", "safetensors", "store"):
        raise ValueError("nvio: source must be 'auto', 'safetensors' or 'store', not %r" % (source,))
    dev = torch.device(device)
    if dev.type == "cuda":
        if not _device.cuda_available():
            raise RuntimeError("nvio: run_from_disk(device=%r): CUDA is not available "
                               "(torch.cuda.is_available() is False)" % (device,))
        if dev.index is None:
            dev = torch.device("cuda", _device.current_device())
    elif dev.type != "cpu":
        raise ValueError("nvio: device must be 'cpu' or 'cuda', not %r" % (device,))
    s = _DiskRunner(model, dir, dev, prefetch, pool_bytes, blocks, pin, source, rebuild,
                  handle, engine, direct, bool(verify))
    object.__setattr__(model, _ATTR, s)
    object.__setattr__(model, _OLD_ATTR, s)
    return model


def run_from_memory(model):
    """Read the weights back into ordinary tensors, remove the hooks and
    free the pool: the model is as it was before run_from_disk
    (``unstream`` before 0.3)."""
    s = model.__dict__.get(_ATTR)
    if s is None:
        raise ValueError("nvio: the model is not run from disk (nvio.offload.run_from_disk)")
    s.restore()
    del model.__dict__[_ATTR]
    model.__dict__.pop(_OLD_ATTR, None)
    return model


@contextlib.contextmanager
def running_from_disk(model, *args, **kwargs):
    """``with running_from_disk(model, dir) as m:`` runs the model from
    disk inside the block and restores it on the way out (``streamed``
    before 0.3)."""
    run_from_disk(model, *args, **kwargs)
    try:
        yield model
    finally:
        run_from_memory(model)


# --- finding blocks -----------------------------------------------------------


def _get(model, path):
    m = model
    for part in path.split("."):
        m = getattr(m, part, None)
        if not isinstance(m, nn.Module):
            return None
    return m


def _children_blocks(container, name):
    return [("%s.%s" % (name, k) if name else k, c) for k, c in container.named_children()]


def find_blocks(model, blocks=None):
    """[(qualified name, module)] in execution order."""
    names = {m: n for n, m in model.named_modules(remove_duplicate=False)}
    if blocks is not None:
        if isinstance(blocks, str):
            c = model.get_submodule(blocks) if blocks else model
            if not isinstance(c, (nn.ModuleList, nn.Sequential)):
                raise ValueError("nvio: blocks=%r names a %s, not a ModuleList or Sequential"
                                 % (blocks, type(c).__name__))
            out = _children_blocks(c, blocks)
        else:
            out = []
            for b in blocks:
                if isinstance(b, str):
                    out.append((b, model.get_submodule(b)))
                elif isinstance(b, nn.Module) and b in names:
                    out.append((names[b], b))
                else:
                    raise ValueError("nvio: blocks: %r is no module name or submodule of the model"
                                     % (b,))
    else:
        out = None
        for p in _HF_PATHS:
            c = _get(model, p)
            if isinstance(c, (nn.ModuleList, nn.Sequential)) and len(c) > 1:
                out = _children_blocks(c, p)
                break
        if out is None:
            out = _longest_run(model)
    if not out:
        raise ValueError("nvio: no blocks to stream were found in %s; name them with blocks="
                         % type(model).__name__)
    seen = set()
    for n, m in out:
        for o, om in out:
            if o != n and o.startswith(n + "."):
                raise ValueError("nvio: blocks %r and %r are nested" % (n, o))
        if id(m) in seen:
            raise ValueError("nvio: block %r is listed twice" % n)
        seen.add(id(m))
    return out


def _longest_run(model):
    """The longest run of consecutive same-type children with parameters in
    any ModuleList/Sequential (ties: more parameter bytes)."""
    best, best_key = None, (1, 0)
    for cname, c in model.named_modules():
        if not isinstance(c, (nn.ModuleList, nn.Sequential)):
            continue
        kids = _children_blocks(c, cname)
        i = 0
        while i < len(kids):
            j = i
            while j + 1 < len(kids) and type(kids[j + 1][1]) is type(kids[i][1]):
                j += 1
            run = kids[i:j + 1]
            size = sum(p.numel() * p.element_size() for _, m in run for p in m.parameters())
            key = (len(run), size)
            if size > 0 and key > best_key:
                best, best_key = run, key
            i = j + 1
    return best


# --- the runner ---------------------------------------------------------------


class _Piece:
    """One streamed tensor: where it hangs in the model."""

    __slots__ = ("owner", "attr", "is_param", "name", "dtype", "shape", "requires_grad",
                 "orig", "meta")

    def __init__(self, owner, attr, is_param, name, t):
        self.owner, self.attr, self.is_param, self.name = owner, attr, is_param, name
        self.dtype, self.shape = t.dtype, tuple(t.shape)
        self.requires_grad = bool(getattr(t, "requires_grad", False))
        self.orig = t
        m = torch.empty(self.shape, dtype=self.dtype, device="meta")
        self.meta = nn.Parameter(m, requires_grad=False) if is_param else m

    def put(self, t):
        (self.owner._parameters if self.is_param else self.owner._buffers)[self.attr] = t


class _Check:
    """The CRC-32 of a block's bytes, computed as soon as its read ends, on
    the thread that completes it (off the forward's path: the block before
    is computing meanwhile); ``done`` is set when ``got`` (or None: the
    read failed) is there."""

    __slots__ = ("done", "got", "secs")

    def __init__(self):
        self.done, self.got, self.secs = threading.Event(), None, 0.0

    def run(self, fut, mv):
        try:
            if not fut.cancelled() and fut.exception() is None:
                t0 = time.perf_counter()
                self.got = _nvio.crc32(mv)
                self.secs = time.perf_counter() - t0
        finally:
            self.done.set()


class _Block:
    __slots__ = ("idx", "name", "module", "pieces", "lay", "views", "hooks", "nbytes", "crc")

    def __init__(self, idx, name, module):
        self.idx, self.name, self.module = idx, name, module
        self.pieces, self.lay, self.views, self.hooks, self.nbytes = [], None, {}, [], 0
        self.crc = None         # CRC-32 of the block's bytes in nvio's store


class _Slot:
    __slots__ = ("idx", "buf", "host", "mv", "dev", "owner", "futs", "ready", "last",
                 "copied", "copy_ev", "free_ev", "check")

    def __init__(self, idx, nbytes, dev):
        self.idx = idx
        try:
            self.buf = locked_buffer(nbytes, False)
        except OSError:
            self.buf = locked_buffer(nbytes, True)   # RLIMIT_MEMLOCK: page-aligned still
        self.host = torch.frombuffer(self.buf, dtype=torch.uint8) if nbytes else \
            torch.empty(0, dtype=torch.uint8)
        self.mv = memoryview(self.buf)
        self.dev = None
        if dev.type == "cuda":
            st = _device.empty(nbytes, dev)
            self.dev = torch.empty(0, dtype=torch.uint8, device=st.device).set_(st)
        self.owner, self.futs, self.ready, self.last = None, [], False, 0
        self.check = None       # the _Check of the block being read into it
        self.copied, self.copy_ev, self.free_ev = False, None, None


def _tensors_of(model):
    """[(state-dict-like name, owner module, attr, is_param, tensor, persistent)]
    of every parameter and buffer, duplicates (tied weights) included."""
    out = []
    for mname, m in model.named_modules(remove_duplicate=False):
        pre = mname + "." if mname else ""
        for k, p in m._parameters.items():
            if p is not None:
                out.append((pre + k, m, k, True, p, True))
        for k, b in m._buffers.items():
            if b is not None:
                out.append((pre + k, m, k, False, b, k not in m._non_persistent_buffers_set))
    return out


def _materialised(t):
    return t.device.type != "meta"


class _DiskRunner:
    def __init__(self, model, dir, dev, prefetch, pool_bytes, blocks, pin, source, rebuild,
                 handle, engine, direct, verify=True):
        self.model, self.dev = model, dev
        self._verify = verify
        self.dir = dir if dir is not None else _model_dir(model)
        bl = find_blocks(model, blocks)
        self.blocks = [_Block(i, n, m) for i, (n, m) in enumerate(bl)]
        self._split(model, pin)
        self._stats = dict(bytes_read=0, block_reads=0, wait_s=0.0, reads_failed=0, crc_s=0.0,
                           crc_wait_s=0.0)
        self._clock = itertools.count(1)
        self.running = set()
        own = handle is None
        self.handle, self._own_handle, self._engine = handle, own, engine
        self.files = {}
        self.slots = []
        try:
            self._choose_source(source, rebuild)
            # after the source: the decision counts what of it is cached
            hdirect = self._decide_direct(direct, handle, prefetch, pool_bytes)
            if own:
                self.handle = self._new_handle(hdirect)
            self.comps = completions(self.handle)
            self._fill_resident_meta()
            self._make_pool(prefetch, pool_bytes)
            self._attach_hooks()
        except BaseException:
            self._close_files()
            raise

    # -- what is streamed, what stays --------------------------------------

    def _split(self, model, pin):
        pin = tuple(pin) if not isinstance(pin, str) else (pin,)
        block_of = {}
        for b in self.blocks:
            for mname, m in b.module.named_modules(remove_duplicate=False):
                block_of.setdefault(id(m), b)
        everything = _tensors_of(model)
        uses = {}       # id(tensor) -> how many places hold it (tied weights: > 1)
        for name, m, k, isp, t, pers in everything:
            uses[id(t)] = uses.get(id(t), 0) + 1
        self.resident = []          # (name, owner, attr, is_param, tensor, persistent)
        seen = set()
        for name, m, k, isp, t, pers in everything:
            b = block_of.get(id(m))
            pinned = any(name == p or name.startswith(p + ".") for p in pin)
            if (b is None or pinned or not pers or uses[id(t)] > 1
                    or t.numel() == 0 or (self.dev.type == "cpu" and t.device.type == "cuda")):
                if id(t) not in seen:
                    seen.add(id(t))
                    self.resident.append((name, m, k, isp, t, pers))
                continue
            seen.add(id(t))
            b.pieces.append(_Piece(m, k, isp, name, t))
        self.blocks = [b for b in self.blocks if b.pieces]
        for i, b in enumerate(self.blocks):
            b.idx = i               # a block's number is its place in the list
        if not self.blocks:
            raise ValueError("nvio: the blocks found hold no tensors to stream")
        for b in self.blocks:
            b.nbytes = sum(W._nbytes(p.dtype, p.shape) for p in b.pieces)
        for name, m, k, isp, t, pers in self.resident:
            if not _materialised(t) and not pers:
                raise ValueError("nvio: buffer %r is on the meta device and is not saved with "
                                 "the weights: build the model with buffers materialised "
                                 "(accelerate.init_empty_weights(include_buffers=False))" % name)

    def _new_handle(self, direct):
        return throughput_handle(engine=self._engine, direct=direct)

    def _decide_direct(self, direct, handle, prefetch, pool_bytes):
        """Sets self.direct (O_DIRECT where the file system takes it, or
        the page cache), self.why and self.direct_inputs; returns the
        direct argument for the handle nvio makes."""
        self.direct_inputs = {}
        self._watch, self._passes, self._missed = False, 0, 0
        self._file_bytes = sum(b.lay.file_bytes for b in self.blocks)
        if handle is not None:
            mode = handle.get_direct()
            self.direct, self.why = mode != "off", "the handle given decides (direct=%s)" % mode
            return None
        auto = direct is None or (isinstance(direct, str) and direct.lower() == "auto")
        if not auto:
            name = str(direct).lower()
            self.direct = name not in ("false", "off", "0", "no")
            self.why = "direct=%r given" % (direct,)
            return direct        # AioHandle refuses what it does not know
        on, env = env_direct()
        if on is not None:
            self.direct = on
            self.why = "NVIO_DIRECT=%s in the environment" % env
            return "auto"        # the handle takes it from the environment
        streamed = sum(b.nbytes for b in self.blocks)
        big = max(b.nbytes for b in self.blocks)
        pool = (prefetch + 1) * big
        if pool_bytes is not None:
            pool = min(pool, max(pool_bytes // big * big if big else 0, big))
        cached = _room.cached_bytes([(path, off, n) for b in self.blocks
                                     for path, reads in b.lay.reads.items()
                                     for _so, off, n in reads])
        self.direct, self.why, self.direct_inputs = _room.choose_direct(streamed, pool,
                                                                         cached=cached)
        self._watch = not self.direct   # see _pass_ended
        return "auto" if self.direct else False

    def _tensor_list(self, b):
        return [(p.name, p.dtype, p.shape) for p in b.pieces]

    # -- the source ---------------------------------------------------------

    def _choose_source(self, source, rebuild):
        why = None
        if source != "store" and not rebuild:
            entries = W.find_safetensors(self.dir)
            if entries is None:
                why = "no safetensors files in %s" % (self.dir,)
            else:
                why = self._check_safetensors(entries)
                if why is None:
                    return self._use_safetensors(entries)
            if source == "safetensors":
                raise W.WeightsError("nvio: cannot stream from safetensors: %s" % why)
        self._use_store(rebuild, why)

    def _check_safetensors(self, entries):
        """None if the files hold every streamed tensor (and every resident
        one still on the meta device) as the model has it, else why not."""
        need = [(p.name, p.dtype, p.shape, p.orig) for b in self.blocks for p in b.pieces]
        need += [(n, t.dtype, tuple(t.shape), t) for n, _, _, _, t, _ in self.resident
                 if not _materialised(t)]
        for name, dt, shape, t in need:
            e = entries.get(name)
            if e is None:
                return "tensor %r is in none of the files" % name
            if e.dtype != dt or e.shape != tuple(shape):
                return ("tensor %r is %s %s in %s but %s %s in the model"
                        % (name, W.dtype_name(e.dtype), list(e.shape), e.path,
                           W.dtype_name(dt), list(shape)))
        for name, dt, shape, t in need:
            if not _materialised(t):
                continue
            e = entries[name]
            hm, hf = hashlib.sha256(), hashlib.sha256()
            W.sample_tensor(hm, t)
            with W.open_data(e.path) as f:
                W.sample_file(hf, f, e.start, e.end - e.start)
            if hm.digest() != hf.digest():
                return "tensor %r in memory differs from %s" % (name, e.path)
        return None

    def _use_safetensors(self, entries):
        self.source = "safetensors"
        paths = sorted({entries[p.name].path for b in self.blocks for p in b.pieces}
                       | {entries[n].path for n, *_r in self.resident if n in entries})
        sizes = {p: os.path.getsize(p) for p in paths}
        for b in self.blocks:
            b.lay = W.layout_safetensors(self._tensor_list(b), entries, sizes)
        self._entries = entries
        self._resident_src = {n: (entries[n].path, entries[n].start, None)
                              for n, *_r in self.resident if n in entries}
        self.crc_checked = False

    def _use_store(self, rebuild, why):
        if self.dir is None:
            raise ValueError("nvio: run_from_disk needs dir=, a directory for nvio's weight store "
                             "(%s)" % (why or "no safetensors to stream from"))
        os.makedirs(self.dir, exist_ok=True)
        persistent = [r for r in self.resident if r[5]]
        lists = [self._tensor_list(b) for b in self.blocks]
        lists.append([(n, t.dtype, tuple(t.shape)) for n, _, _, _, t, _ in persistent])
        names = [b.name for b in self.blocks] + ["<resident>"]
        fp = W.fingerprint(names, lists)
        layout, size = W.layout_store(lists)
        tensors = [[p.orig for p in b.pieces] for b in self.blocks] + [[r[4] for r in persistent]]
        all_mat = all(_materialised(t) for ts in tensors for t in ts)
        data = os.path.join(self.dir, W.STORE_DATA)
        try:
            m = W.read_manifest(self.dir)
        except W.StoreCorruptError:
            if not (rebuild and all_mat):
                raise
            m = None            # rewritten below
        stale = self._store_stale(m, fp, size, data, layout, tensors, all_mat)
        if stale or rebuild:
            if not all_mat:
                raise W.WeightsError(
                    "nvio: cannot stream: %s, and the model's weights are not in memory to "
                    "write nvio's weight store %s (%s)"
                    % (why or "no safetensors", data, stale or "rebuild requested"))
            m = self._write_store(data, fp, layout, size, tensors, names)
        else:
            _check_store_layout(m, os.path.join(self.dir, W.STORE_MANIFEST), names, layout)
        self.source = "store"
        verify = self._verify
        for b, (off, lay), mb in zip(self.blocks, layout, m["blocks"]):
            lay.reads = {data: [(0, off, lay.size)]}
            b.lay = lay
            b.crc = mb.get("crc32") if verify else None
        roff, rlay = layout[-1]
        tcrc = {t[0]: t[4] for t in m["blocks"][-1]["tensors"] if len(t) == 5 and verify}
        self._resident_src = {n: (data, roff + rlay.slices[n].off, tcrc.get(n))
                              for n, *_r in persistent}
        self.crc_checked = verify and all(b.crc is not None for b in self.blocks)

    def _store_stale(self, m, fp, size, data, layout, tensors, all_mat):
        """None if the store in dir holds this model, else why not."""
        if m is None:
            return "no weight store in %s yet" % self.dir
        if m.get("fingerprint") != fp:
            return "the weight store %s was written for another model" % data
        W._trust.check_regular(data, W.WeightsError)
        try:
            fsize = os.path.getsize(data)
        except OSError as e:
            return "the weight store's data file %s: %s" % (data, e.strerror)
        if fsize != size or m.get("data_size") != size:
            return ("the weight store's data file %s has %d bytes, its manifest says %d"
                    % (data, fsize, size))
        hf = hashlib.sha256()
        with W.open_data(data) as f:
            for (off, lay), ts in zip(layout, tensors):
                for s in lay.slices.values():
                    W.sample_file(hf, f, off + s.off, s.nbytes)
        if hf.hexdigest() != m.get("sample"):
            return "the weight store's data file %s does not hold what its manifest says" % data
        if all_mat:
            hm = hashlib.sha256()
            for ts in tensors:
                for t in ts:
                    W.sample_tensor(hm, t)
            if hm.hexdigest() != m.get("sample"):
                return "the model's weights changed since the weight store %s was written" % data
        return None

    def _write_store(self, data, fp, layout, size, tensors, names):
        """Write every block (and the resident tensors) once, all or nothing,
        then the manifest."""
        biggest = max((lay.size for _, lay in layout), default=0)
        stage = _Slot(-1, biggest, torch.device("cpu"))
        hm = hashlib.sha256()
        mv = memoryview(stage.buf)
        h = self.handle if self.handle is not None else self._new_handle("auto")
        try:
            crcs = self._write_store_data(h, data, layout, size, tensors, stage, mv, hm)
        finally:
            if h is not self.handle:
                h.close()
        m = {
            "format": W.STORE_FORMAT, "version": W.STORE_VERSION, "fingerprint": fp,
            "sample": hm.hexdigest(), "data": W.STORE_DATA, "data_size": size,
            "blocks": [{"name": n, "offset": off, "nbytes": lay.size, "crc32": bc,
                        "tensors": [[s.name, W.dtype_name(s.dtype), list(s.shape), s.off, tc]
                                    for s, tc in zip(lay.slices.values(), tcs)]}
                       for n, (off, lay), (bc, tcs) in zip(names, layout, crcs)],
        }
        W.write_manifest(self.dir, m)
        return m

    @staticmethod
    def _write_store_data(h, data, layout, size, tensors, stage, mv, hm):
        """Returns [(the block's CRC-32, [each tensor's CRC-32])] per block."""
        crcs = []
        with h.open(data, _nvio.FILE_ATOMIC) as f:
            f.truncate(size)
            for (off, lay), ts in zip(layout, tensors):
                stage.host[:lay.size].zero_()
                tcs = []
                for s, t in zip(lay.slices.values(), ts):
                    src = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
                    stage.host[s.off:s.off + s.nbytes].copy_(src)
                    W.sample_tensor(hm, t)
                    tcs.append(_nvio.crc32(mv[s.off:s.off + s.nbytes]))
                crcs.append((_nvio.crc32(mv[:lay.size]), tcs))
                if lay.size:
                    f.pwrite(mv[:lay.size], off)
            f.commit()
        return crcs

    def _file(self, path):
        f = self.files.get(path)
        if f is None:
            f = self.files[path] = self.handle.open(path, _nvio.FILE_READ)
        return f

    def _fill_resident_meta(self):
        """Resident tensors still on the meta device are read from the source."""
        for name, m, k, isp, t, pers in self.resident:
            if _materialised(t):
                continue
            src = self._resident_src.get(name)
            if src is None:
                raise W.WeightsError("nvio: tensor %r is on the meta device and not in the "
                                     "weights (%s)" % (name, self.source))
            path, off, crc = src
            new = self._read_tensor(path, off, tuple(t.shape), t.dtype, name, crc)
            (m._parameters if isp else m._buffers)[k] = (
                nn.Parameter(new, requires_grad=t.requires_grad) if isp else new)
        if self.dev.type == "cuda":
            for name, m, k, isp, t, pers in self.resident:
                cur = (m._parameters if isp else m._buffers)[k]
                if cur.device != self.dev:
                    if isp:
                        cur.data = _device.to_device(cur.data, self.dev)
                    else:
                        m._buffers[k] = _device.to_device(cur, self.dev)

    def _read_tensor(self, path, off, shape, dtype, name, crc=None):
        """A tensor read from path at off into page-aligned memory: the
        aligned superset of its bytes is read with O_DIRECT and the tensor
        is a view inside it (an unaligned read would go through nvio's
        staging ring, whose memory would count in the peak). crc: the
        CRC-32 its bytes must have (nvio's store), or None."""
        n = W._nbytes(dtype, shape)
        if n == 0:
            return torch.empty(shape, dtype=dtype)
        f = self._file(path)
        a0 = W.align_down(off)
        if (off - a0) % dtype.itemsize:
            a0 = off                 # a view would be misaligned: exact read
        a1 = min(W.align_up(off + n), f.size)
        buf = mmap.mmap(-1, W.align_up(a1 - a0), mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        got = f.pread(memoryview(buf)[:a1 - a0], a0)
        if got != a1 - a0:
            raise W.WeightsError("nvio: %s: %d of %d bytes of tensor %r at offset %d: the "
                                 "file is truncated" % (path, got, a1 - a0, name, a0))
        if crc is not None:
            got = _nvio.crc32(memoryview(buf)[off - a0:off - a0 + n])
            if got != crc:
                raise WeightReadError(errno.EBADMSG, "nvio: %s: the %d bytes of tensor %r at offset "
                                      "%d have CRC-32 %08x, the manifest says %08x: the weight "
                                      "store is damaged (run_from_disk(..., rebuild=True) rewrites "
                                      "it from weights in memory)" % (path, n, name, off, got, crc),
                                      path)
        u8 = torch.frombuffer(buf, dtype=torch.uint8)
        return u8[off - a0:off - a0 + n].view(dtype).view(shape)

    # -- the pool -------------------------------------------------------------

    def _make_pool(self, prefetch, pool_bytes):
        self.slot_bytes = max(b.lay.size for b in self.blocks)
        big = max(self.blocks, key=lambda b: b.lay.size)
        want = prefetch + 1
        if pool_bytes is not None:
            fit = pool_bytes // self.slot_bytes if self.slot_bytes else want
            if fit < 1:
                raise ValueError(
                    "nvio: pool_bytes=%d is too small for one block: block %r needs %d bytes "
                    "in the pool (%d of weights)" % (pool_bytes, big.name, big.lay.size, big.nbytes))
            want = min(want, fit)
        self.prefetch = want - 1
        self.slots = [_Slot(i, self.slot_bytes, self.dev) for i in range(want)]
        if self.dev.type == "cuda":
            self.side = _device.new_stream(self.dev)
            self._registered = []
            for s in self.slots:
                if not s.buf.nbytes:
                    continue
                try:        # page-locked for CUDA: the copies can be asynchronous
                    _device.host_register(s.buf.address, s.buf.nbytes)
                except Exception:  # noqa: BLE001  (then torch copies synchronously)
                    continue
                self._registered.append(s.buf.address)
        with torch.inference_mode(False):
            for b in self.blocks:
                for s in self.slots:
                    b.views[s.idx] = self._views(b, s)

    def _views(self, b, s):
        base = s.dev if s.dev is not None else s.host
        out = []
        for p in b.pieces:
            sl = b.lay.slices[p.name]
            t = base[sl.off:sl.off + sl.nbytes].view(p.dtype).view(p.shape)
            out.append(nn.Parameter(t, requires_grad=False) if p.is_param else t)
        return out

    # -- hooks ----------------------------------------------------------------

    def _attach_hooks(self):
        for b in self.blocks:
            for p in b.pieces:
                p.put(p.meta)
                if _materialised(p.orig) and isinstance(p.orig, nn.Parameter):
                    p.orig.data = torch.empty(0, dtype=p.dtype, device=p.orig.device)
                elif _materialised(p.orig):
                    p.orig = p.orig.new_empty(0)  # a buffer: drop the memory
            b.hooks.append(b.module.register_forward_pre_hook(
                self._pre_hook(b), with_kwargs=True))
            b.hooks.append(b.module.register_forward_hook(self._post_hook(b), always_call=True))

    def _pre_hook(self, b):
        def hook(module, args, kwargs):
            if torch.is_grad_enabled() and any(
                    isinstance(a, torch.Tensor) and a.requires_grad
                    for a in itertools.chain(args, kwargs.values())):
                raise RuntimeError("nvio: block %r is streamed (inference only) but autograd is "
                                   "recording: run under torch.no_grad()" % b.name)
            self.before(b)
        return hook

    def _post_hook(self, b):
        def hook(module, args, output):
            self.after(b)
        return hook

    def before(self, b):
        self.running.add(b.idx)
        try:
            if self._watch and b is self.blocks[0]:
                self._pass_ended()
            win = self._window(b.idx)
            s = self._load(b, protect=win)
            for k in range(1, self.prefetch + 1):
                nb = self.blocks[(b.idx + k) % len(self.blocks)]
                if nb.idx == b.idx or self._load(nb, protect=win, optional=True) is None:
                    break
            self._wait(s, b)
            if self.dev.type == "cuda":
                self._copy(s)
                # the block's work (on torch's current stream) after the copy
                _device.wait_event(_device.current_stream(self.dev), s.copy_ev)
            s.last = next(self._clock)
            for p, v in zip(b.pieces, b.views[s.idx]):
                p.put(v)
        except BaseException:
            self.running.discard(b.idx)
            raise

    def after(self, b):
        for p in b.pieces:
            p.put(p.meta)
        self.running.discard(b.idx)
        s = self._slot_of(b.idx)
        if s is not None and self.dev.type == "cuda":
            # the slot's next copy waits until the block's work has used it
            s.free_ev = _device.record(_device.current_stream(self.dev))
        # the slot just released takes the block prefetch + 1 ahead
        # (a read refused here is refused again, and raised, when its block runs)
        win = self._window(b.idx + 1)
        try:
            for k in range(1, self.prefetch + 2):
                nb = self.blocks[(b.idx + k) % len(self.blocks)]
                if nb.idx == b.idx or self._load(nb, protect=win, optional=True) is None:
                    break
        except OSError:
            pass
        if self.dev.type == "cuda":
            for s2 in self.slots:
                if s2.owner is not None and not s2.copied and all(f.done() for f, *_ in s2.futs):
                    self._copy(s2)

    def _pass_ended(self):
        """Page cache chosen by direct="auto": when the pass before last
        (the first one fills the cache) found less than half of the
        weights cached (memory taken since, caches dropped), the cache
        does not keep the model and buffered reads from the disk are
        slower than O_DIRECT: switch to O_DIRECT for good."""
        self._passes += 1
        missed, self._missed = self._missed, 0
        if self._passes < 3 or 2 * missed <= self._file_bytes:
            return
        for s in self.slots:                    # reads in flight end on the old handle
            if s.futs and s.owner is not None:
                self._wait(s, next(x for x in self.blocks if x.idx == s.owner))
        for f in self.files.values():
            f.close()
        self.files = {}
        old, self.handle = self.handle, self._new_handle("auto")
        self.comps = completions(self.handle)
        old.close()
        self.direct, self._watch = True, False
        self.why = ("O_DIRECT since pass %d: the page cache held only %s of the %s read in the "
                    "pass before (at first: %s)" % (self._passes, _room._b(
                        self._file_bytes - missed), _room._b(self._file_bytes), self.why))

    def _window(self, start):
        """The blocks that should be in the pool while block start runs."""
        n = len(self.blocks)
        return {(start + k) % n for k in range(self.prefetch + 1)}

    def _slot_of(self, idx):
        for s in self.slots:
            if s.owner == idx:
                return s
        return None

    def _load(self, b, protect, optional=False):
        """The slot holding (or reading) block b; submits its reads if
        needed. None (optional) when no slot can be taken now."""
        s = self._slot_of(b.idx)
        if s is not None:
            return s
        free = [s for s in self.slots if s.owner is None]
        if not free:
            free = sorted((s for s in self.slots
                           if s.owner not in self.running and s.owner not in protect),
                          key=lambda s: s.last)
        if not free:
            if optional:
                return None
            raise RuntimeError("nvio: no free slot for block %r (%d slots, blocks running: %s)"
                               % (b.name, len(self.slots), sorted(self.running)))
        s = free[0]
        self._settle(s)
        if self._watch:
            ranges = [(path, off, n) for path, reads in b.lay.reads.items()
                      for _so, off, n in reads]
            self._missed += sum(n for _p, _o, n in ranges) - _room.cached_bytes(ranges)
        s.owner, s.ready, s.copied, s.last = b.idx, False, False, next(self._clock)
        ops, want = [], []
        for path, reads in b.lay.reads.items():
            f = self._file(path)
            for i in range(0, len(reads), _nvio.MAX_IOV):
                chunk = reads[i:i + _nvio.MAX_IOV]
                vec = [(s.mv[so:so + n], fo) for so, fo, n in chunk]
                ops.append((_nvio.OP_READ, f, vec, _nvio.OFFSET_PER_IOV))
                want.append((sum(n for _, _, n in chunk), path, chunk[0][1]))
        try:
            futs = self.comps.submit(ops)
        except Exception as e:
            s.futs = [(f, *w) for f, w in zip(getattr(e, "futures", []), want)]
            self._settle(s)
            s.owner = None
            self._stats["reads_failed"] += 1
            raise self._error(b, want[len(s.futs)][1] if want else None, e) from e
        s.futs = [(f, *w) for f, w in zip(futs, want)]
        s.check = None
        if b.crc is not None and len(futs) == 1:      # a store block: one read
            s.check = _Check()
            mv = s.mv[:b.lay.size]
            futs[0].add_done_callback(lambda f, c=s.check, mv=mv: c.run(f, mv))
        self._stats["block_reads"] += 1
        return s

    def _settle(self, s):
        """Wait for whatever still uses slot s's host memory (reads, copies)."""
        for f, *_ in s.futs:
            try:
                f.result()
            except Exception:
                pass
        s.futs = []
        if s.check is not None:
            s.check.done.wait()                      # nor by its CRC
            s.check = None
        if s.copy_ev is not None:
            _device.event_synchronize(s.copy_ev)     # its host memory is read no more

    def _wait(self, s, b):
        if s.ready:
            return
        t0 = time.perf_counter()
        err = None
        for f, n, path, off in s.futs:
            try:
                got = f.result()
            except Exception as e:
                err = err or (path, e)
                continue
            if got != n and err is None:
                err = (path, W.WeightsError(
                    "nvio: %s: read %d of %d bytes at offset %d: the file is truncated"
                    % (path, got, n, off)))
            self._stats["bytes_read"] += got
        self._stats["wait_s"] += time.perf_counter() - t0
        s.futs = []
        if err is None and b.crc is not None:
            if s.check is not None:
                t1 = time.perf_counter()
                s.check.done.wait()
                self._stats["crc_wait_s"] += time.perf_counter() - t1
                got, secs = s.check.got, s.check.secs
                s.check = None
            else:
                t1 = time.perf_counter()
                got = _nvio.crc32(s.mv[:b.lay.size])
                secs = time.perf_counter() - t1
            self._stats["crc_s"] += secs
            if got != b.crc:
                path, ((_so, off, n),) = next(iter(b.lay.reads.items()))
                err = (path, WeightReadError(
                    errno.EBADMSG, "the %d bytes of the block at offset %d have CRC-32 %08x, the "
                    "manifest says %08x: the weight store is damaged (run_from_disk(..., "
                    "rebuild=True) rewrites it from weights in memory)"
                    % (n, off, got, b.crc), path))
        if err is not None:
            s.owner = None
            self._stats["reads_failed"] += 1
            raise self._error(b, err[0], err[1]) from err[1]
        s.ready = True

    def _copy(self, s):
        if s.copied:
            return
        if s.free_ev is not None:
            _device.wait_event(self.side, s.free_ev)
        _device.copy_to_device_async(s.dev, s.host, self.side)
        s.copy_ev = _device.record(self.side)
        s.copied = True

    def _error(self, b, path, e):
        en = getattr(e, "errno", None) or errno.EIO
        return WeightReadError(en, "nvio: reading the weights of layer %r from %s failed: %s"
                               % (b.name, path, e), path)

    # -- stats, restore -------------------------------------------------------

    def stats(self):
        """Memory bound and I/O so far. resident_bytes + pool_bytes is the
        peak resident weight memory (weights outside the pool are never
        materialised). direct, why, direct_inputs, o_direct: how blocks
        are read (see run_from_disk)."""
        res = sum(t.numel() * t.element_size() for _, m, k, isp, t, _ in self.resident
                  if _materialised((m._parameters if isp else m._buffers)[k]))
        d = dict(self._stats)
        d.update(source=self.source, blocks=len(self.blocks), prefetch=self.prefetch,
                 slots=len(self.slots), slot_bytes=self.slot_bytes,
                 pool_bytes=self.slot_bytes * len(self.slots), resident_bytes=res,
                 streamed_bytes=sum(b.nbytes for b in self.blocks),
                 peak_weight_bytes=res + self.slot_bytes * len(self.slots),
                 files=sorted(self.files), device=str(self.dev), direct=self.direct,
                 why=self.why, direct_inputs=dict(self.direct_inputs), crc=self.crc_checked,
                 o_direct=(all(f.direct for f in self.files.values()) if self.files else None))
        return d

    def restore(self):
        for b in self.blocks:
            for h in b.hooks:
                h.remove()
            b.hooks = []
        try:
            for b in self.blocks:
                s = self._load(b, protect=set())
                self._wait(s, b)
                for p in b.pieces:
                    src = s.host[b.lay.slices[p.name].off:][:W._nbytes(p.dtype, p.shape)]
                    new = _device.to_device(src.view(p.dtype).view(p.shape).clone(), self.dev)
                    if isinstance(p.orig, nn.Parameter) and p.orig.device == new.device:
                        p.orig.data = new
                        p.put(p.orig)
                    elif p.is_param:
                        p.put(nn.Parameter(new, requires_grad=p.requires_grad))
                    else:
                        p.put(new)
        finally:
            self._close_files()

    def _close_files(self):
        for s in self.slots:
            self._settle(s)
        if self.dev.type == "cuda":
            for a in getattr(self, "_registered", []):
                _device.host_unregister(a)
            self._registered = []
        for f in self.files.values():
            f.close()
        self.files = {}
        if self._own_handle and self.handle is not None:
            self.handle.close()
        self.slots = []


def _check_store_layout(m, mpath, names, layout):
    """A manifest whose fingerprint matches must also place every block
    and tensor where the layout does (a hand-edited manifest otherwise
    points reads anywhere)."""
    p = mpath
    if len(m["blocks"]) != len(layout):
        raise W.StoreCorruptError("nvio: weight store manifest %s: field blocks has %d "
                                  "entries, the model %d" % (p, len(m["blocks"]), len(layout)),
                                  mpath, "blocks")
    for i, (mb, name, (off, lay)) in enumerate(zip(m["blocks"], names, layout)):
        want = {"name": name, "offset": off, "nbytes": lay.size}
        for k, v in want.items():
            if mb[k] != v:
                raise W.StoreCorruptError("nvio: weight store manifest %s: field blocks[%d].%s "
                                          "is %r, the layout says %r" % (p, i, k, mb[k], v),
                                          mpath, "blocks[%d].%s" % (i, k))
        got = [t[:4] for t in mb["tensors"]]
        exp = [[sl.name, W.dtype_name(sl.dtype), list(sl.shape), sl.off]
               for sl in lay.slices.values()]
        if got != exp:
            j = next((j for j, (a, b) in enumerate(zip(got, exp)) if a != b), min(len(got),
                                                                                  len(exp)))
            raise W.StoreCorruptError("nvio: weight store manifest %s: field blocks[%d].tensors"
                                      "[%d] is %r, the layout says %r"
                                      % (p, i, j, got[j] if j < len(got) else None,
                                         exp[j] if j < len(exp) else None),
                                      mpath, "blocks[%d].tensors[%d]" % (i, j))


def _model_dir(model):
    for obj in (model, getattr(model, "config", None)):
        for a in ("name_or_path", "_name_or_path"):
            p = getattr(obj, a, None)
            if isinstance(p, str) and p and os.path.isdir(p):
                return p
    return None
