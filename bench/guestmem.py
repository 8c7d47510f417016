"""guestmem.py - keep a VM's freed memory in the guest while a benchmark runs.

A guest with virtio-balloon free page reporting hands every free block of
2^page_reporting_order pages back to the host about two seconds after it is
freed, and the next touch of that memory faults on the host. On the
development VMs that makes fresh memory slow: touching 2 GiB in 4 KiB pages
took 4.7-5.5 s with reporting on and 1.4-1.5 s with it off. In a benchmark
every drop_caches, every exiting fio and every freed Python buffer hands
gigabytes back, and whoever runs next pays for it (bench/README.md has the
measurements). Bare-metal NVMe servers have no such cost, so the benchmarks
pause reporting for their run and restore it afterwards.

Pausing means raising page_reporting_order above the largest buddy order
(/proc/buddyinfo), so that no free block qualifies. Kernels that refuse such
a value (upstream caps it at MAX_PAGE_ORDER) keep reporting; the report says
so.
"""
import contextlib

PARAM = "/sys/module/page_reporting/parameters/page_reporting_order"
REPORTED = "/sys/module/page_reporting/parameters/reported_kib"


def _max_order():
    with open("/proc/buddyinfo") as f:
        line = f.readline().split()
    # "Node 0, zone DMA n0 n1 ... nK": counts for orders 0..K
    return len(line) - 5


def reported_kib():
    """KiB reported to the host since boot, or None where not exposed."""
    try:
        with open(REPORTED) as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def page_reporting_paused(enabled=True):
    """Yields a dict whose "note" describes what was done, for the report."""
    state = {"note": "free page reporting: not present on this kernel", "paused": False}
    old = None
    try:
        with open(PARAM) as f:
            old = f.read().strip()
    except OSError:
        pass
    if old is not None and not enabled:
        state["note"] = "free page reporting: left on (order %s), as asked" % old
        old = None
    elif old is not None:
        want = str(_max_order() + 1)
        try:
            with open(PARAM, "w") as f:
                f.write(want)
            state["paused"] = True
            state["note"] = ("free page reporting to the hypervisor: paused for the run "
                             "(page_reporting_order %s -> %s, restored after)" % (old, want))
        except OSError as e:
            state["note"] = ("free page reporting: ON, could not pause it (order %s; "
                             "writing %s: %s)" % (old, want, e.strerror))
            old = None
    k0 = reported_kib()
    try:
        yield state
    finally:
        k1 = reported_kib()
        if k0 is not None and k1 is not None:
            state["reported_mib"] = (k1 - k0) // 1024
        if old is not None:
            with open(PARAM, "w") as f:
                f.write(old)
