"""Lightning checkpoints through nvio: a ``CheckpointIO`` plugin.

::

    import lightning as L
    from nvio.integrations.lightning import NvioCheckpointIO

    trainer = L.Trainer(plugins=[NvioCheckpointIO()])
    # in the background, through nvio.AsyncCheckpointer:
    trainer = L.Trainer(plugins=[NvioCheckpointIO(asynchronous=True)])

Saves go through :func:`nvio.save` (torch's zip format, so ``torch.load``
and Lightning's own ``TorchCheckpointIO`` read them; a file replaces the old
one only once complete and durable), loads through :func:`nvio.load`.
``ModelCheckpoint``'s top-k removal calls :meth:`NvioCheckpointIO.remove_checkpoint`.

``asynchronous=True`` rather than Lightning's ``AsyncCheckpointIO`` wrapper
(which also works): the wrapper queues saves in its own thread but passes
``remove_checkpoint`` straight through, so a top-k removal that runs before
the queued save of the same file has started removes nothing, and the save
then lands a file that ``ModelCheckpoint`` no longer tracks. Here a removal
or a load of a path waits for that path's queued saves first.

The plugin derives from the ``CheckpointIO`` of the ``lightning`` package
where it is installed, else of the standalone ``pytorch_lightning``
(``lightning_fabric``). Paths are local files (no fsspec URLs).
"""
from __future__ import annotations

import os
import shutil
from concurrent.futures import wait as _wait_all

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
except ImportError:  # the standalone pytorch_lightning package
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO

from ..checkpoint import AsyncCheckpointer, load, save

__all__ = ["NvioCheckpointIO"]

# nvio.save's options that Trainer.save_checkpoint(..., storage_options=...) may set
_SAVE_OPTIONS = ("durable", "spare", "align")


def _local_path(path, what):
    p = os.fspath(path)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if "://" in p:
        raise ValueError(f"nvio: NvioCheckpointIO.{what}: {p!r} is not a local path "
                         "(nvio reads and writes local files only)")
    return p


class NvioCheckpointIO(CheckpointIO):
    """Lightning ``CheckpointIO`` saving with :func:`nvio.save`, loading with
    :func:`nvio.load`.

    ``durable`` (default True): each checkpoint is fsynced before it replaces
    the previous file; ``spare``: reuse the blocks of the file it replaces
    (see :func:`nvio.save`); ``handle``: the :class:`nvio.AioHandle` to use
    (default: nvio's checkpoint handle). ``Trainer.save_checkpoint(...,
    storage_options={"durable": False})`` overrides them for one save.

    ``asynchronous=True``: ``save_checkpoint`` returns once the state is
    copied (:class:`nvio.AsyncCheckpointer`), the write goes on in the
    background; a later call raises the error of a save that failed, and
    ``teardown`` (the end of ``fit``) waits for all of them. ``pool_bytes``
    bounds the memory of the copies of saves not yet written (None: as much
    as they take): a save that does not fit waits for earlier ones to be
    written, and one larger than the bound is refused (ValueError, with
    the sizes).
    """

    def __init__(self, *, durable=True, spare=False, handle=None, asynchronous=False,
                 pool_bytes=None):
        super().__init__()
        if pool_bytes is not None and not asynchronous:
            raise ValueError("nvio: NvioCheckpointIO: pool_bytes bounds asynchronous saves' "
                             "copies: give asynchronous=True with it")
        if pool_bytes is not None and pool_bytes <= 0:
            raise ValueError("nvio: NvioCheckpointIO: pool_bytes must be > 0 or None, not %r"
                             % (pool_bytes,))
        self.pool_bytes = pool_bytes
        self.durable = bool(durable)
        self.spare = bool(spare)
        self.handle = handle
        self.asynchronous = bool(asynchronous)
        self._writer = None
        self._pending = []          # (absolute path, future) in the order queued

    def _settle(self, path=None, wait=True):
        """Wait for the queued saves of ``path`` (of all with None; of none
        unless ``wait``), then raise the first error of a save that has
        ended, once."""
        if path is not None:
            path = os.path.abspath(path)
        for p, fut in list(self._pending) if wait else ():
            if path is None or p == path:
                _wait_all([fut])
        left, failed = [], None
        for p, fut in self._pending:
            if not fut.done():
                left.append((p, fut))
            elif failed is None and fut.exception() is not None:
                failed = fut.exception()
        self._pending = left
        if failed is not None:
            raise failed

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        path = _local_path(path, "save_checkpoint")
        opts = {"durable": self.durable, "spare": self.spare}
        if storage_options is not None:
            if not isinstance(storage_options, dict):
                raise TypeError("nvio: NvioCheckpointIO.save_checkpoint: storage_options must "
                                f"be a dict of {_SAVE_OPTIONS}, not {type(storage_options).__name__}")
            unknown = sorted(set(storage_options) - set(_SAVE_OPTIONS))
            if unknown:
                raise TypeError(f"nvio: NvioCheckpointIO.save_checkpoint: storage_options "
                                f"{unknown} not understood (nvio.save takes {_SAVE_OPTIONS})")
            opts.update(storage_options)
        d = os.path.dirname(path)
        if d:
            os.makedirs(d, exist_ok=True)
        if not self.asynchronous:
            save(checkpoint, path, handle=self.handle, **opts)
            return
        self._settle(wait=False)        # an earlier save's error; saves keep call order
        if self._writer is None:
            self._writer = AsyncCheckpointer(handle=self.handle, pool_bytes=self.pool_bytes)
        fut = self._writer.save(checkpoint, path, **opts)
        self._pending.append((os.path.abspath(path), fut))

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        """``weights_only=None`` means what it means to ``torch.load`` here
        (True since torch 2.6); Lightning passes what ``Trainer.fit(...,
        weights_only=)`` was given."""
        path = _local_path(path, "load_checkpoint")
        self._settle(path)
        if not os.path.exists(path):
            raise FileNotFoundError(f"Checkpoint file not found: {path}")
        if weights_only is None:
            weights_only = True
        return load(path, map_location=map_location, weights_only=weights_only,
                    handle=self.handle)

    def remove_checkpoint(self, path):
        path = _local_path(path, "remove_checkpoint")
        self._settle(path)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass

    def teardown(self):
        """Wait for the saves in the background; raise the first that failed."""
        try:
            self._settle()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
