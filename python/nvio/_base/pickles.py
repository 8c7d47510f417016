"""The one Python pickle allowlist: a pickle's opcodes checked before it is unpickled.

nvio checks untrusted pickles in two places, on purpose with two tools:

- ``_nvio.pickle_scan`` (C, python/nvio/_ext/pickling.c) decides whether a
  checkpoint's data.pkl may take nvio.load's FAST path (CPython's C
  unpickler). It is not the gate: a pickle it does not admit goes to
  torch's weights-only unpickler, which refuses or loads it. Its rules are
  those of torch.save's tensors and state dicts (no NEWOBJ; BUILD only of a
  dict on an OrderedDict; globals only as tensor rebuilders or storage types).
- :func:`check_pickle` (here) is a GATE: what it refuses is never
  unpickled. nvio.dcp runs it on a DCP ``.metadata`` file, whose pickle is
  made of dataclasses (NEWOBJ, BUILD of their state, REDUCE of
  ``_MEM_FORMAT_ENCODING``, PosixPath): rules pickle_scan refuses by design,
  so DCP cannot use it; the caller's find_class then admits only its own
  list of globals (dcp.py's _SAFE_GLOBALS).

A new reader of untrusted pickles uses one of these two, not a third.
"""
from __future__ import annotations

import pickletools

from .plan import CheckpointError

#: The pickle opcodes DCP's metadata files use, and their relatives of other
#: protocols that build only plain values. Not here: EXT1/2/4 (served from copyreg's
#: cache without a global lookup), PERSID/BINPERSID, INST/OBJ, sets
#: (ADDITEMS calls an object's add), DUP, out-of-band buffers.
SAFE_OPS = frozenset("""
    PROTO FRAME STOP MARK POP POP_MARK NONE NEWTRUE NEWFALSE INT BININT BININT1 BININT2
    LONG LONG1 LONG4 FLOAT BINFLOAT STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE
    SHORT_BINUNICODE BINUNICODE8 BINBYTES SHORT_BINBYTES BINBYTES8 EMPTY_TUPLE TUPLE TUPLE1
    TUPLE2 TUPLE3 EMPTY_LIST LIST APPEND APPENDS EMPTY_DICT DICT SETITEM SETITEMS GET BINGET
    LONG_BINGET PUT BINPUT LONG_BINPUT MEMOIZE GLOBAL STACK_GLOBAL REDUCE NEWOBJ NEWOBJ_EX
    BUILD""".split())
_PUTS = frozenset(("PUT", "BINPUT", "LONG_BINPUT"))
_GETS = frozenset(("GET", "BINGET", "LONG_BINGET"))


#: Opcodes that act on an object below their arguments, and how deep it lies:
#: it must be a value the pickle built, never a global (a class or function
#: of the allowlist): BUILD with slot state on a class runs setattr on it,
#: changing that class for the whole process, as torch's weights_only
#: unpickler never allows. REDUCE and NEWOBJ must call a global.
#: (SETITEMS and APPENDS: counted once their marked items are popped.)
_ON_VALUE = {"BUILD": 2, "SETITEM": 3, "APPEND": 2, "SETITEMS": 1, "APPENDS": 1}
_ON_GLOBAL = {"REDUCE": 2, "NEWOBJ": 2, "NEWOBJ_EX": 3}
_MARK = object()


def check_pickle(data, where, refuse, app, needs, hint, ops=SAFE_OPS):
    """Refuse a pickle that uses an opcode outside ``ops``, a memo index
    the pickle has not reached (the C unpickler allocates up to the index),
    or BUILD/SETITEM(S)/APPEND(S) on a global or REDUCE/NEWOBJ on anything
    else. The stack is followed by kind only (global or value), as
    pickletools.dis follows it; a stack the opcodes do not fit is corrupt
    (CheckpointError). Refusals are ``refuse(message, where)``, the message
    "APP: WHERE: ..." (``needs``: what the pickle is, for the message;
    ``hint``: how a caller who trusts the file reads it anyway). Executes
    nothing: opcodes are read with pickletools."""
    memo = {}
    stack = []
    try:
        for op, arg, pos in pickletools.genops(data):
            name = op.name
            if name not in ops:
                raise refuse("%s: %s: pickle opcode %s at byte %d is not one %s needs: "
                             "refused (%s)" % (app, where, name, pos, needs, hint), where)
            if name in _PUTS and arg > len(memo):
                raise refuse("%s: %s: memo index %d at byte %d, past the %d entries stored "
                             "so far: refused" % (app, where, arg, pos, len(memo)), where)
            if name in _GETS and arg not in memo:
                raise CheckpointError("%s: %s: memo index %d at byte %d was never stored: "
                                      "the file is corrupt" % (app, where, arg, pos), where)
            before, kind = op.stack_before, "value"
            if pickletools.markobject in before or (name == "POP" and stack and
                                                    stack[-1] is _MARK):
                if _MARK not in stack:
                    raise ValueError("%s at byte %d without a MARK" % (name, pos))
                while stack[-1] is not _MARK:
                    stack.pop()
                stack.pop()
                pops = before.index(pickletools.markobject) if name != "POP" else 0
            else:
                pops = len(before)
            if len(stack) < pops:
                raise ValueError("%s at byte %d: the stack holds %d items, it takes %d"
                                 % (name, pos, len(stack), pops))
            deep = _ON_VALUE.get(name)
            if deep and stack[-deep] == "global":
                raise refuse("%s: %s: pickle opcode %s at byte %d acts on a class or "
                             "function, not on a value: refused" % (app, where, name, pos), where)
            deep = _ON_GLOBAL.get(name)
            if deep and stack[-deep] != "global":
                raise refuse("%s: %s: pickle opcode %s at byte %d calls something that is "
                             "not an allowed global: refused" % (app, where, name, pos), where)
            if name in _GETS:
                kind = memo[arg]
            elif name in ("GLOBAL", "STACK_GLOBAL"):
                kind = "global"
            if name in _PUTS or name == "MEMOIZE":
                if not stack or stack[-1] is _MARK:
                    raise ValueError("%s at byte %d with nothing to store" % (name, pos))
                memo[len(memo) if name == "MEMOIZE" else arg] = stack[-1]
                continue
            if pops:
                del stack[-pops:]
            for item in op.stack_after:
                stack.append(_MARK if item is pickletools.markobject else kind)
    except ValueError as e:         # pickletools: a truncated or malformed opcode
        if isinstance(e, CheckpointError):
            raise
        raise CheckpointError("%s: %s is corrupt or truncated: %s" % (app, where, e),
                              where) from None
