"""The zip container of torch checkpoints: layout for writing, index for reading.

torch.save writes an uncompressed ("stored") zip archive: every record has a
local header whose extra field pads its data to the storage alignment, a
data descriptor after the data (general purpose flag bit 3: CRC-32 and sizes
follow the data), a central directory and zip64 end records. nvio writes the
same structure with a larger alignment (a multiple of the page size), so a
loader can read every tensor record with O_DIRECT straight into place, and
so that plain ``torch.load``, Python's ``zipfile`` and any other zip reader
accept the file.

Nothing here touches tensor bytes: the writer lays out offsets and builds the
small metadata byte strings; the reader parses the directory.
"""
from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass, field

from .. import _nvio

# Signatures and fixed sizes (PKWARE APPNOTE 6.3.x).
LOCAL_SIG = 0x04034B50
CENTRAL_SIG = 0x02014B50
DESCRIPTOR_SIG = 0x08074B50
EOCD_SIG = 0x06054B50
ZIP64_EOCD_SIG = 0x06064B50
ZIP64_LOCATOR_SIG = 0x07064B50
LOCAL_SIZE = 30
CENTRAL_SIZE = 46
EOCD_SIZE = 22
ZIP64_EOCD_SIZE = 56
ZIP64_LOCATOR_SIZE = 20

FLAG_DESCRIPTOR = 1 << 3        # CRC and sizes in a descriptor after the data
FLAG_UTF8 = 1 << 11             # names are UTF-8
ZIP64_EXTRA_ID = 0x0001
PAD_EXTRA_ID = 0x4246           # b"FB": torch's padding field, filled with b"Z"

#: Sizes and offsets from which a record needs zip64 fields (tests lower it
#: to exercise those paths with small files).
ZIP64_LIMIT = 0xFFFFFFFF


class ZipFormatError(ValueError):
    """The bytes are not a zip archive nvio can read (truncated, corrupt)."""


# --- writing ---------------------------------------------------------------


class Record:
    """One member of the archive being written. Its place and size are
    fixed when it is made; ``end``, ``zip64`` and ``descriptor_size`` are
    plain attributes computed then (a state of 50,000 tensors reads them
    hundreds of thousands of times while it is laid out and written)."""

    __slots__ = ("name", "size", "header_offset", "data_offset", "crc", "local", "end",
                 "zip64", "descriptor_size")

    def __init__(self, name, size, header_offset=0, data_offset=0, crc=0, local=b""):
        self.name = name                    # full name, archive prefix included
        self.size = size                    # bytes of data
        self.header_offset = header_offset  # where the local header starts
        self.data_offset = data_offset      # where the data starts
        self.crc = crc
        self.local = local                  # the local header (fixed part, name, extra)
        self.end = data_offset + size
        self.zip64 = size >= ZIP64_LIMIT
        self.descriptor_size = 24 if self.zip64 else 16

    def __repr__(self):
        return "Record(%r, size=%d, header_offset=%d, data_offset=%d, crc=%#x)" % (
            self.name, self.size, self.header_offset, self.data_offset, self.crc or 0)

    def descriptor(self):
        """The data descriptor that follows the data (needs self.crc)."""
        if self.zip64:
            return struct.pack("<IIQQ", DESCRIPTOR_SIG, self.crc, self.size, self.size)
        return struct.pack("<IIII", DESCRIPTOR_SIG, self.crc, self.size, self.size)


def data_start(cursor, name_b, size, align):
    """Where the data of a record whose local header is at cursor starts:
    after the fixed part, the name, a zip64 field if size needs one, and a
    padding field (4 bytes and the padding) up to a multiple of align. The
    layout nvio writes (``_nvio.zip_local_header``) and torch.save's too, so a loader can
    predict offsets without reading the header."""
    start = cursor + LOCAL_SIZE + len(name_b) + (20 if size >= ZIP64_LIMIT else 0) + 4
    return start + (-start % align)


@dataclass
class Layout:
    """Offsets of every record of an archive, in file order."""

    align: int
    records: list = field(default_factory=list)
    cursor: int = 0

    def add(self, name, size, align=None):
        """Place the next record (data aligned to ``align``, by default
        self.align); returns it."""
        local, data_off = _nvio.zip_local_header(name, size, self.cursor,
                                                 align or self.align, ZIP64_LIMIT)
        r = Record(name, size, self.cursor, data_off, 0, local)
        self.records.append(r)
        self.cursor = r.end + r.descriptor_size
        return r

    def directory_size(self):
        """len(self.directory()), without building it (nor needing CRCs)."""
        n = ZIP64_EOCD_SIZE + ZIP64_LOCATOR_SIZE + EOCD_SIZE
        for r in self.records:
            k = 2 * (r.size >= ZIP64_LIMIT) + (r.header_offset >= ZIP64_LIMIT)
            n += CENTRAL_SIZE + len(r.name.encode("utf-8")) + (4 + 8 * k if k else 0)
        return n

    def directory(self):
        """Central directory and end records (needs every record's crc):
        made in C (``_nvio.zip_directory``), where the packed writer's
        image (``_nvio.ZipImage``) makes the same bytes."""
        return _nvio.zip_directory(self.records, self.cursor, ZIP64_LIMIT)


# --- reading ---------------------------------------------------------------


@dataclass
class Entry:
    """A member as the central directory describes it."""

    name: str
    size: int
    compressed: int
    method: int
    crc: int
    header_offset: int
    data_offset: int = -1       # known once the local header was read


