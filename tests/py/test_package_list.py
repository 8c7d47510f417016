"""Every Python package in the source tree ships in the wheel: a package
missing from pyproject.toml's list works in place and is absent after
`pip install .` (nvio.data was, once)."""
import os
import re

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")


def _listed():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    block = re.search(r"^packages\s*=\s*\[(.*?)\]", text, re.S | re.M).group(1)
    return set(re.findall(r'"([^"]+)"', block))


def _in_tree():
    base = os.path.join(ROOT, "python")
    found = set()
    for d, dirs, files in os.walk(os.path.join(base, "nvio")):
        # private packages too (nvio._base ships); _ext holds C sources, no __init__.py
        dirs[:] = [x for x in dirs if not x.startswith(".") and x != "__pycache__"]
        if "__init__.py" in files:
            found.add(os.path.relpath(d, base).replace(os.sep, "."))
    return found


def test_every_package_in_the_tree_is_in_the_wheel():
    missing = _in_tree() - _listed()
    assert not missing, "pyproject.toml's packages lacks %s" % sorted(missing)


def test_every_listed_package_exists():
    assert _listed() - _in_tree() == set()
