"""nvio.offload: training with optimizer state, gradients and weights on NVMe.

    sw = nvio.offload.Swapper(["/nvme0", "/nvme1"], pool_bytes=1 << 30)
    sw.swap_out("w", tensor); t = sw.swap_in("w"); sw.release("w")

    opt = nvio.offload.NVMeOptimizer(torch.optim.AdamW(model.parameters()), "/nvme0")
    om = nvio.offload.offload_model(model, "/nvme0")   # weights + grads on NVMe

    m = nvio.offload.stream_model(model, "/nvme0/store")  # inference, weights streamed

Everything here is plain PyTorch from the outside: hooks are removable, the
wrapped optimizer is torch's own, results are bit-identical to in-memory
training.
"""
from ._swapper import ALIGN, SwapCorruptError, SwapError, Swapper
from ._stream import StreamError, stream_model, streamed, unstream

__all__ = ["Swapper", "SwapError", "SwapCorruptError", "ALIGN"]
__all__ += ["stream_model", "unstream", "streamed", "StreamError"]
from ._optimizer import NVMeOptimizer  # noqa: E402

from ._model import ModelOffload, offload_model  # noqa: E402

__all__ += ["NVMeOptimizer", "offload_model", "ModelOffload"]
