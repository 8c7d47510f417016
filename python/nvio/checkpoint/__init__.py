"""Torch checkpoints at the device's speed: nvio.save, nvio.load, nvio.async_save.

    nvio.save(model.state_dict(), "/nvme/ckpt.pt")        # crash-safe, fast
    sd = nvio.load("/nvme/ckpt.pt", map_location="cpu")   # = torch.load's result
    fut = nvio.async_save(state, "/nvme/step100.pt")      # returns after a snapshot
    fut.result()                                          # durable on disk

Files are torch's own zip format (plain ``torch.load`` reads them) with each
tensor's bytes on a page boundary, so loads read them with O_DIRECT straight
into the tensors. ``python -m nvio.checkpoint info|verify PATH`` inspects one.
"""
from ._async import AsyncCheckpointer, async_save, default_checkpointer
from ._load import load
from .._base.plan import CheckpointError, DEFAULT_ALIGN
from ._save import default_handle, save

__all__ = ["save", "load", "async_save", "AsyncCheckpointer", "default_checkpointer",
           "CheckpointError", "DEFAULT_ALIGN", "default_handle", "cli"]


def cli(argv=None, prog="nvio checkpoint"):
    """``nvio checkpoint`` and ``python -m nvio.checkpoint`` (info, verify):
    the exit status of the command line argv."""
    from .__main__ import main   # its argparse is loaded only for the command
    return main(argv, prog=prog)
