"""bench/ramdisk.py - the RAM disk of bench/ramdisk.sh, for the benchmarks.

``with ramdisk.mounted("4G", log) as mnt:`` mounts it at $NVIO_RAMDISK
(/mnt/nvio-ram) for the block and takes it down after, also on an error.
``fs="xfs"`` makes it xfs instead of ext4; ``name="x"`` mounts it at
/mnt/nvio-ram-x (its tmpfs at /mnt/nvio-ram-x-backing) instead, so that a
benchmark's own disks (an ext4 and an xfs side by side) are never another
run's.
A disk already mounted there is someone else's (another benchmark running,
a user's files): it is used as it is and left up, since taking it down
would lose their files.
"""
import contextlib
import os
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))


def mount_point(env=None):
    return (os.environ if env is None else env).get("NVIO_RAMDISK", "/mnt/nvio-ram")


@contextlib.contextmanager
def mounted(size, log=None, env=None, fs="ext4", name=None):
    """The RAM disk's mount point, up for the block (see the module)."""
    if name is not None:
        env = dict(os.environ if env is None else env,
                   NVIO_RAMDISK="/mnt/nvio-ram-%s" % name,
                   NVIO_RAMDISK_BACKING="/mnt/nvio-ram-%s-backing" % name)
    mnt = mount_point(env)
    ours = not os.path.ismount(mnt)
    if ours:
        subprocess.run(["sh", os.path.join(HERE, "ramdisk.sh"), "up", size, fs], check=True,
                       env=env)
    elif log is not None:
        log("%s already mounted (not ours): used as it is, left up" % mnt)
    try:
        yield mnt
    finally:
        if ours:
            subprocess.run(["sh", os.path.join(HERE, "ramdisk.sh"), "down"], env=env)
