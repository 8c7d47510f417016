"""nvio.offload: training with optimizer state, gradients and weights on NVMe.

    sw = nvio.offload.Swapper(["/nvme0", "/nvme1"], pool_bytes=1 << 30)
    sw.swap_out("w", tensor); t = sw.swap_in("w"); sw.release("w")

    opt = nvio.offload.NVMeOptimizer(torch.optim.AdamW(model.parameters()), "/nvme0")
    om = nvio.offload.offload_model(model, "/nvme0")   # weights + grads on NVMe

    m = nvio.offload.run_from_disk(model, "/nvme0/store")  # inference, weights read per block

Everything here is plain PyTorch from the outside: hooks are removable, the
wrapped optimizer is torch's own, results are bit-identical to in-memory
training.
"""
from ._swapper import ALIGN, SwapCorruptError, SwapError, Swapper
from ._fromdisk import WeightReadError, run_from_disk, run_from_memory, running_from_disk

__all__ = ["Swapper", "SwapError", "SwapCorruptError", "ALIGN"]
__all__ += ["run_from_disk", "run_from_memory", "running_from_disk", "WeightReadError"]
from ._optimizer import NVMeOptimizer  # noqa: E402

from ._model import ModelOffload, offload_model  # noqa: E402

__all__ += ["NVMeOptimizer", "offload_model", "ModelOffload"]

from .. import _renamed  # noqa: E402

# 0.3 (issue 31, one meaning per name: a Stream is libnvio's sequential
# reader or writer): the old names still work, warning once.
__getattr__ = _renamed.renamed(__name__, {"stream_model": "run_from_disk",
                                          "unstream": "run_from_memory",
                                          "streamed": "running_from_disk",
                                          "StreamError": "WeightReadError"}, globals())
