"""Hugging Face ``Trainer`` checkpoints written and read by nvio.

One line, after the Trainer is made::

    from nvio.integrations.transformers import use_nvio
    trainer = Trainer(model=model, args=args, ...)
    use_nvio(trainer)                 # returns a hook: hook.remove() undoes it
    trainer.train()                   # checkpoint-N/ written by nvio
    trainer.train(resume_from_checkpoint=True)   # and read back by nvio

What goes through nvio: the model's weights (``model.safetensors``, the same
bytes as safetensors writes, by :func:`nvio.safetensors.save_file`; shards
too, as ``save_pretrained`` cuts them), the optimizer's state
(``optimizer.pt``) and the scheduler's (``scheduler.pt``) by :func:`nvio.save`
(torch's format: stock Trainer resumes from them), and on resume
``model.safetensors`` by :func:`nvio.safetensors.load_file`, the optimizer
and scheduler by :func:`nvio.load`. Each file replaces the old one only once
complete and (``durable=True``, the default) fsynced. The small files (config,
trainer_state.json, rng_state.pth, training_args.bin) stay the Trainer's.

Under DeepSpeed, FSDP, XLA or SageMaker model parallelism the Trainer's own
code runs unchanged (those write their own formats).

How: the hook sets four of the trainer's methods on the instance (``_save``,
``_save_optimizer_and_scheduler``, ``_load_from_checkpoint``,
``_load_optimizer_and_scheduler``); while the model's own ``_save`` or
``_load_from_checkpoint`` runs, the names ``transformers.modeling_utils.safe_save_file``
and ``transformers.trainer.safetensors`` refer to nvio's (and back after, under
a lock). Nothing else is changed; nothing at import.
"""
from __future__ import annotations

import contextlib
import os
import threading
import types
import warnings

import transformers.modeling_utils as _modeling_utils
import transformers.trainer as _trainer_mod
from transformers import Trainer

from .. import safetensors as _nst
from ..checkpoint import load, save

__all__ = ["use_nvio", "NvioTrainerHook"]

OPTIMIZER_NAME = getattr(_trainer_mod, "OPTIMIZER_NAME", "optimizer.pt")
SCHEDULER_NAME = getattr(_trainer_mod, "SCHEDULER_NAME", "scheduler.pt")
_METHODS = ("_save", "_save_optimizer_and_scheduler", "_load_from_checkpoint",
            "_load_optimizer_and_scheduler")
_swap_lock = threading.RLock()


def _flag(fn_name):
    fn = getattr(_trainer_mod, fn_name, None)
    return bool(fn()) if callable(fn) else False


def _plain(trainer):
    """True where the Trainer's plain single-process-format path runs."""
    return not (getattr(trainer, "is_deepspeed_enabled", False)
                or getattr(trainer, "is_fsdp_enabled", False)
                or _flag("is_torch_xla_available") or _flag("is_sagemaker_mp_enabled"))


class _SafetensorsShim(types.ModuleType):
    """``transformers.trainer.safetensors`` while the hook's calls run:
    ``.torch`` is nvio.safetensors with the hook's options."""

    def __init__(self, hook):
        super().__init__("nvio.integrations.transformers.safetensors")
        self.torch = types.SimpleNamespace(save_file=hook._save_file,
                                           load_file=_nst.load_file)


class NvioTrainerHook:
    """What :func:`use_nvio` attached to one Trainer; :meth:`remove` detaches it."""

    def __init__(self, trainer, *, durable=True, handle=None):
        self.trainer = trainer
        self.durable = bool(durable)
        self.handle = handle
        self._shim = _SafetensorsShim(self)
        self._had = {}
        for name in _METHODS:
            if name in vars(trainer):
                raise RuntimeError(f"nvio: {type(trainer).__name__}.{name} is already set on "
                                   "this trainer (use_nvio twice, or another hook)")
        for name in _METHODS:
            setattr(trainer, name, types.MethodType(getattr(NvioTrainerHook, "_t" + name), self))

    def remove(self):
        """Detach: the trainer's own methods again."""
        for name in _METHODS:
            vars(self.trainer).pop(name, None)

    # ------------------------------------------------------------ plumbing
    def _save_file(self, tensors, filename, metadata=None):
        _nst.save_file(tensors, filename, metadata=metadata, durable=self.durable,
                       handle=self.handle)

    @contextlib.contextmanager
    def _swapped(self):
        with _swap_lock:
            old = (_modeling_utils.safe_save_file, _trainer_mod.safetensors)
            _modeling_utils.safe_save_file = self._save_file
            _trainer_mod.safetensors = self._shim
            try:
                yield
            finally:
                _modeling_utils.safe_save_file, _trainer_mod.safetensors = old

    def _own(self, name):
        return getattr(type(self.trainer), name).__get__(self.trainer)

    # ---------------------------------------- the trainer's methods, on nvio
    def _t_save(self, output_dir=None, state_dict=None):
        with self._swapped():
            return self._own("_save")(output_dir, state_dict=state_dict)

    def _t_load_from_checkpoint(self, resume_from_checkpoint, model=None):
        with self._swapped():
            return self._own("_load_from_checkpoint")(resume_from_checkpoint, model=model)

    def _t_save_optimizer_and_scheduler(self, output_dir):
        t = self.trainer
        if not _plain(t):
            return self._own("_save_optimizer_and_scheduler")(output_dir)
        if t.args.should_save:
            os.makedirs(output_dir, exist_ok=True)
            save(t.optimizer.state_dict(), os.path.join(output_dir, OPTIMIZER_NAME),
                 durable=self.durable, handle=self.handle)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # the scheduler's "save the optimizer too"
                sched = t.lr_scheduler.state_dict()
            save(sched, os.path.join(output_dir, SCHEDULER_NAME), durable=self.durable,
                 handle=self.handle)

    def _t_load_optimizer_and_scheduler(self, checkpoint):
        t = self.trainer
        if checkpoint is None:
            return None
        opt = os.path.join(checkpoint, OPTIMIZER_NAME)
        sched = os.path.join(checkpoint, SCHEDULER_NAME)
        if not (_plain(t) and os.path.isfile(opt) and os.path.isfile(sched)):
            return self._own("_load_optimizer_and_scheduler")(checkpoint)
        # as the Trainer: the CPU on one device, each rank's device when distributed
        dev = t.args.device
        where = dev if t.args.world_size > 1 and dev.type != "cpu" else "cpu"
        t.optimizer.load_state_dict(load(opt, map_location=where, weights_only=True,
                                         handle=self.handle))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            t.lr_scheduler.load_state_dict(load(sched, weights_only=True, handle=self.handle))
        return None


def use_nvio(trainer, *, durable=True, handle=None):
    """Make ``trainer`` write and read its checkpoints through nvio (see the
    module's doc for which files); returns the :class:`NvioTrainerHook`,
    whose ``remove()`` puts the Trainer's own code back. ``durable=False``
    skips the fsyncs; ``handle``: the :class:`nvio.AioHandle` to use."""
    if not isinstance(trainer, Trainer):
        raise TypeError(f"nvio: use_nvio needs a transformers.Trainer, not {type(trainer).__name__}")
    return NvioTrainerHook(trainer, durable=durable, handle=handle)
