"""nvio.offload.NVMeOptimizer: a torch optimizer whose state lives on NVMe.

The wrapped optimizer is torch's own (AdamW, Adam, SGD, ... any whose state
is per-parameter tensors and plain values); nvio only decides where its
state is between steps. Parameters are cut, in order, into sub-groups of at
most ``sub_group_numel`` elements (a larger parameter is a sub-group of its
own). A sub-group's state is ONE swap key: every state tensor of every
parameter in it (and the fp32 master weight of a bf16/fp16 parameter) laid
end to end at 64-byte offsets in one pool region, so one sub-group moves as
one striped, vectored, O_DIRECT read and one write.

``step()`` is a pipeline over sub-groups: while sub-group i is updated by
the wrapped optimizer (its ``state`` holding views into i's region, its
``param_groups`` holding only i's parameters), i+1 is being read and i-1
written. Memory: the pool, which holds three regions of the largest
sub-group (plus a bounce region for grads of offloaded models), whatever
the model's size. The arithmetic is torch's, on the same values in the same
order: parameters are bit-identical to the in-memory optimizer's.
"""
from __future__ import annotations

import errno
import threading
import time

import torch

from .. import _nvio
from .._base.crc import crc_submit
from .._base.plan import Plan
from .._base.views import numel
from ._model import ModelOffload, _owner
from ._swapper import ALIGN, Swapper, _up

__all__ = ["NVMeOptimizer"]

#: Each state tensor of a sub-group starts on a multiple of this in its region.
PACK = 64
#: ... and tensors of at least this many bytes on a multiple of ALIGN, so
#: that save_state writes them from the region with O_DIRECT (no staging).
BIG = 16 << 10
_LOWP = (torch.bfloat16, torch.float16)
_MASTER = "__nvio_master__"


def _pad(n, a=PACK):
    return (n + a - 1) // a * a


class _SubGroup:
    __slots__ = ("index", "params", "layout", "small", "nbytes", "key")

    def __init__(self, index, params):
        self.index = index
        self.params = params      # [(param index, group index, param)]
        self.layout = None        # {param index: [(name, offset, dtype, shape)]}
        self.small = {}           # {param index: {name: non-tensor value}}
        self.nbytes = 0
        self.key = ("nvio.opt", index)


def _state_per_elem(opt):
    """Bytes of state per parameter element torch will keep, for sizing the pool."""
    name = type(opt).__name__.lower()
    g = opt.param_groups[0] if opt.param_groups else {}
    if "sgd" in name:
        return 4 if g.get("momentum", 0) else 0
    if "adam" in name:
        return 12 if g.get("amsgrad", False) else 8
    return 8


class _Buffers:
    """Byte buffers for ``safe_steps``' copies of a sub-group's parameters,
    made once and reused. A fresh allocation per sub-group (torch's
    allocator maps large ones anew each time) paid a page fault per 4 KiB
    it touched: the copy of a 32 MiB sub-group took 27 ms, three times
    torch's fused AdamW update of it. Every buffer is ``nbytes`` (the
    largest sub-group's parameters), so any one fits. A copy lives while
    its sub-group's write is in flight (the pool's regions bound those, and
    step() ends with none), and as many buffers are kept as were ever out
    at once: the memory the copies took at their peak, no more."""

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.made = 0             # buffers allocated so far
        self.out = 0              # taken and not given back
        self.peak = 0
        self._free = []
        self._lock = threading.Lock()

    def take(self, nbytes):
        with self._lock:
            self.out += 1
            self.peak = max(self.peak, self.out)
            if nbytes <= self.nbytes and self._free:
                return self._free.pop()
            self.made += 1
        return torch.empty(max(nbytes, self.nbytes, 1), dtype=torch.uint8)

    def give(self, buf):
        if buf is None:
            return
        with self._lock:
            self.out -= 1
            if buf.numel() == max(self.nbytes, 1) and len(self._free) < self.peak:
                self._free.append(buf)


