"""nvio.offload.offload_model: a model's parameters and gradients on NVMe
between uses, for plain PyTorch training loops.

The model is cut into units: the children of the model, with containers
(ModuleList, Sequential, ModuleDict) opened up, so a transformer's units are
its embedding, each block, its final norm and head; the root's own
parameters are one more unit. A unit's parameters (all of its submodules')
live in a Swapper between uses, each parameter's ``.data`` an empty tensor:

* forward pre-hook: the unit's parameters are swapped in (pool tensors) and
  the next ``prefetch`` units in the recorded execution order are started;
  forward hook: released (their ``.data`` emptied again);
* full backward pre-hook: swapped in again (the units before it, in reverse
  order, prefetched); once every parameter of the unit has its gradient
  (post-accumulate-grad hooks) the unit is released and each gradient is
  swapped out and dropped (``p.grad`` is None; accumulation over
  micro-batches adds the swapped-out one back first);
* :class:`NVMeOptimizer` finds the handle by itself and reads parameters and
  gradients from the swapper for each of its sub-groups.

Hooks and parameters are put back by :meth:`ModelOffload.remove`. A module
that uses another unit's parameters outside that unit's forward (tied
weights read directly) is not supported: pass ``units=`` that keep them
together.
"""
from __future__ import annotations

import weakref

import torch

from ._swapper import ALIGN, Swapper, _up

__all__ = ["offload_model", "ModelOffload"]

_owners = {}        # id(param) -> (weakref to it, ModelOffload); tensors compare by value
_SAVED = object()     # marks a saved tensor that is a view of an offloaded parameter
_CONTAINERS = (torch.nn.ModuleList, torch.nn.Sequential, torch.nn.ModuleDict)


def _owner(params):
    """The ModelOffload holding any of params, or None."""
    for p in params:
        hit = _owners.get(id(p))
        if hit is not None and hit[0]() is p:
            return hit[1]
    return None


def _units(model):
    out = []

    def walk(m):
        for c in m.children():
            if isinstance(c, _CONTAINERS):
                walk(c)
            elif any(True for _ in c.parameters()):
                out.append(c)
    walk(model)
    if not out and any(True for _ in model.parameters()):
        out.append(model)
    return out


class _Unit:
    __slots__ = ("module", "params", "index", "users", "waiting", "__weakref__")

    def __init__(self, module, params, index):
        self.module, self.params, self.index = module, params, index
        self.users = 0          # forward/backward holding it
        self.waiting = set()    # params whose grad this backward has not produced