#: Bytes at the end of the file that hold the end records (the EOCD may be
#: followed by a comment of up to 65535 bytes).
TAIL_BYTES = EOCD_SIZE + 0xFFFF + ZIP64_LOCATOR_SIZE + ZIP64_EOCD_SIZE


def find_directory(tail, tail_offset, file_size):
    """(offset, size, count) of the central directory from the file's last
    bytes ``tail`` (which start at ``tail_offset``)."""
    i = tail.rfind(struct.pack("<I", EOCD_SIG))
    while i >= 0 and i + EOCD_SIZE > len(tail):
        i = tail.rfind(struct.pack("<I", EOCD_SIG), 0, i)
    if i < 0:
        raise ZipFormatError("no end-of-central-directory record: not a zip "
                             "archive, or truncated")
    (_, disk, _, _, n, cd_size, cd_off, _) = struct.unpack_from("<IHHHHIIH", tail, i)
    if disk != 0:
        raise ZipFormatError("multi-disk zip archives are not supported")
    j = i - ZIP64_LOCATOR_SIZE
    if j >= 0 and struct.unpack_from("<I", tail, j)[0] == ZIP64_LOCATOR_SIG:
        (_, _, z64_off, _) = struct.unpack_from("<IIQI", tail, j)
        k = z64_off - tail_offset
        if not 0 <= k <= len(tail) - ZIP64_EOCD_SIZE or \
                struct.unpack_from("<I", tail, k)[0] != ZIP64_EOCD_SIG:
            raise ZipFormatError("zip64 end record missing at offset %d" % z64_off)
        (_, _, _, _, _, _, _, n, cd_size, cd_off) = struct.unpack_from("<IQHHIIQQQQ", tail, k)
    if cd_off + cd_size > file_size:
        raise ZipFormatError("central directory (offset %d, %d bytes) lies past the "
                             "end of the file (%d bytes): truncated" % (cd_off, cd_size, file_size))
    return cd_off, cd_size, n


def parse_directory(cd, count):
    """The entries of a central directory's bytes."""
    out = []
    p = 0
    for _ in range(count):
        if p + CENTRAL_SIZE > len(cd):
            raise ZipFormatError("central directory ends inside an entry")
        (sig, _, _, flags, method, _, _, crc, csize, usize, nlen, xlen, clen, _, _, _,
         off) = struct.unpack_from("<IHHHHHHIIIHHHHHII", cd, p)
        if sig != CENTRAL_SIG:
            raise ZipFormatError("bad central directory entry signature at byte %d" % p)
        name_b = cd[p + CENTRAL_SIZE:p + CENTRAL_SIZE + nlen]
        extra = cd[p + CENTRAL_SIZE + nlen:p + CENTRAL_SIZE + nlen + xlen]
        p += CENTRAL_SIZE + nlen + xlen + clen
        if usize == 0xFFFFFFFF or csize == 0xFFFFFFFF or off == 0xFFFFFFFF:
            usize, csize, off = _zip64_fields(extra, usize, csize, off)
        try:
            name = bytes(name_b).decode("utf-8" if flags & FLAG_UTF8 else "cp437")
        except UnicodeDecodeError:
            raise ZipFormatError("the name of directory entry %d (at byte %d) is not valid "
                                 "UTF-8" % (len(out), p - CENTRAL_SIZE - nlen - xlen - clen)) \
                from None
        out.append(Entry(name, usize, csize, method, crc, off))
    return out


def _zip64_fields(extra, usize, csize, off):
    q = 0
    while q + 4 <= len(extra):
        hid, hlen = struct.unpack_from("<HH", extra, q)
        if hid == ZIP64_EXTRA_ID:
            need = 8 * ((usize == 0xFFFFFFFF) + (csize == 0xFFFFFFFF) + (off == 0xFFFFFFFF))
            if hlen < need or q + 4 + hlen > len(extra):
                raise ZipFormatError("zip64 extra field of %d bytes (%d present) where %d "
                                     "are needed" % (hlen, len(extra) - q - 4, need))
            vals = list(struct.unpack_from("<%dQ" % (need // 8), extra, q + 4))
            if usize == 0xFFFFFFFF:
                usize = vals.pop(0)
            if csize == 0xFFFFFFFF:
                csize = vals.pop(0)
            if off == 0xFFFFFFFF:
                off = vals.pop(0)
            return usize, csize, off
        q += 4 + hlen
    raise ZipFormatError("zip64 sizes announced but no zip64 extra field")


def data_offset(entry, local):
    """Where an entry's data starts, from its local header's fixed part."""
    if len(local) < LOCAL_SIZE or struct.unpack_from("<I", local)[0] != LOCAL_SIG:
        raise ZipFormatError("bad local header of %s at offset %d"
                             % (entry.name, entry.header_offset))
    nlen, xlen = struct.unpack_from("<HH", local, 26)
    return entry.header_offset + LOCAL_SIZE + nlen + xlen


_KINDS = ((stat.S_ISDIR, "directory"), (stat.S_ISFIFO, "FIFO (named pipe)"),
          (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISSOCK, "socket"))


def open_regular(path, error):
    """A read-only descriptor of ``path`` (blocking, close-on-exec) when it is
    a regular file; else raises ``error(message)`` naming the path and what
    it is. Opened with O_NONBLOCK first, so that a FIFO (whose open waits
    for a writer) or a device never blocks the caller."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "special file")
            raise error("%s: not a regular file but a %s: a checkpoint is read from a "
                        "regular file" % (path, kind))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd
