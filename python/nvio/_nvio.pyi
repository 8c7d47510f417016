"""Types of nvio._nvio, the C extension (python/nvio/_ext/).

Use the nvio package instead; this stub lets type checkers see what the
extension exports. Where a C function accepts any object and tests its
truth (the "p" format), the stub says bool.
"""
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, Literal, Protocol, Self, TypedDict, final

from _typeshed import StrOrBytesPath
from typing_extensions import Buffer, TypeAlias

# --- buffers (buffers.c) --------------------------------------------------

class _TensorLike(Protocol):
    """What nvio calls on a torch.Tensor (duck typed; torch is not imported)."""

    def data_ptr(self) -> int: ...
    def element_size(self) -> int: ...
    def is_contiguous(self) -> bool: ...
    def numel(self) -> int: ...

class _DLPackProducer(Protocol):
    """An object exporting a CPU DLPack capsule."""

    def __dlpack__(self) -> Any: ...

# An object with the buffer protocol (C-contiguous; writable for reads), a
# CPU or CUDA torch.Tensor, or a DLPack producer on the CPU.
_BufferLike: TypeAlias = Buffer | _TensorLike | _DLPackProducer

# A file: a path (str, bytes, os.PathLike) or an open descriptor, which is
# used as is and never closed.
_Target: TypeAlias = StrOrBytesPath | int

def buffer_info(buffer: _BufferLike, writable: bool = False, /) -> tuple[int, int]:
    """(address, nbytes) of what nvio would use."""

# --- CRC-32 (crc.c) ---------------------------------------------------------

def crc32(buffer: _BufferLike, crc: int = 0) -> int:
    """CRC-32 of a host buffer (zip's, zlib.crc32's), continuing crc."""

def crc32_combine(crc1: int, crc2: int, len2: int, /) -> int:
    """CRC-32 of A + B from crc(A), crc(B), len(B)."""

def crc32_many(regions: Sequence[tuple[int, int]], /) -> list[int]:
    """CRC-32 of each (address, nbytes) of host memory, the GIL released for
    the whole batch."""

def copy_many(copies: Sequence[tuple[int, int, int]], /) -> None:
    """Copy each (dst address, src address, nbytes) of host memory (regions
    must not overlap), the GIL released for the whole batch."""

class ZipImage:
    """A laid-out torch.save zip archive (nvio._base.torchzip records in
    file order) filled window by window without Python work per record.
    sources: the address of each tensor record's bytes in file order, or
    one address A where each record's bytes are at A + its data offset (an
    image in memory, checksummed in place)."""

    def __init__(self, items: list[tuple[Any, ...]], size: int, nparts: int,
                 zip64_limit: int, checksum: bool = True) -> None: ...

    def extend(self, base: int, records: list[Any], meta: dict[str, bytes],
               sources: list[int] | int, dir_offset: int = -1, size: int = -1, /) -> None:
        """More records of the archive at file offset base, open until a call
        gives dir_offset and size (its directory's place, its length); until
        then the image ends at its last record's descriptor, and windows up
        to there may be copied and filled. Never while a copy() runs."""

    def copy(self, base: int, w0: int, w1: int, part: int, /) -> None:
        """Copy and checksum part `part` (of nparts equal byte ranges) of the
        tensor bytes of window [w0, w1) to base + (offset - w0), the GIL
        released; parts of one window may run on several threads."""

    def fill(self, base: int, w0: int, w1: int, /) -> None:
        """Once every part of the window is copied (windows in file order):
        join its CRCs and write its headers, small records, descriptors and
        directory; the directory's window sets the records' crc."""

def zip_local_header(name: str, size: int, cursor: int, align: int, zip64_limit: int,
                     /) -> tuple[bytes, int]:
    """(local header bytes, data offset) of a zip record whose header starts
    at cursor and whose data starts on a multiple of align (torch.save's
    padding field; a zip64 field when size >= zip64_limit)."""

def zip_directory(records: list[Any], cursor: int, zip64_limit: int, /) -> bytes:
    """The central directory and end records of zip records (name, size,
    header_offset, crc) whose directory starts at cursor."""