class ModelOffload:
    """What :func:`offload_model` returns: the swapper, the units, the hooks."""

    def __init__(self, model, swapper, own, units, prefetch, offload_grads):
        self.model = model
        self.swapper = swapper
        self._own = own
        self.prefetch_depth = prefetch
        self.offload_grads = offload_grads
        self._key = {}           # param -> key
        self._shape = {}         # param -> (shape, dtype)
        self._unit_of = {}       # param -> _Unit
        self._units = []
        self._order = []         # units in the order forward ran them
        self._recording = True
        self._pre = set()        # units prefetched and not yet used
        self._grads = set()      # params with a swapped-out gradient
        self._hooks = []
        self._in_step = set()
        self._live = set()       # params whose .data is a pool region now
        self._ctx = []           # saved-tensor hook contexts of running forwards
        names = {p: n for n, p in model.named_parameters(remove_duplicate=True)}
        if own_params := [p for p in names if _owner([p]) is not None]:
            raise ValueError("nvio.offload: %s is already offloaded" % names[own_params[0]])
        seen = set()
        for i, m in enumerate(units):
            ps = [p for p in m.parameters() if p not in seen]
            seen.update(ps)
            u = _Unit(m, ps, i)
            self._units.append(u)
            for p in ps:
                self._unit_of[p] = u
        root = [p for p in model.parameters(recurse=False) if p not in seen]
        if root:
            u = _Unit(model, root, len(self._units))
            self._units.append(u)
            for p in root:
                self._unit_of[p] = u
            seen.update(root)
        missing = [names[p] for p in names if p not in seen]
        if missing:
            raise ValueError("nvio.offload: parameters %s are in no unit" % missing[:5])
        for p in seen:
            self._key[p] = ("param", names[p])
            self._shape[p] = (p.shape, p.dtype)
            swapper.swap_out(self._key[p], p.detach())
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
            _owners[id(p)] = (weakref.ref(p), self)
        for u in self._units:
            m = u.module
            self._hooks.append(m.register_forward_pre_hook(self._pre_forward(u)))
            self._hooks.append(m.register_forward_hook(self._post_forward(u)))
            self._hooks.append(m.register_full_backward_pre_hook(self._pre_backward(u)))
            for p in u.params:
                if p.requires_grad:
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._grad_hook(u)))

    # -- sizes ---------------------------------------------------------------

    def numel(self, p):
        """A parameter's true number of elements (its .data is empty when offloaded)."""
        s = self._shape.get(p)
        return p.numel() if s is None else _prod(s[0])

    def is_offloaded(self, p):
        return p in self._key

    # -- fetching ------------------------------------------------------------

    def _fetch(self, u):
        sw = self.swapper
        u.users += 1
        self._pre.discard(u)
        if u.users > 1:
            return
        for p in u.params:
            if p not in self._in_step:
                p.data = sw.swap_in(self._key[p])
            self._live.add(p)

    def _release(self, u):
        u.users -= 1
        if u.users > 0:
            return
        for p in u.params:
            self._live.discard(p)
            if p not in self._in_step:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
                self.swapper.release(self._key[p])

    def _prefetch_from(self, u, step):
        """Start reading the next prefetch_depth units after u (step +1: forward,
        -1: backward) and drop stale prefetches."""
        if not self.prefetch_depth or u not in self._order:
            return
        i = self._order.index(u)
        want = []
        for j in range(1, self.prefetch_depth + 1):
            k = i + j * step
            if 0 <= k < len(self._order):
                want.append(self._order[k])
        for v in list(self._pre):
            if v not in want:
                self._pre.discard(v)
                if v.users == 0:
                    for p in v.params:
                        if p not in self._in_step:
                            self.swapper.release(self._key[p])
        for v in want:
            if v.users == 0 and v not in self._pre:
                self._pre.add(v)
                self.swapper.prefetch([self._key[p] for p in v.params])

    # Saved tensors: autograd keeps, from forward to backward, views of the
    # parameters (a LayerNorm's weight, the chunks of an attention's
    # in_proj_weight) that point into the pool region forward used. That
    # region is given back after forward, so each such tensor is saved as
    # (key, offset, size, stride) and rebuilt in backward over the region the
    # key is read into then.

    def _pack(self, t):
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu" or t.numel() == 0:
            return t
        ptr = t.data_ptr()
        for p in self._live:
            base = p.data_ptr()
            n = p.numel() * p.element_size()
            if base <= ptr < base + n and p.numel():
                if t.dtype != p.dtype:
                    return t.clone()
                return (_SAVED, self._key[p], (ptr - base) // p.element_size(),
                        tuple(t.shape), tuple(t.stride()))
        return t

    def _unpack(self, x):
        if not (isinstance(x, tuple) and len(x) == 5 and x[0] is _SAVED):
            return x
        _, key, off, shape, stride = x
        base = self.swapper.resident(key)
        if base is None:
            base = self.swapper.swap_in(key)
        flat = base.reshape(-1)
        return flat.as_strided(shape, stride, flat.storage_offset() + off)

    def _pre_forward(self, u):
        def hook(module, args):
            if self._recording and u not in self._order:
                self._order.append(u)
            self._fetch(u)
            self._prefetch_from(u, +1)
            if torch.is_grad_enabled():
                ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
                ctx.__enter__()
                self._ctx.append(ctx)
            else:
                self._ctx.append(None)
        return hook

    def _post_forward(self, u):
        def hook(module, args, out):
            ctx = self._ctx.pop() if self._ctx else None
            if ctx is not None:
                ctx.__exit__(None, None, None)
            self._release(u)
            if u is self._order[-1] if self._order else False:
                self._recording = False
        return hook

    def _pre_backward(self, u):
        def hook(module, grad_out):
            u.waiting = {p for p in u.params if p.requires_grad}
            self._fetch(u)
            self._prefetch_from(u, -1)
            if not u.waiting:
                self._release(u)
        return hook

    def _grad_hook(self, u):
        def hook(p):
            if self.offload_grads and p.grad is not None:
                key = ("grad",) + self._key[p][1:]
                g = p.grad
                if p in self._grads:        # accumulate over micro-batches
                    g = g + self.swapper.swap_in(key, out=torch.empty_like(g))
                self.swapper.swap_out(key, g, async_op=True)
                self._grads.add(p)
                p.grad = None
            if p in u.waiting:
                u.waiting.discard(p)
                if not u.waiting and u.users > 0:
                    self._release(u)
        return hook

    # -- the optimizer's side ------------------------------------------------

    def _grad_key(self, p):
        return ("grad",) + self._key[p][1:]

    def settle(self):
        """Before an optimizer step: drop prefetched units, let writes land."""
        for v in list(self._pre):
            self._pre.discard(v)
            if v.users == 0:
                for p in v.params:
                    if p not in self._in_step:
                        self.swapper.release(self._key[p])
        self.swapper.wait()

    def keys_for_step(self, params):
        """Keys an optimizer step of params reads: parameters and gradients."""
        keys = []
        for p in params:
            if p in self._key:
                keys.append(self._key[p])
                if p in self._grads:
                    keys.append(self._grad_key(p))
        return keys

    def begin_step(self, params):
        """Make params (and their gradients) resident for an optimizer step."""
        sw = self.swapper
        for p in params:
            if p not in self._key:
                continue
            self._in_step.add(p)
            if p.numel() == 0 and self.numel(p):
                p.data = sw.swap_in(self._key[p])
            if p in self._grads:
                p.grad = sw.swap_in(self._grad_key(p))

    def end_step(self, params):
        """Write the stepped params back (async, zero copy) and drop gradients."""
        sw = self.swapper
        for p in params:
            if p not in self._in_step:
                continue
            self._in_step.discard(p)
            if p.grad is not None and p in self._grads:
                p.grad = None
                sw.release(self._grad_key(p))
            sw.swap_out(self._key[p], p.detach(), async_op=True)
            if self._unit_of[p].users == 0:
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)
                sw.release(self._key[p])

    def zero_grad(self):
        """Forget the swapped-out gradients."""
        for p in list(self._grads):
            self.swapper.discard(self._grad_key(p))
        self._grads.clear()

    def fetch_param_copy(self, p):
        shape, dtype = self._shape[p]
        return self.swapper.swap_in(self._key[p], out=torch.empty(shape, dtype=dtype))

    def grad(self, p):
        """A copy of p's swapped-out gradient, or None."""
        if p not in self._grads:
            return None
        shape, dtype = self._shape[p]
        return self.swapper.swap_in(self._grad_key(p), out=torch.empty(shape, dtype=dtype))

    # -- undoing -------------------------------------------------------------

    def remove(self):
        """Put every parameter (and gradient) back in memory, remove the hooks,
        close the swapper if it is ours. The model is as it was."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        self.swapper.wait()
        for p, key in self._key.items():
            shape, dtype = self._shape[p]
            t = self.fetch_param_copy(p)
            g = self.grad(p)
            p.data = t
            if g is not None:
                p.grad = g
            _owners.pop(id(p), None)
        for u in self._units:
            u.users = 0
        self._key.clear()
        self._grads.clear()
        if self._own:
            self.swapper.close()

    def __repr__(self):
        return "ModelOffload(%d units, %d parameters, dirs=%s)" % (
            len(self._units), len(self._key), self.swapper.dirs)


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def offload_model(model, dirs=None, *, pool_bytes=None, prefetch=1, offload_grads=True,
                  units=None, swapper=None, **swapper_kwargs):
    """Keep ``model``'s parameters (and, with ``offload_grads``, its
    gradients) on NVMe in ``dirs`` while they are not in use; see the module
    documentation. ``pool_bytes`` (default: enough for ``prefetch`` + 3 of
    the largest unit's parameters and gradients) is all the memory used for
    them. Returns a :class:`ModelOffload`; ``.remove()`` undoes it."""
    us = list(units) if units is not None else _units(model)
    if pool_bytes is None:
        big = max((sum(_up(p.numel() * p.element_size()) for p in m.parameters())
                   for m in us + [model]), default=0)
        if us:
            big = max(sum(_up(p.numel() * p.element_size()) for p in m.parameters())
                      for m in us)
        pool_bytes = (prefetch + 3) * 2 * big + 8 * ALIGN
    own = swapper is None
    if own:
        if dirs is None:
            raise ValueError("nvio.offload: offload_model needs dirs or a swapper")
        swapper = Swapper(dirs, pool_bytes, **swapper_kwargs)
    try:
        return ModelOffload(model, swapper, own, us, prefetch, offload_grads)
    except BaseException:
        if own:
            swapper.close()
        raise
