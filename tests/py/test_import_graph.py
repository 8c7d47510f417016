"""nvio's Python import graph, read from the source with ast (nothing is imported).

The layers (README, Layout):
- core: nvio (the package's __init__), nvio.handles, nvio.io, nvio._nvio,
  nvio._futures, nvio._device, nvio._regular, nvio._atomic (and what else
  is neither base nor application: _cli, _renamed, _ext);
- base: nvio._base (the tensor-I/O base: handle, views, pieces, space, crc,
  group, plan, torchzip, stformat);
- applications: checkpoint, dcp, safetensors, offload, data, integrations,
  compat (with _filewriters, the DeepSpeed writers nvio.compat publishes).

Rules, each checked over every import statement of every module, at module
level and inside functions alike (except rule b):
  a. an application imports no private module (or private name) of another
     application: a private module has a component starting with "_" below
     the application's own name (nvio.checkpoint._save), a private name
     starts with "_" (from nvio.checkpoint import _save);
  b. no import cycle among nvio's modules, counting module-level imports
     (those that run when the module is imported);
  c. nvio._base imports no application;
  d. integrations import nothing of nvio but applications' public names
     (no core module, no base module, nothing private);
  e. an import of an nvio module inside a function, in an application or the
     base, says why it is there (a comment on its line or the line above):
     such imports hid checkpoint's cycle, so each must be a choice;
  f. the core (nvio's lazy save/load, the nvio command's _cli) uses
     applications only by their public names, like integrations.
"""
import ast
import os
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "..", "..", "python", "nvio")

#: application -> the top-level names under nvio that belong to it
APPS = {"checkpoint": ("checkpoint",), "dcp": ("dcp",), "safetensors": ("safetensors",),
        "offload": ("offload",), "data": ("data",), "integrations": ("integrations",),
        "compat": ("compat", "_filewriters")}
BASE = "_base"


def modules(root, pkg="nvio"):
    """{module name: file path} of every .py file under root (the package
    directory of ``pkg``); extension modules map to None."""
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "__pycache__")
        rel = os.path.relpath(d, root)
        parts = [pkg] + ([] if rel == "." else rel.split(os.sep))
        for f in sorted(files):
            if f.endswith(".py"):
                name = parts if f == "__init__.py" else parts + [f[:-3]]
                out[".".join(name)] = os.path.join(d, f)
            elif f.endswith((".so", ".pyd", ".pyi")):
                # an extension module (nvio._nvio): no imports. Its stub
                # (.pyi) names it too, so that a tree whose extension was
                # built elsewhere (pip install . puts it in site-packages)
                # does not read "from . import _nvio" as an import of nvio
                # itself, a cycle that is not there
                out.setdefault(".".join(parts + [f.split(".")[0]]), None)
    return out


def _imports(tree):
    """(node, module level?) for every import statement: module level means
    not inside a function (class bodies, if/try at the top run on import)."""
    out = []

    def walk(node, top):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, top))
            inner = top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                   ast.Lambda))
            walk(child, inner)
    walk(tree, True)
    return out