def persistent_id_filter(plain: set[type] | frozenset[type],
                         fn: Callable[[Any], Any], /) -> Callable[[Any], Any]:
    """A persistent_id for a pickler: a PersistentId's pid, None for objects
    whose exact type is in plain, fn(obj) for the others."""

class PersistentId:
    """An object persistent_id_filter's persistent_id answers with pid."""

    pid: Any

    def __init__(self, pid: Any, /) -> None: ...

class TensorReducer:
    """torch.save's reduction of a plain CPU tensor, in C, for a pickler's
    dispatch table (see nvio/_ext/pickling.c): (rebuild, args) with the
    storage as a PersistentId whose id is torch.save's, made in the dicts
    given (nvio._base.plan._StorageIds'); any other tensor goes to slow(t)."""

    def __init__(self, *, slow: Callable[[Any], Any], rebuild: Any, strided: Any,
                 v3: set[Any] | frozenset[Any], tls: Any, has_storage: Callable[[Any], bool],
                 meta_of: Callable[[Any], Any], odict: type, stypes: dict[Any, Any],
                 stype_fn: Callable[[Any], Any], keys: dict[Any, str],
                 storages: dict[str, Any], types: dict[str, Any], dtypes: dict[int, Any],
                 location: str | None, location_fn: Callable[[Any], str],
                 pickling_error: type, grow: Callable[[], object] | None = None,
                 grow_bytes: int = 0, grow_extra: int = 0) -> None: ...

    def __call__(self, t: Any, /) -> Any: ...

def pickle_scan(data: bytes, roles: dict[bytes, int], /) -> tuple[bool, list[str]]:
    """(fast, keys): whether nvio.load may unpickle data (a checkpoint's
    data.pkl) with the C unpickler under torch's weights-only rules, and the
    storage keys its persistent ids name. roles: {b"module\\nname": role}
    of the globals the fast path knows (1 OrderedDict, 2 a tensor rebuild,
    3 a storage type)."""

# --- errors (errors.c) ----------------------------------------------------

class NvioError(OSError):
    """An nvio operation failed.

    errno, strerror and filename are set as on any OSError. The attributes
    below are set on failures of I/O calls (Handle methods, file_size); an
    error of a call that is no I/O (LockedBuffer, probe, configuration)
    lacks them.
    """

    op: str
    offset: int
    nbytes: int
    op_seq: int
    is_write: bool
    fd: int | None

class NvioFileNotFoundError(NvioError, FileNotFoundError): ...
class NvioFileExistsError(NvioError, FileExistsError): ...

class NvioPermissionError(NvioError, PermissionError):
    """Raised for EACCES and EPERM."""

class NvioIsADirectoryError(NvioError, IsADirectoryError): ...
class NvioNotADirectoryError(NvioError, NotADirectoryError): ...
class NvioInterruptedError(NvioError, InterruptedError): ...
class NvioTimeoutError(NvioError, TimeoutError): ...
class NvioBlockingIOError(NvioError, BlockingIOError): ...

def strerror(err: int, /) -> str:
    """nvio's description of an errno value (its sign is ignored)."""

# --- locked memory (locked.c) ---------------------------------------------

MEM_LOCKED: Final[int]
MEM_NVIO: Final[int]

@final
class LockedBuffer:
    """Page-aligned, zeroed host memory from nvio_mem_alloc, locked in RAM
    when RLIMIT_MEMLOCK allows. Freed exactly once, with its last reference."""

    def __new__(cls, nbytes: int, require_locked: bool = False) -> Self: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def locked(self) -> bool: ...
    @property
    def address(self) -> int: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

def mem_query(address: int, nbytes: int, /) -> int:
    """MEM_* flags of a memory range."""

# --- handle and configuration (handle.c) ----------------------------------

_EngineName: TypeAlias = Literal["auto", "io_uring", "libaio", "psync"]
_DirectName: TypeAlias = Literal["auto", "on", "off"]

class _Config(TypedDict):
    block_size: int
    queue_depth: int
    single_submit: bool
    overlap_events: bool
    intra_op_parallelism: int
    engine: str
    direct: str
    staging_bytes: int

