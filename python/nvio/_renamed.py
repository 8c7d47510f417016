"""Old public names kept as deprecated aliases (issue 31: one meaning per name).

A module that renamed a public name sets ``__getattr__ = renamed(__name__,
{"old": "new"}, globals())``: ``module.old`` and ``from module import old``
give the very object ``module.new`` names, with one DeprecationWarning per
old name and process, pointing at the caller's line. Old names are left out
of ``__all__`` and ``dir()``, so ``import *`` and tab completion offer only
the new ones. Imports nothing from nvio (any layer may use it).
"""
from __future__ import annotations

import warnings

_warned = set()    # (module, old name) pairs warned about in this process


def renamed(module, names, namespace, other=None):
    """A module ``__getattr__`` that serves ``names`` (old -> new, the new
    one a key of ``namespace``, or "other.module:attr" for a name that moved
    to another module), passes any other name to ``other`` (the module's own
    ``__getattr__``, if it had one) or raises AttributeError."""

    def __getattr__(name):
        new = names.get(name)
        if new is None:
            if other is not None:
                return other(name)
            raise AttributeError("module %r has no attribute %r" % (module, name))
        if (module, name) not in _warned:
            _warned.add((module, name))
            warnings.warn("%s.%s is deprecated (nvio 0.3): use %s" % (module, name, _spelled(module, new)),
                          DeprecationWarning, stacklevel=2)
        return _resolve(new, namespace)

    return __getattr__


def _spelled(module, new):
    return new.replace(":", ".") if ":" in new else "%s.%s" % (module, new)


def _resolve(new, namespace):
    if ":" not in new:
        return namespace[new]
    import importlib
    mod, attr = new.split(":")
    return getattr(importlib.import_module(mod), attr)