def edges(mods, pkg="nvio"):
    """[(importer, imported module, imported name or None, module level?,
    line)]: imports of ``pkg``'s own modules, resolved (relative ones too);
    ``from X import Y`` is an import of X.Y where that is a module, else of
    X with the name Y."""
    out = []
    for name, path in mods.items():
        if path is None:
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        is_pkg = os.path.basename(path) == "__init__.py"
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        for node, top in _imports(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == pkg or a.name.startswith(pkg + "."):
                        out.append((name, a.name, None, top, node.lineno))
                continue
            if node.level:
                base = here[:len(here) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not (target == pkg or target.startswith(pkg + ".")):
                continue
            for a in node.names:
                sub = target + "." + a.name
                if sub in mods:
                    out.append((name, sub, None, top, node.lineno))
                else:
                    out.append((name, target, a.name, top, node.lineno))
    return out


def _app_of(module, pkg="nvio"):
    parts = module.split(".")
    if len(parts) < 2 or parts[0] != pkg:
        return None
    for app, tops in APPS.items():
        if parts[1] in tops:
            return app
    return None


def _private(module, name, pkg="nvio"):
    """Whether importing ``name`` (or None) from ``module`` reaches something
    private of its application: a component below the application's
    top-level name, or the name, starting with "_"."""
    parts = module.split(".")[2:]
    return any(p.startswith("_") for p in parts) or bool(name and name.startswith("_"))


def cycles(graph):
    """The import cycles of graph {module: set of modules} (each once, as a
    list starting at its smallest member), by Tarjan's strongly connected
    components: a component of more than one module, or a module importing
    itself."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                out.append(sorted(comp))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def violations(root, pkg="nvio"):
    """Every broken rule (a-f above) in the package at root, as strings
    naming the rule, the modules and the line."""
    mods = modules(root, pkg)
    found = []
    graph = {}
    lines = {}
    for src, dst, name, top, line in edges(mods, pkg):
        what = dst + ("." + name if name else "")
        where = "%s:%d" % (src, line)
        a, b = _app_of(src, pkg), _app_of(dst, pkg)
        if a and b and a != b and _private(dst, name, pkg):
            found.append("a: %s (application %s) imports %s, private to %s" % (where, a, what, b))
        in_base = src.split(".")[1:2] == [BASE]
        if in_base and b:
            found.append("c: %s (the base) imports %s of application %s" % (where, what, b))
        if a == "integrations" and b != "integrations" and (b is None or _private(dst, name, pkg)):
            found.append("d: %s (integrations) imports %s: not an application's public name"
                         % (where, what))
        if not a and not in_base and b and _private(dst, name, pkg):
            found.append("f: %s (the core) imports %s, private to %s" % (where, what, b))
        if not top and (a or in_base):
            if src not in lines:
                with open(mods[src], encoding="utf-8") as f:
                    lines[src] = f.read().split("\n")
            text = lines[src]
            if "#" not in text[line - 1] and (line < 2 or "#" not in text[line - 2]):
                found.append("e: %s imports %s inside a function without a comment saying why"
                             % (where, what))
        if top and dst in mods and dst != src:
            graph.setdefault(src, set()).add(dst)
    for c in cycles(graph):
        found.append("b: import cycle among %s" % ", ".join(c))
    return found


def test_nvio_import_graph_keeps_the_layers():
    assert os.path.isfile(os.path.join(PACKAGE, "_base", "__init__.py"))
    assert violations(PACKAGE) == []


def _tree(root, files):
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


#: a package that keeps every rule
CLEAN = {
    "nvio/__init__.py": "from . import _nvio\nfrom .handles import Handle\n",
    "nvio/_nvio.py": "",
    "nvio/handles.py": "from . import _nvio\nclass Handle: pass\n",
    "nvio/_base/__init__.py": "",
    "nvio/_base/crc.py": "from .. import _nvio\n",
    "nvio/checkpoint/__init__.py": "from ._save import save\n",
    "nvio/checkpoint/_save.py": "from .._base.crc import x\nfrom ..handles import Handle\n"
                                "def save(): pass\n",
    "nvio/dcp.py": "from ._base import crc\nfrom .checkpoint import save\n",
    "nvio/integrations/__init__.py": "",
    "nvio/integrations/lightning.py": "from ..checkpoint import save\nimport torch\n",
}


def test_checker_passes_a_clean_tree(tmp_path):
    _tree(tmp_path, CLEAN)
    assert violations(str(tmp_path / "nvio")) == []


@pytest.mark.parametrize("rule,files", [
    # a: dcp reaches into checkpoint's private module (at module level, in a
    # function, as a module or as a private name of a public one)
    ("a", {"nvio/dcp.py": "from .checkpoint._save import save\n"}),
    ("a", {"nvio/dcp.py": "def f():\n    from .checkpoint import _save  # lazy\n"}),
    ("a", {"nvio/dcp.py": "import nvio.checkpoint._save\n"}),
    ("a", {"nvio/offload/__init__.py": "def f():\n    # lazy\n    from ..checkpoint._save import save\n"}),
    # b: a cycle, through a relative and an absolute import
    ("b", {"nvio/checkpoint/_save.py": "from . import _dist\n",
           "nvio/checkpoint/_dist.py": "import nvio.checkpoint._save\n"}),
    # c: the base imports an application (even inside a function)
    ("c", {"nvio/_base/crc.py": "def f():\n    from ..checkpoint import save  # lazy\n"}),
    # e: a function-level import of nvio's own, unexplained
    ("e", {"nvio/dcp.py": "from ._base import crc\ndef f():\n    from .checkpoint import save\n"}),
    # d: integrations import the base, or the core
    ("d", {"nvio/integrations/lightning.py": "from .._base.crc import x\n"}),
    ("d", {"nvio/integrations/lightning.py": "from .. import _nvio\n"}),
    # f: the core reaches into an application's private module
    ("f", {"nvio/_cli.py": "def main():\n    from .checkpoint.__main__ import main\n"}),
])
def test_checker_fails_on_each_rule(tmp_path, rule, files):
    _tree(tmp_path, dict(CLEAN, **files))
    got = violations(str(tmp_path / "nvio"))
    assert got and all(v.startswith(rule + ":") for v in got), got


def test_function_level_imports_make_no_cycle(tmp_path):
    """Rule b counts what runs on import: an import inside a function is
    not an edge of the cycle check (rules a, c and d still see it)."""
    _tree(tmp_path, dict(CLEAN, **{
        "nvio/checkpoint/_save.py": "def f():\n    from . import _dist  # not at import time\n",
        "nvio/checkpoint/_dist.py": "from . import _save\n"}))
    assert violations(str(tmp_path / "nvio")) == []