class Handle:
    """An nvio I/O handle (DeepNVMe aio_handle compatible).

    engine: a name, an engine number or None (auto); direct: True/False,
    'auto'/'on'/'off' or None (auto).
    """

    def __new__(
        cls,
        block_size: int = 1048576,
        queue_depth: int = 128,
        single_submit: bool = False,
        overlap_events: bool = False,
        intra_op_parallelism: int = 1,
        *,
        engine: _EngineName | str | int | None = "auto",
        direct: bool | _DirectName | str | None = "auto",
        staging_bytes: int = 0,
        gds: bool = False,
    ) -> Self: ...
    # pread/pwrite also take the keyword `async` (DeepSpeed's name for
    # async_op), which no Python signature can spell: pass it as
    # **{"async": True}.
    def pread(
        self,
        buffer: _BufferLike,
        filename: _Target | None = None,
        validate: bool = False,
        async_op: bool = False,
        file_offset: int = 0,
        *,
        fd: int | None = None,
    ) -> Literal[0, 1]: ...
    def pwrite(
        self,
        buffer: _BufferLike,
        filename: _Target | None = None,
        validate: bool = False,
        async_op: bool = False,
        file_offset: int = 0,
        *,
        fd: int | None = None,
        fsync: bool = False,
    ) -> Literal[0, 1]: ...
    def sync_pread(
        self,
        buffer: _BufferLike,
        filename: _Target | None = None,
        file_offset: int = 0,
        *,
        fd: int | None = None,
        validate: bool = False,
    ) -> Literal[1]: ...
    def sync_pwrite(
        self,
        buffer: _BufferLike,
        filename: _Target | None = None,
        file_offset: int = 0,
        *,
        fd: int | None = None,
        validate: bool = False,
        fsync: bool = False,
    ) -> Literal[1]: ...
    def async_pread(
        self,
        buffer: _BufferLike,
        filename: _Target | None = None,
        file_offset: int = 0,
        *,
        fd: int | None = None,
        validate: bool = False,
    ) -> Literal[0]: ...
    def async_pwrite(
        self,
        buffer: _BufferLike,
        filename: _Target | None = None,
        file_offset: int = 0,
        *,
        fd: int | None = None,
        validate: bool = False,
        fsync: bool = False,
    ) -> Literal[0]: ...
    def read(
        self,
        buffer: _BufferLike,
        filename: StrOrBytesPath,
        validate: bool = False,
        file_offset: int = 0,
        *,
        allow_short: bool = False,
    ) -> int: ...
    def write(
        self,
        buffer: _BufferLike,
        filename: StrOrBytesPath,
        validate: bool = False,
        file_offset: int = 0,
        *,
        fsync: bool = False,
    ) -> Literal[0]: ...
    def wait(self) -> int: ...
    def pending(self) -> int: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> Literal[False]: ...
    @property
    def closed(self) -> bool: ...
    def uses_gds(self) -> bool: ...
    def get_block_size(self) -> int: ...
    def get_queue_depth(self) -> int: ...
    def get_single_submit(self) -> bool: ...
    def get_overlap_events(self) -> bool: ...
    def get_intra_op_parallelism(self) -> int: ...
    def get_alignment(self) -> int: ...
    def get_engine(self) -> str: ...
    def get_direct(self) -> str: ...
    def get_engine_note(self) -> str: ...
    def get_config(self) -> _Config: ...
    def save_tuned(self, dir: StrOrBytesPath, for_write: bool = False) -> None: ...
    # --- libnvio 0.2 and 0.3 (file.c, tagged.c) ---
    def open(self, path: StrOrBytesPath, flags: int = ...) -> File:
        """Open path once for any number of ops (FILE_* flags; default FILE_READ)."""
    def open_fd(self, fd: int, flags: int = ...) -> File:
        """A File over an open descriptor, never closed or changed by nvio."""
    def submit(self, ops: Iterable[_Op], /, pending: set[Any] | None = None) -> int:
        """Submit tagged ops; how many, from the first, were accepted.

        A refused first op raises NvioError; resubmit the rest to see a
        later one's. Buffers and files stay borrowed until reap() returns
        the op. wait() never sees tagged ops. pending: a set that gets the
        user_data of every accepted op, and of no refused one, before any
        can complete (no Python code runs in between).
        """
    def reap(
        self, max: int = 64, min: int = 0, timeout: float | None = None
    ) -> list[tuple[Any, int | NvioError]]:
        """(user_data, bytes moved or the op's NvioError) of ended ops.

        Waits without the GIL until min (capped at inflight) ended or
        timeout seconds passed (None: no limit; 0: poll).
        """
    def completion_fd(self) -> int:
        """An eventfd readable while completions wait to be reaped."""
    @property
    def inflight(self) -> int:
        """Tagged ops accepted and not yet reaped (this handle's default
        queue: not a Queue's, not the blocking calls')."""
    def queue(self) -> Queue:
        """A completion queue of its own (one consumer): its ops complete
        on it only, never in this handle's reap(), and the handle's never
        on it. Closed with the handle."""

