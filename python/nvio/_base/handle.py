"""The throughput handle: how nvio's applications move big tensors.

``throughput_handle()`` makes an AioHandle for bulk transfers (8 MiB
blocks, queue depth 32, up to 4 workers); ``default_handle()`` is the one
such handle shared by the applications that are given none (made on first
use, remade after a fork or a close). ``env_direct()`` reads NVIO_DIRECT
the way AioHandle does, for an application that must know the answer
before it makes its handle.
"""
from __future__ import annotations

import os
import threading

from ..handles import AioHandle

#: The throughput handle's shape.
BLOCK_SIZE = 8 << 20
QUEUE_DEPTH = 32

_handle = None
_handle_lock = threading.Lock()


def throughput_handle(**kwargs):
    """A new AioHandle for bulk transfers (8 MiB blocks, queue depth 32, up
    to 4 workers); ``kwargs`` (engine, direct, ...) go to AioHandle."""
    kw = dict(block_size=BLOCK_SIZE, queue_depth=QUEUE_DEPTH,
              intra_op_parallelism=max(1, min(4, os.cpu_count() or 1)))
    kw.update(kwargs)
    return AioHandle(**kw)


def default_handle():
    """The handle nvio's checkpoint functions use when given none: made on
    first use for throughput (8 MiB blocks, queue depth 32, up to 4 workers)."""
    global _handle
    with _handle_lock:
        if _handle is None or _handle.closed:
            _handle = throughput_handle()
        return _handle


def env_direct():
    """NVIO_DIRECT as AioHandle reads it: (True or False, the variable's
    text) where it is set to something other than "auto", else (None, "")."""
    env = os.environ.get("NVIO_DIRECT", "")
    if not env or env.lower() == "auto":
        return None, ""
    return env.lower() not in ("false", "off", "0", "no"), env


def _forget_handle_after_fork():
    global _handle, _handle_lock
    _handle = None              # the parent's: unusable here (ECHILD)
    _handle_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_handle_after_fork)
