"""bench/hugepages.py - a hugetlbfs mount for fio's --mem=mmaphuge buffers.

BENCHMARKING.md rule 3: fio's best includes runs with its buffers in huge
pages, since this virtio disk takes 254 segments per request and 4 KiB-page
buffers fragment. `reserved(nbytes)` reserves enough 2 MiB pages
(vm.nr_hugepages, the old value saved), mounts hugetlbfs at
$NVIO_HUGETLBFS (/mnt/nvio-huge) and yields the path of a file there for
fio's `--mem=mmaphuge:PATH`, or None when the pages could not be had; on
exit (errors and SIGTERM/SIGHUP turned into SystemExit included) it
unmounts and puts nr_hugepages back, so nothing is left behind.
"""
import contextlib
import os
import subprocess

MNT = os.environ.get("NVIO_HUGETLBFS", "/mnt/nvio-huge")
NR = "/proc/sys/vm/nr_hugepages"


def _nr():
    with open(NR) as f:
        return int(f.read())


def _set_nr(n):
    with open(NR, "w") as f:
        f.write("%d\n" % n)


@contextlib.contextmanager
def reserved(nbytes, log=print):
    if nbytes <= 0:
        yield None
        return
    old = _nr()
    want = old + (nbytes + (2 << 20) - 1) // (2 << 20)
    mounted = False
    try:
        _set_nr(want)
        got = _nr()
        if got < want:
            log("hugepages: asked %d 2 MiB pages, got %d: fio runs without huge pages" %
                (want, got))
            yield None
            return
        os.makedirs(MNT, exist_ok=True)
        subprocess.run(["mount", "-t", "hugetlbfs", "nvio-huge", MNT], check=True)
        mounted = True
        log("hugepages: %d pages reserved, hugetlbfs at %s" % (got - old, MNT))
        yield os.path.join(MNT, "fio-buf")
    finally:
        if mounted:
            subprocess.run(["umount", MNT])
            try:
                os.rmdir(MNT)
            except OSError:
                pass
        _set_nr(old)
