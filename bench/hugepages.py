"""bench/hugepages.py - a hugetlbfs mount for fio's --mem=mmaphuge buffers.

BENCHMARKING.md rule 3: fio's best includes runs with its buffers in huge
pages, since this virtio disk takes 254 segments per request and 4 KiB-page
buffers fragment. `reserved(nbytes)` adds enough 2 MiB pages to
vm.nr_hugepages, mounts hugetlbfs at $NVIO_HUGETLBFS (default
/mnt/nvio-huge-PID, one mount per process) and yields the path of a file
there for fio's `--mem=mmaphuge:PATH`, or None when the pages could not be
had; on exit (errors and SIGTERM/SIGHUP turned into SystemExit included) it
unmounts and takes its own pages back off nr_hugepages, so nothing is left
behind.

Benchmarks run side by side on the shared machines: each takes back what it
added (not the value it found: restoring that, in any order but the reverse
one, left another run's pages reserved for good: 6,272 pages, 12 GiB, were
found so, under six hugetlbfs mounts stacked on one directory), under a lock
so two read-modify-writes do not interleave.
"""
import contextlib
import fcntl
import os
import subprocess

MNT = os.environ.get("NVIO_HUGETLBFS", "/mnt/nvio-huge-%d" % os.getpid())
NR = "/proc/sys/vm/nr_hugepages"
LOCK = "/tmp/nvio-hugepages.lock"


@contextlib.contextmanager
def _locked():
    with open(LOCK, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


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
    add = (nbytes + (2 << 20) - 1) // (2 << 20)
    added = 0
    mounted = False
    try:
        with _locked():
            old = _nr()
            _set_nr(old + add)
            got = _nr()
            added = max(got - old, 0)
        if got < old + add:
            log("hugepages: asked %d 2 MiB pages, got %d: fio runs without huge pages" %
                (add, added))
            yield None
            return
        os.makedirs(MNT, exist_ok=True)
        subprocess.run(["mount", "-t", "hugetlbfs", "nvio-huge", MNT], check=True)
        mounted = True
        log("hugepages: %d pages reserved, hugetlbfs at %s" % (added, MNT))
        yield os.path.join(MNT, "fio-buf")
    finally:
        if mounted:
            subprocess.run(["umount", MNT])
            try:
                os.rmdir(MNT)
            except OSError:
                pass
        if added:
            with _locked():
                _set_nr(max(_nr() - added, 0))
