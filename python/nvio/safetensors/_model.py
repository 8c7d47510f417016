"""save_model / load_model: a module's state, shared tensors saved once.

A state dict names one storage under several names when a module ties
weights (``b = a``, tied embeddings). safetensors stores bytes once per
name and refuses shared tensors, so ``save_model`` keeps one name per
group of shared tensors (the one covering the storage whole) and records
each dropped name in the metadata as ``{dropped: kept}``, as
safetensors.torch.save_model does; ``load_model`` loads the file into the
module and does not count the names the module itself shares as missing.
"""
from __future__ import annotations

from ._io import load_file, save_file
from ._shared import _remove_duplicate_names


def save_model(model, filename, metadata=None, force_contiguous=True, **kwargs):
    """``safetensors.torch.save_model(model, filename, metadata=None,
    force_contiguous=True)`` through :func:`save_file` (crash-safe, same
    bytes). ``force_contiguous``: save non-contiguous tensors as contiguous
    copies (False: refuse them, ValueError). Other keyword arguments
    (``durable``, ``spare``, ``handle``) go to :func:`save_file`."""
    state_dict = model.state_dict()
    dropped = _remove_duplicate_names(state_dict)
    if dropped:
        metadata = dict(metadata) if metadata is not None else {}
        for kept, names in dropped.items():
            for name in names:
                metadata.setdefault(name, kept)
                del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
        save_file(state_dict, filename, metadata=metadata, **kwargs)
        return
    bad = sorted(k for k, v in state_dict.items() if not v.is_contiguous())
    if bad:
        raise ValueError("nvio.safetensors: tensors %s of the module are not contiguous, "
                         "which safetensors cannot store: use save_model(..., "
                         "force_contiguous=True), which saves contiguous copies of them."
                         % bad)
    save_file(state_dict, filename, metadata=metadata, **kwargs)


def load_model(model, filename, strict=True, device="cpu", *, backend="mmap", **kwargs):
    """``safetensors.torch.load_model(model, filename, strict=True,
    device="cpu", *, backend="mmap")``: the file's tensors copied into
    model (``load_state_dict``), read by :func:`load_file` (``backend`` as
    there; other keyword arguments such as ``pin_memory`` and ``handle`` go
    to it too). Returns (missing, unexpected) names; with ``strict`` either
    raises RuntimeError listing them. A name the module shares with another
    (tied weights) is neither missing nor unexpected when the file holds
    the other."""
    state_dict = load_file(filename, device=device, backend=backend, **kwargs)
    shared = _remove_duplicate_names(model.state_dict(), preferred_names=state_dict.keys())
    missing, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing)
    for names in shared.values():
        for name in names:
            if name in missing:
                missing.remove(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        lines = ["Error(s) in loading state_dict for %s (nvio.safetensors.load_model of %s):"
                 % (type(model).__name__, filename)]
        if missing:
            lines.append("    Missing key(s) in state_dict: %s"
                         % ", ".join('"%s"' % k for k in sorted(missing)))
        if unexpected:
            lines.append("    Unexpected key(s) in state_dict: %s"
                         % ", ".join('"%s"' % k for k in sorted(unexpected)))
        raise RuntimeError("\n".join(lines))
    return missing, unexpected
