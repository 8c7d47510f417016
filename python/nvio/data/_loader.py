"""Batches read ahead from the main process, no worker processes needed:
I/O concurrency (one vectored submission per batch, ``prefetch`` batches
in flight) replaces the processes a DataLoader would fork to wait on page
faults."""
import collections
import sys

from . import _buffers


def collate(batch):
    """A DataLoader collate_fn that keeps nvio.data's batches as they are
    (views of the one buffer the batch was read into); the default collate
    would copy them into a new tensor."""
    return getattr(batch, "batch", batch)


class _Pool:
    """Host buffers for a loader's batches, reused once nothing outside the
    pool refers to them (a batch the caller still holds keeps its buffer)
    and, where torch.cuda is in use, once the current CUDA stream has passed
    an event recorded when the pool first found the buffer unreferenced: a
    ``.to("cuda", non_blocking=True)`` copy of a batch the caller enqueued
    and then dropped may still be reading the buffer. (A copy on another
    stream is not covered: synchronise it, or keep the batch until it is
    done.)"""

    def __init__(self):
        self.free = []
        self.fences = {}        # id(buffer) -> CUDA event recorded once it was dropped

    def _settled(self, b):
        """Whether no CUDA copy of b's last batch can still be running."""
        torch = sys.modules.get("torch")
        cuda = getattr(torch, "cuda", None)
        if cuda is None or not cuda.is_available() or not cuda.is_initialized():
            return True         # no CUDA in this process: nothing copies from b
        ev = self.fences.get(id(b))
        if ev is None:
            ev = self.fences[id(b)] = cuda.Event()
            ev.record()         # after every copy enqueued on the current stream so far
        return ev.query()

    def take(self, nbytes):
        for b in self.free:
            # references: the list, b, getrefcount's argument
            if len(b) >= max(nbytes, 1) and sys.getrefcount(b) <= 3 and self._settled(b):
                self.fences.pop(id(b), None)
                return b
        if _buffers.in_worker():
            return _buffers.host(nbytes)
        b = _buffers.host(nbytes)
        self.free.append(b)
        if len(self.free) > 16:
            keep = [x for x in self.free
                    if sys.getrefcount(x) > 3 or x is b or not self._settled(x)]
            for x in self.free:
                if not any(x is k for k in keep):
                    self.fences.pop(id(x), None)
            self.free = keep
        return b


class BatchLoader:
    """Iterate over batches of an nvio.data dataset, reading ``prefetch``
    batches ahead of the one being used.

    The indices come from ``batch_sampler``, or from ``sampler`` (any
    PyTorch sampler, a DistributedSampler included) grouped by
    ``batch_size`` (``drop_last`` as in DataLoader), or, without either,
    from range(len(dataset)) (shuffled with ``shuffle``, by ``generator``).
    Each batch is ONE vectored submission into one page-locked buffer
    (device memory with ``device="cuda"``); what a batch is depends on the
    dataset (TokenWindows: a tensor [batch, seq_len + 1]; IndexedDataset:
    a list of tensors). A batch stays valid while the caller holds it: its
    buffer is reused only once nothing refers to it and, where torch.cuda is
    in use, once the current CUDA stream has passed the point where the
    batch was dropped, so ``batch.to("cuda", non_blocking=True)`` on the
    current stream may drop the batch at once; a copy on another stream
    must be synchronised (or the batch kept) until it is done.
    """

    def __init__(self, dataset, batch_size=1, shuffle=False, sampler=None, batch_sampler=None,
                 drop_last=False, generator=None, *, prefetch=2, device=None):
        from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler
        if batch_sampler is None:
            if sampler is None:
                sampler = (RandomSampler(dataset, generator=generator) if shuffle
                           else SequentialSampler(dataset))
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)
        if prefetch < 0:
            raise ValueError("nvio.data: prefetch must be >= 0")
        self.dataset = dataset
        self.batch_sampler = batch_sampler
        self.prefetch = prefetch
        self.device = device
        self._pool = _Pool()

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        it = iter(self.batch_sampler)
        pending = collections.deque()
        host = self.device is None or str(self.device) == "cpu"
        take = self._pool.take if host else None

        def fill():
            while len(pending) <= self.prefetch:
                try:
                    idx = next(it)
                except StopIteration:
                    return
                pending.append(self.dataset.submit_batch(idx, device=self.device, buffer=take))

        fill()
        while pending:
            batch = pending.popleft()
            fill()
            yield batch.wait()
