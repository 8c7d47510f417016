"""Byte views of tensors and storages (no copies), and element counts."""
from __future__ import annotations

import torch


def u8(storage):
    """A flat uint8 tensor over every byte of an untyped storage (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(
        storage, 0, (storage.nbytes(),), (1,))


def tensor_u8(t):
    """A flat uint8 tensor over a contiguous tensor's bytes (no copy, no
    autograd: a 0-d tensor, an empty one and a Parameter all work)."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(
        t.untyped_storage(), t.storage_offset() * t.element_size(),
        (t.numel() * t.element_size(),), (1,))


def numel(shape):
    """The number of elements of a tensor of ``shape`` (any iterable of ints)."""
    n = 1
    for s in shape:
        n *= s
    return n