class Queue:
    """A completion queue of a Handle (Handle.queue(); nvio_queue_create)."""

    def submit(self, ops: Iterable[_Op], /, pending: set[Any] | None = None) -> int:
        """Handle.submit on this queue."""
    def reap(
        self, max: int = 64, min: int = 0, timeout: float | None = None
    ) -> list[tuple[Any, int | NvioError]]:
        """Handle.reap on this queue."""
    def completion_fd(self) -> int:
        """An eventfd readable while this queue's completions wait."""
    def close(self) -> None:
        """Wait for the queue's ops, drop what was not reaped, free it."""
    @property
    def inflight(self) -> int:
        """Ops accepted and not yet reaped."""
    @property
    def closed(self) -> bool: ...

# --- open files, tagged ops, streams (file.c, tagged.c, stream.c) ---------

FILE_READ: Final[int]
FILE_WRITE: Final[int]
FILE_CREATE: Final[int]
FILE_EXCL: Final[int]
FILE_TRUNC: Final[int]
FILE_ATOMIC: Final[int]
FILE_NOSYNC: Final[int]  # with FILE_ATOMIC: commit without fsync
FILE_SPARE: Final[int]  # with FILE_ATOMIC: overwrite the previous version's blocks (a spare)
FILE_SHARED: Final[int]  # with FILE_ATOMIC: a named temporary other processes join (shared.c)
STREAM_RANGES: Final[int]
OP_READ: Final[int]
OP_WRITE: Final[int]
VALIDATE: Final[int]
FSYNC: Final[int]
OFFSET_PER_IOV: Final[int]  # -1: each piece of a vector has its own offset
MAX_IOV: Final[int]

# A vector: buffers laid end to end from the op's offset, or with offset
# OFFSET_PER_IOV (buffer, offset) pairs in increasing order.
_Vector: TypeAlias = Sequence[_BufferLike] | Sequence[tuple[_BufferLike, int]]

# A tagged op: (opcode, file, buf or vector, offset[, user_data[, flags[, crc32]]]);
# crc32: None, or a writable buffer of one uint32 per buffer (array("I")) that
# gets the CRC-32 of each buffer's bytes once the op has completed.
_Op: TypeAlias = (
    tuple[int, File, _BufferLike | _Vector, int]
    | tuple[int, File, _BufferLike | _Vector, int, Any]
    | tuple[int, File, _BufferLike | _Vector, int, Any, int]
    | tuple[int, File, _BufferLike | _Vector, int, Any, int, _BufferLike | None]
)

class _FileInfo(TypedDict):
    flags: int
    fd: int
    direct: bool
    dio_offset_align: int
    dio_mem_align: int
    size: int
    committed: bool
    path: str

