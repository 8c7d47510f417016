"""The ``nvio`` command that ``pip install nvio`` puts on PATH.

It runs the C tool shipped inside the package (``nvio/_bin/nvio``: the same
program as ``make``'s ``build/nvio``, so ``nvio report``, ``bench`` and
``tune`` behave alike however nvio was installed). One command is handled
here instead, because the tool has no manual pages of its own to find:

    nvio man [SECTION] [PAGE]     nvio(1) by default; e.g. nvio man 3 nvio_pwrite
    nvio man --path               the directory to add to MANPATH

and ``nvio checkpoint info|verify PATH`` (= ``python -m nvio.checkpoint``),
which is Python (it reads torch's pickles), not part of the C tool.
"""
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def tool_path():
    """Path of the packaged C tool."""
    return os.path.join(HERE, "_bin", "nvio")


def man_path():
    """The packaged manual pages (man1, man3, man7), or None."""
    d = os.path.join(HERE, "_man")
    return d if os.path.isdir(os.path.join(d, "man1")) else None


def _man(args):
    d = man_path()
    if d is None:
        print("nvio man: this installation has no manual pages (an in-place "
              "build?); see man/ in the source tree", file=sys.stderr)
        return 1
    if args == ["--path"]:
        print(d)
        return 0
    man = shutil.which("man")
    if man is None:
        print("nvio man: no man command; the pages are in %s" % d, file=sys.stderr)
        return 1
    # Only nvio's pages: "nvio man nvio" is nvio(1), not a system page.
    env = dict(os.environ, MANPATH=d)
    return subprocess.call([man] + (args or ["nvio"]), env=env)


def main(argv=None):
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] == ["man"]:
        return _man(args[1:])
    if args[:1] == ["checkpoint"]:
        from .checkpoint import cli   # torch only for this subcommand
        return cli(args[1:], prog="nvio checkpoint")
    exe = tool_path()
    if not os.access(exe, os.X_OK):
        print("nvio: the packaged tool %s is missing or not executable; "
              "reinstall nvio" % exe, file=sys.stderr)
        return 1
    os.execv(exe, ["nvio"] + args)


if __name__ == "__main__":
    sys.exit(main())
