"""DeepSpeed's ZeRO-Infinity, FastPersist and ds_io on nvio.

One call switches DeepSpeed's ``async_io`` op to :class:`nvio.compat.AsyncIOBuilder`::

    import deepspeed
    from nvio.integrations import deepspeed as nvio_deepspeed

    nvio_deepspeed.use_nvio()        # before deepspeed.initialize(...)
    engine, *_ = deepspeed.initialize(model=model, config=config)
    ...
    nvio_deepspeed.undo()            # DeepSpeed's own op again

or ``with nvio_deepspeed.use_nvio(): ...``. After it, ZeRO-3's NVMe offload of
parameters and optimizer state (the ``swap_tensor`` swappers), the FastPersist
checkpoint writers (``model_checkpointing.writer_factory``), ``deepspeed.ops.aio``
and ds_io get nvio's handles, and DeepSpeed never JIT-builds its own async_io
op. Handles created before the switch keep the op they were made with.

What it changes, all undone by :func:`undo`: the ``AsyncIOBuilder`` name in
``deepspeed.ops.op_builder``, in ``deepspeed.ops.aio`` and in every imported
``deepspeed.*`` module that imported DeepSpeed's builder; and the accelerator's
``get_op_builder("AsyncIOBuilder")`` (so DeepSpeed's op registry lists nvio's
builder). The modules that define DeepSpeed's builders are left alone.
Nothing is changed by ``import nvio`` or by importing this module.

ds_io, unchanged, on nvio (its worker processes are spawned and switch too)::

    python -m nvio.integrations.deepspeed ds_io --read --io_size 1G ...

and any script: ``python -m nvio.integrations.deepspeed train.py ARGS``
(the switch is made in the launching process only; spawned workers that use
DeepSpeed's aio must call :func:`use_nvio` themselves).
"""
from __future__ import annotations

import os
import sys

from ..compat import AsyncIOBuilder

__all__ = ["use_nvio", "undo", "is_active", "AsyncIOBuilder"]

ENV = "NVIO_DEEPSPEED"
_NAME = "AsyncIOBuilder"


class _Switch:
    """The active switch: what was replaced, to put back. A context manager."""

    def __init__(self):
        self._saved = []            # (object, attribute, had_own, old value)
        self.original = None        # DeepSpeed's builder the modules had

    def _set(self, obj, attr, value):
        had = attr in vars(obj)
        self._saved.append((obj, attr, had, vars(obj).get(attr)))
        setattr(obj, attr, value)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        undo()


_active = None


def _deepspeed_modules():
    return [m for k, m in list(sys.modules.items())
            if m is not None and (k == "deepspeed" or k.startswith("deepspeed."))]


def _is_definition(mod, value):
    """True where mod defines (or, as a per-accelerator op_builder package,
    re-exports) a builder: those stay DeepSpeed's."""
    name = getattr(mod, "__name__", "")
    return (getattr(value, "__module__", None) == name
            or name.startswith("deepspeed.ops.op_builder."))


def use_nvio():
    """Switch DeepSpeed's async_io op to nvio's; returns the switch (a
    context manager whose exit undoes it). Calling it again while switched
    returns the same switch. Raises ImportError where DeepSpeed is missing."""
    global _active
    if _active is not None:
        return _active
    import deepspeed.ops.aio  # noqa: F401  (imports deepspeed.ops.op_builder)
    import deepspeed.ops.op_builder as op_builder
    from deepspeed.accelerator import get_accelerator

    sw = _Switch()
    sw.original = getattr(op_builder, _NAME)
    try:
        for mod in _deepspeed_modules():
            value = vars(mod).get(_NAME)
            if value is None or value is AsyncIOBuilder or _is_definition(mod, value):
                continue
            sw._set(mod, _NAME, AsyncIOBuilder)
        accel = get_accelerator()
        own = accel.get_op_builder

        def get_op_builder(class_name):
            if class_name == _NAME:
                return AsyncIOBuilder
            return own(class_name)

        sw._set(accel, "get_op_builder", get_op_builder)
    except BaseException:
        _restore(sw)
        raise
    _active = sw
    return sw


def _restore(sw):
    for obj, attr, had, old in reversed(sw._saved):
        if had:
            setattr(obj, attr, old)
        else:
            delattr(obj, attr)
    sw._saved.clear()
    # modules first imported while switched took nvio's builder by name
    if sw.original is not None:
        for mod in _deepspeed_modules():
            if vars(mod).get(_NAME) is AsyncIOBuilder:
                setattr(mod, _NAME, sw.original)


def undo():
    """Put DeepSpeed's own async_io op back; a no-op when not switched.
    Handles made while switched stay nvio's until they are dropped."""
    global _active
    sw, _active = _active, None
    if sw is not None:
        _restore(sw)


def is_active():
    """True while :func:`use_nvio` is in effect."""
    return _active is not None


def _python_script(name):
    """(path, source) of the Python script ``name``: first in this
    interpreter's scripts folders (a venv's, then its base's), then on PATH,
    passing over what is not a Python script (pyenv's shell shims)."""
    import shutil
    import sysconfig
    dirs = [sysconfig.get_path("scripts"), os.path.dirname(sys.executable),
            os.path.join(sys.base_prefix, "bin")]
    dirs += os.environ.get("PATH", "").split(os.pathsep)
    seen = set()
    for d in dirs:
        if not d or d in seen:
            continue
        seen.add(d)
        path = shutil.which(name, path=d)
        if path is None:
            continue
        with open(path, "rb") as f:
            source = f.read()
        if source.startswith(b"#!") and b"python" in source.split(b"\n", 1)[0]:
            return path, source
    return None, None


def _command(name):
    """A console script's function (an entry point), or a Python script on
    PATH (DeepSpeed's ds_io, ds_report... are such scripts) as a function."""
    from importlib.metadata import entry_points
    for ep in entry_points(group="console_scripts"):
        if ep.name == name:
            return ep.load()
    path, source = _python_script(name)
    if path is None:
        return None
    code = compile(source, path, "exec")

    def run():
        # run with this module still sys.modules["__main__"], so that the
        # workers it spawns import it (and switch) before DeepSpeed's code
        exec(code, {"__name__": "__main__", "__file__": path, "__builtins__": __builtins__})
    return run


def main(argv=None):
    """``python -m nvio.integrations.deepspeed (COMMAND | SCRIPT.py) ARGS...``:
    run a command of DeepSpeed's (ds_io, ds_report...) or a Python script
    with DeepSpeed switched to nvio."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(main.__doc__.strip())
        return 0 if argv else 2
    os.environ[ENV] = "1"           # for the workers ds_io spawns
    use_nvio()
    target, sys.argv = argv[0], argv
    if target.endswith(".py"):
        import runpy
        runpy.run_path(target, run_name="__main__")
        return 0
    fn = _command(target)
    if fn is None:
        print(f"nvio.integrations.deepspeed: {target!r} is neither a .py script nor a "
              "Python command on PATH", file=sys.stderr)
        return 2
    try:
        rc = fn()
    except SystemExit as e:
        rc = e.code
    return rc if isinstance(rc, int) else (0 if rc is None else 1)


if __name__ in ("__main__", "__mp_main__"):
    # run as a script: act on the importable module, whose state undo() sees
    import nvio.integrations.deepspeed as _module
    if __name__ == "__main__":
        sys.exit(_module.main())
    if os.environ.get(ENV) == "1":
        _module.use_nvio()      # a worker spawned by main(): switch as its parent did