class File:
    """An open file of a Handle (Handle.open / Handle.open_fd).

    Sync methods return the bytes moved; failures raise NvioError. As a
    context manager: on success an ATOMIC file not yet committed is
    committed, then closed; on an exception it is closed only (abandoned).
    """

    def pread(self, buf: _BufferLike, offset: int, flags: int = 0) -> int: ...
    def pwrite(self, buf: _BufferLike, offset: int, flags: int = 0) -> int: ...
    def preadv(self, bufs: _Vector, offset: int, flags: int = 0) -> int: ...
    def pwritev(self, bufs: _Vector, offset: int, flags: int = 0) -> int: ...
    def truncate(self, size: int, /) -> None: ...
    def allocate(self, offset: int, nbytes: int, /) -> None: ...
    def sync(self) -> None: ...
    def commit(self) -> None: ...
    def close(self) -> None: ...
    def info(self) -> _FileInfo: ...
    def stream(
        self, mode: Literal["r", "w", "rb", "wb"], offset: int = 0,
        buffer_bytes: int = 0, depth: int = 0,
    ) -> Stream: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> Literal[False]: ...
    @property
    def path(self) -> str: ...
    @property
    def fd(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def direct(self) -> bool: ...
    @property
    def committed(self) -> bool: ...
    @property
    def temp_path(self) -> str | None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def flags(self) -> int: ...
    @property
    def handle(self) -> Handle: ...

@final
class Stream:
    """A writer ('w') or read-ahead reader ('r') over a File (File.stream)."""

    def write(self, buf: _BufferLike, /) -> int: ...
    def readinto(self, buf: _BufferLike, /) -> int: ...
    def read(self, n: int = -1, /) -> bytes: ...
    def seek(self, offset: int, /) -> int: ...
    def tell(self) -> int: ...
    def flush(self) -> None: ...
    def close(self, fsync: bool = False, commit: bool = False) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *args: object) -> Literal[False]: ...
    @property
    def closed(self) -> bool: ...
    @property
    def mode(self) -> Literal["r", "w"]: ...
    @property
    def file(self) -> File: ...

def file_share(file: File, /) -> tuple[str, int, int]:
    """(temp_path, dev, ino) of a File opened with FILE_ATOMIC | FILE_SHARED."""
def file_join(handle: Handle, temp_path: StrOrBytesPath, dev: int, ino: int,
              flags: int = ...) -> File:
    """Open the creator's shared temporary, refusing anything else (nvio_file_join)."""

class StagedStream:
    """A writer stream whose buffers are the caller's memory (nvio_stream_open_config)."""

    def __init__(self, file: File, memory: _BufferLike, offset: int = 0, depth: int = 2,
                 ranges: bool = False) -> None: ...
    def write(self, buf: _BufferLike, /) -> int: ...
    def seek(self, offset: int, /) -> int: ...
    def tell(self) -> int: ...
    def flush(self) -> None: ...
    def close(self, fsync: bool = False, commit: bool = False) -> None: ...
    @property
    def closed(self) -> bool: ...

def engine_available(engine: _EngineName | str | int | None, /) -> tuple[bool, str]:
    """(available, why)."""

def check_flag(value: object, name: str, /) -> bool: ...
def load_tuned(dir: StrOrBytesPath, for_write: bool = False) -> _Config | None:
    """The tuned configuration saved for dir, or None."""

# --- the machine (module.c) -----------------------------------------------

class _Probe(TypedDict):
    direct_ok: bool
    direct_err: int
    dio_mem_align: int
    dio_offset_align: int
    fs_block_size: int
    fs_type: str
    device: str
    fs_free_bytes: int
    memlock_cur: int
    memlock_max: int
    can_lock_unlimited: bool
    engines: dict[str, tuple[bool, str]]
    cuda_found: bool
    cuda_device_count: int
    cuda_driver_version: int
    cuda_why: str
    cufile_found: bool
    cufile_mode: int
    cufile_why: str

def cufile_set_library(path: StrOrBytesPath | None, /) -> None: ...
def staging_set_limit(nbytes: int, /) -> None: ...
def staging_limit() -> tuple[int, int]: ...
def probe(dir: StrOrBytesPath | None = None, /) -> _Probe:
    """What this machine (and dir) support."""

def file_size(path: StrOrBytesPath, /) -> int: ...
def clean_temporaries(
    dir: StrOrBytesPath, target: StrOrBytesPath | None = None, *, dry_run: bool = False,
    any_user: bool = False, spares: bool | Literal["all"] = False,
) -> tuple[int, list[tuple[str, int, str]]]:
    """Remove dir's temporaries of atomic writes whose writer is dead (and spares)."""
def temp_name(path: StrOrBytesPath, /) -> str:
    """A fresh name for a temporary of path that carries this process as owner."""
def gds_mode() -> tuple[Literal["direct", "compat", "none"], str]: ...
def gds_register(address: int, nbytes: int, /) -> None: ...
def gds_deregister(address: int, /) -> None: ...

VERSION_NUM: Final[int]
HEADER_VERSION_NUM: Final[int]
version_string: Final[str]
