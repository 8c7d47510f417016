"""Types of nvio._nvio, the C extension (python/nvio/_ext/).

Use the nvio package instead; this stub lets type checkers see what the
extension exports. Where a C function accepts any object and tests its
truth (the "p" format), the stub says bool.
"""
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
    ) -> Literal[0]: ...
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

def engine_available(engine: _EngineName | str | int | None, /) -> tuple[bool, str]:
    """(available, why)."""

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

def probe(dir: StrOrBytesPath | None = None, /) -> _Probe:
    """What this machine (and dir) support."""

def file_size(path: StrOrBytesPath, /) -> int: ...
def gds_mode() -> tuple[Literal["direct", "compat", "none"], str]: ...
def gds_register(address: int, nbytes: int, /) -> None: ...
def gds_deregister(address: int, /) -> None: ...

VERSION_NUM: Final[int]
HEADER_VERSION_NUM: Final[int]
version_string: Final[str]