class NVMeOptimizer:
    """Wrap ``optimizer`` so that its state (and fp32 master weights of
    bf16/fp16 parameters) lives in swap files in ``dirs``.

    ``sub_group_numel``: parameter elements per sub-group (the unit of the
    pipeline). ``pool_bytes``: the locked memory used (default: what three
    sub-groups need). ``master_weights``: keep fp32 masters of low-precision
    parameters ("auto": when any parameter is bf16/fp16; False: step them
    in their own dtype, as torch would). Other keywords go to the
    :class:`Swapper` (``engine``, ``direct``, ``bandwidth``, ...);
    ``swapper=`` shares one. ``model_offload``: the handle from
    :func:`offload_model` whose swapper holds the parameters and grads
    (found by itself when the parameters were offloaded).
    """

    def __init__(self, optimizer, dirs=None, *, sub_group_numel=1 << 23, pool_bytes=None,
                 master_weights="auto", swapper=None, model_offload=None, **swapper_kwargs):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError("nvio.offload: NVMeOptimizer wraps a torch.optim.Optimizer, not %s"
                            % type(optimizer).__name__)
        _check_args(sub_group_numel, pool_bytes, master_weights, swapper, model_offload)
        self.optimizer = optimizer
        params = []
        for gi, g in enumerate(optimizer.param_groups):
            for p in g["params"]:
                params.append((len(params), gi, p))
        if model_offload is None:
            model_offload = _owner([p for _, _, p in params])
        self._model = model_offload
        numel = model_offload.numel if model_offload is not None else (lambda p: p.numel())
        if master_weights == "auto":
            master_weights = any(p.dtype in _LOWP for _, _, p in params)
        self.master_weights = bool(master_weights)
        self._subgroups = []
        cur, n, b = [], 0, 0
        # with an offloaded model, a sub-group's parameters and grads are read
        # into the model's pool: two sub-groups (one updated, one read) and
        # the writes behind them must fit there
        room = model_offload.swapper.pool_bytes // 3 if model_offload is not None else None
        for item in params:
            k = numel(item[2])
            kb = 2 * _up(k * item[2].element_size()) if room else 0
            if cur and (n + k > sub_group_numel or (room and b + kb > room)):
                self._subgroups.append(_SubGroup(len(self._subgroups), cur))
                cur, n, b = [], 0, 0
            cur.append(item)
            n += k
            b += kb
        if cur:
            self._subgroups.append(_SubGroup(len(self._subgroups), cur))
        self._by_param = {id(p): (sg, idx) for sg in self._subgroups for idx, _, p in sg.params}
        biggest = max((sum(numel(p) for _, _, p in sg.params) for sg in self._subgroups),
                      default=0)
        if pool_bytes is None:
            per = _state_per_elem(optimizer) + (4 if self.master_weights else 0)
            region = _up(biggest * per + 64 * PACK * max(
                (len(sg.params) for sg in self._subgroups), default=0))
            pool_bytes = 3 * region + ALIGN
            if self.master_weights:      # first step: states appear beside masters
                pool_bytes += region
        self._own = swapper is None
        if swapper is None:
            if dirs is None:
                raise ValueError("nvio.offload: NVMeOptimizer needs dirs or a swapper")
            swapper = Swapper(dirs, pool_bytes, **swapper_kwargs)
        self.swapper = swapper
        self._lock = threading.Lock()
        #: keep each sub-group's parameters until its state is written (a failed
        #: write restores them); costs one copy of a sub-group's parameters
        self.safe_steps = True
        self._snaps = _Buffers(max((sum(_pad(p.numel() * p.element_size())
                                        for _, _, p in sg.params) for sg in self._subgroups),
                                   default=0))
        self._absorb()
        self.steps = 0
        self.last_step = {}

    # -- torch.optim.Optimizer's surface -------------------------------------

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def defaults(self):
        return self.optimizer.defaults

    def zero_grad(self, set_to_none=True):
        self.optimizer.zero_grad(set_to_none=set_to_none)
        if self._model is not None:
            self._model.zero_grad()

    def add_param_group(self, group):
        raise NotImplementedError("nvio.offload: add a parameter group before wrapping the "
                                  "optimizer in NVMeOptimizer")

    # -- layout ----------------------------------------------------------------

    def _target(self, p, views):
        """What the wrapped optimizer steps: the fp32 master (a view) or p."""
        if self.master_weights and p.dtype in _LOWP:
            return views.pop(_MASTER)
        return p

    def _layout_of(self, entries):
        """{param index: {name: tensor}} -> layout, total bytes."""
        layout, off = {}, 0
        for idx, st in entries.items():
            lay = []
            for name, t in st.items():
                n = t.numel() * t.element_size()
                if n >= BIG:                 # straight to the file with O_DIRECT
                    off = _pad(off, ALIGN)
                lay.append((name, off, t.dtype, tuple(t.shape)))
                off = _pad(off + n)
            layout[idx] = lay
        return layout, off

    def _views(self, sg, region):
        out = {}
        for idx, lay in sg.layout.items():
            d = {}
            for name, off, dtype, shape in lay:
                n = numel(shape) * dtype.itemsize
                d[name] = region[off:off + n].view(dtype).view(shape) if n else \
                    torch.empty(shape, dtype=dtype)
            out[idx] = d
        return out

    def _store(self, sg, entries, region=None):
        """Swap out {param index: {name: tensor}} as sg's state; zero copy when
        every tensor already sits where the layout puts it in ``region``."""
        layout, nbytes = self._layout_of(entries)
        sw = self.swapper
        same = region is not None and layout == sg.layout and all(
            t.numel() == 0 or t.data_ptr() == region.data_ptr() + off
            for idx, lay in layout.items() for (name, off, _, _), t in
            zip(lay, entries[idx].values()))
        if same:
            try:
                return sw.swap_out(sg.key, region[:max(nbytes, 1)], async_op=True)
            finally:
                sw.release(sg.key)
        buf = sw.buffer(max(nbytes, 1), sg.key)
        try:
            for idx, lay in layout.items():
                for (name, off, dtype, shape), t in zip(lay, entries[idx].values()):
                    n = t.numel() * t.element_size()
                    if n:
                        buf[off:off + n].view(dtype).view(shape).copy_(t)
            if region is not None:
                sw.release(sg.key)
            old = sg.layout, sg.nbytes
            sg.layout, sg.nbytes = layout, nbytes
            try:
                return sw.swap_out(sg.key, buf, async_op=True)
            except BaseException:
                sg.layout, sg.nbytes = old
                raise
        finally:
            sw.free_buffer(buf)

    def _absorb(self):
        """Move what the optimizer holds now (its state, masters) to NVMe."""
        st = self.optimizer.state
        for sg in self._subgroups:
            entries, any_state = {}, False
            for idx, _, p in sg.params:
                d = {}
                if self.master_weights and p.dtype in _LOWP:
                    d[_MASTER] = self._param_value(p).float()
                for name, v in st.pop(p, {}).items():
                    if isinstance(v, torch.Tensor):
                        d[name] = v
                        any_state = True
                    else:
                        sg.small.setdefault(idx, {})[name] = v
                entries[idx] = d
            if any_state or self.master_weights:
                self._store(sg, entries)
        self.swapper.wait()

    def _param_value(self, p):
        if self._model is not None and self._model.is_offloaded(p):
            return self._model.fetch_param_copy(p)
        return p.detach()

    # -- step ------------------------------------------------------------------

    def _prefetch(self, sg):
        """Start the reads of a sub-group: its state, and the parameters and
        gradients of an offloaded model."""
        if sg.layout is not None:
            self.swapper.prefetch([sg.key])
        if self._model is not None:
            self._model.swapper.prefetch(self._model.keys_for_step([p for _, _, p in sg.params]))

    @torch.no_grad()
    def _step_group(self, sg):
        sw, opt = self.swapper, self.optimizer
        t0 = _now()
        region = sw.swap_in(sg.key) if sg.layout is not None else None
        model = self._model
        if model is not None:
            model.begin_step([p for _, _, p in sg.params])
        t1 = _now()
        views = self._views(sg, region) if region is not None else {}
        targets = []
        for idx, gi, p in sg.params:
            d = views.get(idx, {})
            tgt = self._target(p, d) if (self.master_weights and p.dtype in _LOWP) else p
            if tgt is not p:
                g = p.grad
                tgt.grad = None if g is None else g.float()
            d.update(sg.small.get(idx, {}))
            if d:
                opt.state[tgt] = d
            targets.append((idx, gi, p, tgt))
        # the parameters as they were, until the new state is on disk: a failed
        # write puts them back, so parameters and state always agree
        snap, buf = self._snapshot([p for _, _, p, _ in targets if p.grad is not None and
                                    not (model is not None and model.is_offloaded(p))]
                                   if self.safe_steps else [])
        saved = opt.param_groups
        groups = []
        for gi, g in enumerate(saved):
            ps = [tgt for _, gj, _, tgt in targets if gj == gi]
            if ps:
                groups.append((g, dict(g, params=ps)))
        opt.param_groups = [tmp for _, tmp in groups]
        try:
            opt.step()
        except BaseException:
            self._snaps.give(buf)
            raise
        finally:
            opt.param_groups = saved
            for g, tmp in groups:
                for k, v in tmp.items():
                    if k != "params" and g.get(k) is not v:
                        g[k] = v
        entries = {}
        sg.small = {}
        for idx, gi, p, tgt in targets:
            st = opt.state.pop(tgt, {})
            d = {}
            if tgt is not p:
                if tgt.grad is not None:
                    p.copy_(tgt)               # round the master to the model's dtype
                tgt.grad = None
                d[_MASTER] = tgt
            for name, v in st.items():
                if isinstance(v, torch.Tensor):
                    d[name] = v
                else:
                    sg.small.setdefault(idx, {})[name] = v
            entries[idx] = d
        t2 = _now()
        try:
            fut = self._store(sg, entries, region)
        except BaseException:
            self._restore(snap)
            self._snaps.give(buf)
            raise
        finally:
            if model is not None:
                model.end_step([p for _, _, p in sg.params])
        if buf is not None:
            # kept only while the write is in flight (the swapper's pool bounds
            # those): step() holds every future until it ends, and a snapshot
            # left in a done callback lived that long, the whole model's worth
            def done(f, snap=snap, buf=buf):
                try:
                    if f.exception() is not None:
                        self._restore(snap)
                finally:
                    snap.clear()
                    self._snaps.give(buf)
            fut.add_done_callback(done)
        return t1 - t0, t2 - t1, fut

    def _snapshot(self, params):
        """Copies of params in one reused buffer: [(param, copy)], buffer."""
        if not params:
            return [], None
        sizes = [_pad(p.numel() * p.element_size()) for p in params]
        buf = self._snaps.take(sum(sizes))
        snap, off = [], 0
        try:
            for p, n in zip(params, sizes):
                v = buf[off:off + p.numel() * p.element_size()].view(p.dtype).view(p.shape)
                v.copy_(p.detach())
                snap.append((p, v))
                off += n
        except BaseException:
            self._snaps.give(buf)
            raise
        return snap, buf

    @staticmethod
    def _restore(snap):
        with torch.no_grad():
            for p, v in snap:
                p.copy_(v)
        snap.clear()

    def step(self, closure=None):
        """One optimizer step over every sub-group, pipelined; returns
        closure()'s loss. ``last_step`` holds seconds spent waiting for reads
        ("read_wait"), updating ("compute") and writing ("write_wait")."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        sw = self.swapper
        sgs = self._subgroups
        t_start = _now()
        read_wait = compute = 0.0
        futs = []
        if self._model is not None:
            self._model.settle()
        with self._lock:
            t_w = None
            try:
                if sgs:
                    self._prefetch(sgs[0])
                for i, sg in enumerate(sgs):
                    if i + 1 < len(sgs):
                        self._prefetch(sgs[i + 1])
                    r, c, fut = self._step_group(sg)
                    futs.append((sg, fut))
                    read_wait += r
                    compute += c
                t_w = _now()
                sw.wait()
                if self._model is not None:
                    self._model.swapper.wait()
            except BaseException as e:
                try:
                    sw.wait()
                except OSError:
                    pass
                for sg in sgs:              # prefetched, never stepped
                    sw.release(sg.key)
                done = [sg.index for sg, f in futs if f.exception() is None]
                e.add_note("nvio.offload: step %d failed: sub-groups %s were stepped and "
                           "saved; the others keep their previous parameters and state"
                           % (self.steps + 1, done or "none"))
                raise
            self.steps += 1
        t_end = _now()
        self.last_step = {"read_wait": read_wait, "compute": compute,
                          "write_wait": t_end - t_w, "total": t_end - t_start}
        return loss

    # -- state -------------------------------------------------------------------

    def _group_dicts(self):
        sd = self.optimizer.state_dict()     # param_groups with indices; state empty
        return sd["param_groups"]

    def state_dict(self):
        """torch's optimizer state_dict (state read from NVMe into memory; masters
        under "nvio_master"). For large states use :meth:`save_state`, which
        streams."""
        self.swapper.wait()
        state, masters = {}, {}
        for sg in self._subgroups:
            region = self.swapper.swap_in(sg.key) if sg.layout is not None else None
            views = self._views(sg, region) if region is not None else {}
            for idx, _, p in sg.params:
                d = {k: v.clone() for k, v in views.get(idx, {}).items()}
                if _MASTER in d:
                    masters[idx] = d.pop(_MASTER)
                d.update(sg.small.get(idx, {}))
                if d:
                    state[idx] = d
            if region is not None:
                self.swapper.release(sg.key)
        out = {"state": state, "param_groups": self._group_dicts()}
        if masters:
            out["nvio_master"] = masters
        return out

    def load_state_dict(self, state_dict):
        """Load torch's optimizer state_dict (or one of ours) onto NVMe, one
        sub-group at a time. Tensors keep their dtype (torch would cast them to
        the parameter's: with fp32 masters the state stays fp32)."""
        groups = state_dict["param_groups"]
        mine = self.optimizer.param_groups
        if len(groups) != len(mine) or any(len(a["params"]) != len(b["params"])
                                           for a, b in zip(groups, mine)):
            raise ValueError("nvio.offload: the state_dict's parameter groups (sizes %s) "
                             "do not match the optimizer's (%s)"
                             % ([len(g["params"]) for g in groups],
                                [len(g["params"]) for g in mine]))
        order = [i for g in groups for i in g["params"]]
        state = state_dict["state"]
        masters = state_dict.get("nvio_master", {})
        self.swapper.wait()
        for g, m in zip(groups, mine):
            for k, v in g.items():
                if k != "params":
                    m[k] = v
        for sg in self._subgroups:
            entries = {}
            sg.small = {}
            for idx, _, p in sg.params:
                saved = order[idx]
                d = {}
                if self.master_weights and p.dtype in _LOWP:
                    m = masters.get(saved)
                    d[_MASTER] = m.float() if m is not None else self._param_value(p).float()
                for name, v in state.get(saved, {}).items():
                    if isinstance(v, torch.Tensor):
                        if name != "step" and v.shape != p.shape and v.numel() == p.numel():
                            v = v.view(p.shape)
                        d[name] = v.detach().cpu()
                    else:
                        sg.small.setdefault(idx, {})[name] = v
                entries[idx] = d
            region = None
            if sg.layout is not None:
                self.swapper.discard(sg.key)
                sg.layout = None
            self._store(sg, entries, region)
            self.swapper.wait()

    def save_state(self, path, *, durable=True):
        """Write :meth:`state_dict` to ``path`` in torch's zip format (as
        :func:`nvio.save` would: ``torch.load``/``nvio.load`` read it), with
        the tensor bytes streamed from NVMe one sub-group at a time: memory
        is one sub-group's region, not the state."""
        self.swapper.wait()
        state, masters, where = {}, {}, {}
        for sg in self._subgroups:
            for idx, _, p in sg.params:
                d = {}
                for name, off, dtype, shape in (sg.layout or {}).get(idx, []):
                    t = torch.empty(shape, dtype=dtype)     # never touched: no memory
                    if t.numel():
                        where[t.untyped_storage().data_ptr()] = (sg, off)
                    if name == _MASTER:
                        masters[idx] = t
                    else:
                        d[name] = t
                d.update(sg.small.get(idx, {}))
                if d:
                    state[idx] = d
        obj = {"state": state, "param_groups": self._group_dicts()}
        if masters:
            obj["nvio_master"] = masters
        plan = Plan(obj, path)
        by_sg = {}
        for rec, s in plan.data:
            if rec.size == 0:
                rec.crc = 0
                continue
            sg, off = where[s.data_ptr()]
            by_sg.setdefault(sg.index, []).append((rec, off))
        sw = self.swapper
        flags = _nvio.FILE_ATOMIC | (0 if durable else _nvio.FILE_NOSYNC)
        with sw._h.open(path, flags) as f:
            if plan.size >= 1 << 20:
                try:
                    f.allocate(0, plan.size)
                except OSError as e:
                    if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                        raise
            order = [self._subgroups[i] for i in sorted(by_sg)]
            if order:
                sw.prefetch([order[0].key])
            for j, sg in enumerate(order):
                if j + 1 < len(order):
                    sw.prefetch([order[j + 1].key])
                region = sw.swap_in(sg.key)
                recs = sorted(by_sg[sg.index], key=lambda x: x[0].data_offset)
                crcs = crc_submit([(region.data_ptr() + off, rec.size) for rec, off in recs])
                try:
                    f.pwritev([(region[off:off + rec.size], rec.data_offset)
                               for rec, off in recs], _nvio.OFFSET_PER_IOV)
                finally:
                    for (rec, _), c in zip(recs, crcs()):
                        rec.crc = c
                sw.release(sg.key)
            f.pwritev([(b, off) for off, b in plan.meta_pieces()], _nvio.OFFSET_PER_IOV)
            f.commit()

    def load_state(self, path):
        """Load a file written by :meth:`save_state` (or torch.save/nvio.save of
        a state_dict), memory-mapped, one sub-group at a time."""
        sd = torch.load(path, map_location="cpu", mmap=True, weights_only=True)
        self.load_state_dict(sd)

    def close(self):
        """Close the swapper (if it is the optimizer's own): the state is gone."""
        if self._own:
            self.swapper.close()

    def __repr__(self):
        return "NVMeOptimizer(%r, %d sub-groups, dirs=%s)" % (
            type(self.optimizer).__name__, len(self._subgroups), self.swapper.dirs)


def _check_args(sub_group_numel, pool_bytes, master_weights, swapper, model_offload):
    """ValueError/TypeError naming the argument, before anything is allocated."""
    def is_int(v):
        return isinstance(v, int) and not isinstance(v, bool)
    if not is_int(sub_group_numel) or sub_group_numel < 1:
        raise ValueError("nvio.offload: NVMeOptimizer: sub_group_numel must be an int >= 1 "
                         "(parameter elements per sub-group), not %r" % (sub_group_numel,))
    if pool_bytes is not None and (not is_int(pool_bytes) or pool_bytes < 0):
        raise ValueError("nvio.offload: NVMeOptimizer: pool_bytes must be None or an int "
                         ">= 0, not %r" % (pool_bytes,))
    if not (master_weights == "auto" and isinstance(master_weights, str)) and \
            not isinstance(master_weights, bool):
        raise ValueError("nvio.offload: NVMeOptimizer: master_weights must be 'auto', True "
                         "or False, not %r" % (master_weights,))
    if swapper is not None and not isinstance(swapper, Swapper):
        raise TypeError("nvio.offload: NVMeOptimizer: swapper must be an "
                        "nvio.offload.Swapper, not %s" % type(swapper).__name__)
    if model_offload is not None:
        if not isinstance(model_offload, ModelOffload):
            raise TypeError("nvio.offload: NVMeOptimizer: model_offload must be the "
                            "ModelOffload from offload_model(), not %s"
                            % type(model_offload).__name__)


def _now():
    return time.perf_counter()
