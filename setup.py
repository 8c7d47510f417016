"""Build of the nvio Python package.

The extension nvio._nvio compiles libnvio's sources (src/*.c) together with
the binding (python/nvio/_ext/*.c); it
includes no PyTorch, NumPy or CUDA header, so one abi3 wheel (limited API
3.11) serves every Python >= 3.11 and every torch.

The wheel also carries the nvio command (tools/*.c with src/*.c, as
nvio/_bin/nvio, run by the `nvio` console script) and the manual pages
(nvio/_man/man{1,3,7}, shown by `nvio man`). Everything the build reads
is listed in MANIFEST.in, so an sdist builds with any allowed setuptools.

liburing and libaio are used when their headers are found, linked from their
static archives when those link into a shared object (so the wheel needs no
runtime package), else dynamically. Environment knobs:
  NVIO_NO_URING=1 / NVIO_NO_AIO=1   build without that engine
  NVIO_STATIC_DEPS=0                link liburing/libaio dynamically
"""
import glob
import os
import re
import subprocess
import tempfile

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
LIMITED = 0x030B0000


def version():
    text = open(os.path.join(HERE, "include", "nvio.h")).read()
    parts = [re.search(r"#define NVIO_VERSION_%s (\d+)" % k, text).group(1)
             for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def _cc():
    import sysconfig
    return (os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc").split()


def _try(args, src):
    """True if the compiler accepts `src` with `args`."""
    with tempfile.TemporaryDirectory() as d:
        c = os.path.join(d, "t.c")
        with open(c, "w") as f:
            f.write(src)
        r = subprocess.run(_cc() + [c] + args + ["-o", os.path.join(d, "t.out")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return r.returncode == 0


def _static_archive(name):
    """Path of lib<name>.a if it can go into a shared object, else None."""
    try:
        out = subprocess.run(_cc() + ["-print-file-name=lib%s.a" % name],
                             capture_output=True, text=True).stdout.strip()
    except OSError:
        return None
    if not os.path.isabs(out) or not os.path.exists(out):
        return None
    return out


# Version nodes that static archives may bind symbols to (libaio uses
# .symver); listing them with "local: *" keeps them out of our exports.
_VERSION_NODES = ("LIBAIO_0.1", "LIBAIO_0.4")


def _version_script(path):
    """Export PyInit__nvio only (libnvio and static deps stay hidden)."""
    with open(path, "w") as f:
        for node in _VERSION_NODES:
            f.write("%s { local: *; };\n" % node)
        f.write("NVIO_PYTHON { global: PyInit__nvio; local: *; };\n")
    return path


def _dep(name, header, symbols, vscript):
    """Link kwargs for an optional engine library, or None."""
    probe = "#include <%s>\nvoid *nvio_probe_syms[] = { %s };\nint PyInit__nvio(void) { return 0; }\n" % (
        header, ", ".join("(void *)" + s for s in symbols))
    if not _try(["-fPIC", "-c"], probe):
        return None
    link = ["-fPIC", "-shared", "-Wl,--version-script=" + vscript]
    if os.environ.get("NVIO_STATIC_DEPS", "1") != "0":
        a = _static_archive(name)
        if a and _try(link + [a], probe):
            return {"extra_objects": [a]}
    if _try(link + ["-l" + name], probe):
        return {"libraries": [name]}
    return None


class BuildExt(build_ext):
    def initialize_options(self):
        super().initialize_options()
        self.parallel = os.cpu_count() or 1

    def build_extensions(self):
        deps = [("URING", "uring", "liburing.h",
                 ("io_uring_queue_init", "io_uring_queue_init_params", "io_uring_queue_exit",
                  "io_uring_submit", "io_uring_wait_cqe_timeout", "io_uring_get_probe",
                  "io_uring_register_buffers", "io_uring_register_files")),
                ("AIO", "aio", "libaio.h",
                 ("io_setup", "io_submit", "io_getevents", "io_destroy", "io_cancel"))]
        os.makedirs(self.build_temp, exist_ok=True)
        vscript = _version_script(os.path.join(self.build_temp, "nvio_python.map"))
        # The engines found, as (macro, extra_objects, libraries): the
        # extension and the tool link the same ones.
        engines = []
        for macro, lib, header, syms in deps:
            if os.environ.get("NVIO_NO_" + macro) == "1":
                continue
            got = _dep(lib, header, syms, vscript)
            if got is None:
                print("nvio: building without %s (no usable %s)" % (lib, header))
                continue
            engines.append(("NVIO_HAVE_" + macro, got.get("extra_objects", []),
                            got.get("libraries", [])))
            print("nvio: %s engine linked %s" % (lib, "statically" if
                  got.get("extra_objects") else "dynamically"))
        for ext in self.extensions:
            ext.extra_link_args = (ext.extra_link_args or []) + [
                "-Wl,--version-script=" + vscript]
            for macro, objects, libraries in engines:
                ext.define_macros.append((macro, "1"))
                ext.extra_objects = (ext.extra_objects or []) + objects
                ext.libraries = (ext.libraries or []) + libraries
            ext.libraries = (ext.libraries or []) + ["dl"]
        super().build_extensions()
        self.build_tool(engines)

    def tool_dir(self):
        if self.inplace:
            return os.path.join(self.get_finalized_command("build_py")
                                .get_package_dir("nvio"), "_bin")
        return os.path.join(self.build_lib, "nvio", "_bin")

    def build_tool(self, engines):
        """Links tools/*.c with libnvio's sources into nvio/_bin/nvio."""
        macros = [(m, "1") for m, _, _ in engines]
        objects = self.compiler.compile(
            LIB_SOURCES + TOOL_SOURCES, output_dir=os.path.join(self.build_temp, "tool"),
            macros=macros, include_dirs=["include"], extra_postargs=C_FLAGS)
        for _, extra, _ in engines:
            objects += extra
        libraries = [lib for _, _, libs in engines for lib in libs] + ["dl", "m"]
        self.mkpath(self.tool_dir())
        self.compiler.link_executable(objects, "nvio", output_dir=self.tool_dir(),
                                      libraries=libraries, extra_postargs=["-pthread"])

    def get_outputs(self):
        return super().get_outputs() + [os.path.join(self.tool_dir(), "nvio")]


class BuildPy(build_py):
    """Copies the manual pages into the package as nvio/_man/manN/."""

    def run(self):
        super().run()
        for page in MAN_PAGES:
            section = "man" + page.rsplit(".", 1)[1]
            dest = os.path.join(self.build_lib, "nvio", "_man", section,
                                os.path.basename(page))
            self.mkpath(os.path.dirname(dest))
            self.copy_file(page, dest)


LIB_SOURCES = sorted(glob.glob("src/*.c"))
# The binding, split by concern.
BINDING_SOURCES = sorted(glob.glob("python/nvio/_ext/*.c"))
TOOL_SOURCES = sorted(glob.glob("tools/*.c"))
MAN_PAGES = sorted(glob.glob("man/*.1") + glob.glob("man/man1/*.1") +
                   glob.glob("man/man3/*.3") + glob.glob("man/man7/*.7"))
C_FLAGS = ["-std=c11", "-D_GNU_SOURCE", "-pthread", "-fvisibility=hidden",
           "-O2", "-Wall", "-Wno-unused-parameter",
           # A call outside the limited API must not build into a
           # truncated pointer: gcc 12 only warns about an undeclared one.
           "-Werror=implicit-function-declaration", "-Werror=int-conversion"]

ext = Extension(
    "nvio._nvio",
    sources=LIB_SOURCES + BINDING_SOURCES,
    include_dirs=["include"],
    define_macros=[("Py_LIMITED_API", hex(LIMITED))],
    extra_compile_args=C_FLAGS,
    extra_link_args=["-pthread"],
    py_limited_api=True,
    # Any header change rebuilds everything (setuptools only tracks .c files).
    depends=sorted(glob.glob("include/*.h") + glob.glob("src/*.h") +
                   glob.glob("python/nvio/_ext/*.h")),
)

setup(
    version=version(),
    ext_modules=[ext],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
    options={"bdist_wheel": {"py_limited_api": "cp311"},
             # Apart from the Makefile's build/.
             "build": {"build_base": "python/build"}},
)
