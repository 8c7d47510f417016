"""Which tensors of a state dict share memory (safetensors.torch's rule).

Two tensors share when they are on the same device, in the same storage
(same start and size) and their byte ranges overlap; disjoint views of one
storage do not share (each saves as its own bytes). Meta tensors and
tensors without storage share nothing. The same names and results as the
safetensors library's helpers (``storage_ptr``, ``storage_size``,
``_find_shared_tensors``, ``_is_complete``, ``_end_ptr``,
``_remove_duplicate_names``), which code written for it imports.
"""
from __future__ import annotations


def storage_ptr(tensor):
    """Address of the start of tensor's storage (0: none, e.g. meta)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return 0


def storage_size(tensor):
    """Bytes of tensor's whole storage (0: none)."""
    try:
        return tensor.untyped_storage().nbytes()
    except (NotImplementedError, RuntimeError):
        return 0


def _end_ptr(tensor):
    """One past the last byte tensor's elements reach (its data_ptr when
    it has no elements), strides counted."""
    if tensor.numel() == 0:
        return tensor.data_ptr()
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride()))
    return tensor.data_ptr() + (last + 1) * tensor.element_size()


def _is_complete(tensor):
    """Whether tensor covers its whole storage, from its first byte, with
    no holes (a meta tensor counts as complete)."""
    return (tensor.data_ptr() == storage_ptr(tensor)
            and tensor.numel() * tensor.element_size() == storage_size(tensor))


def _split_overlapping(names, state_dict):
    """Cut one storage's names into groups of overlapping byte ranges."""
    areas = sorted((state_dict[k].data_ptr(), _end_ptr(state_dict[k]), k) for k in names)
    groups = [{areas[0][2]}]
    stop = areas[0][1]
    for start, end, k in areas[1:]:
        if start >= stop:
            groups.append({k})
        else:
            groups[-1].add(k)
        stop = max(stop, end)
    return groups


def _find_shared_tensors(state_dict):
    """[set of names] of every storage-backed tensor, one set per group of
    tensors whose bytes overlap (singletons included), in the order the
    state dict first names each storage."""
    by_storage = {}
    for k, v in state_dict.items():
        if v.device.type == "meta":
            continue
        ptr, size = storage_ptr(v), storage_size(v)
        if ptr and size:
            by_storage.setdefault((v.device, ptr, size), []).append(k)
    out = []
    for names in by_storage.values():
        out.extend(_split_overlapping(names, state_dict) if len(names) > 1 else [set(names)])
    return out


def shared_groups(tensors):
    """Sorted lists of names of tensors that share memory (groups of 2+)."""
    return [sorted(g) for g in _find_shared_tensors(tensors) if len(g) > 1]


def _remove_duplicate_names(state_dict, *, preferred_names=None, discard_names=None):
    """{name kept: [names dropped]} for every group of shared tensors: the
    kept name covers its storage whole (complete); among those, one of
    preferred_names if any, else one not in discard_names, else the first
    in sorted order. RuntimeError when no name of a group is complete (a
    lone tensor that is a part of its storage too, as safetensors has it:
    saving it would not give back what shares its storage)."""
    preferred_names = set(preferred_names or ())
    discard_names = set(discard_names or ())
    out = {}
    for group in _find_shared_tensors(state_dict):
        complete = {k for k in group if _is_complete(state_dict[k])}
        if not complete:
            raise RuntimeError(
                "nvio.safetensors: tensors %s: none covers the whole storage it is part of, "
                "so no name can be kept for it: clone the ones to save (each is then written "
                "in full) or save the tensor they are views of" % sorted(group))
        keep = (sorted(complete & preferred_names) or sorted(complete - discard_names)
                or sorted(complete))[0]
        if len(group) > 1:
            out[keep] = sorted(k for k in group if k != keep)
    return out
