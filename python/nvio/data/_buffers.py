"""Where a batch lands: one buffer per batch, its samples views of it.

* the main process: page-locked host memory (nvio.LockedBuffer; pageable
  where RLIMIT_MEMLOCK refuses), so a batch goes to a GPU with
  ``.to("cuda", non_blocking=True)`` and no ``pin_memory`` copy;
* a DataLoader worker: a torch tensor in shared memory, so handing the
  batch to the main process copies nothing (the DataLoader sends its
  shared-memory handle);
* device="cuda": device memory, filled by libnvio's GPU paths (bounce
  buffers with AioHandle, cuFile with gds=True).
"""
import sys

import nvio


def in_worker():
    """Whether this process is a DataLoader worker."""
    data = sys.modules.get("torch.utils.data")
    return data is not None and data.get_worker_info() is not None


def host(nbytes):
    """A buffer of nbytes for one batch in this process (see above)."""
    import torch
    if in_worker():
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()
    return nvio.LockedBuffer(max(nbytes, 1))


def device(nbytes, where):
    """A uint8 tensor of nbytes of device memory on where ("cuda", "cuda:1")."""
    import torch                    # nvio.data runs without torch until a batch needs it
    from nvio import _device        # (it imports torch)
    s = _device.empty(max(nbytes, 1), where)
    return torch.empty(0, dtype=torch.uint8, device=s.device).set_(s)


def as_tensor(buf):
    """A flat uint8 tensor over buf (a LockedBuffer or a tensor)."""
    import torch
    if isinstance(buf, torch.Tensor):
        return buf
    return torch.frombuffer(buf, dtype=torch.uint8)


def torch_dtype(np_dtype):
    import numpy as np
    import torch
    return {np.dtype(np.uint8): torch.uint8, np.dtype(np.int8): torch.int8,
            np.dtype(np.int16): torch.int16, np.dtype(np.int32): torch.int32,
            np.dtype(np.int64): torch.int64, np.dtype(np.float64): torch.float64,
            np.dtype(np.float32): torch.float32, np.dtype(np.uint16): torch.uint16,
            np.dtype(np.uint32): torch.uint32}[np.dtype(np_dtype)]
