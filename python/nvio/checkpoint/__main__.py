"""python -m nvio.checkpoint info|verify PATH: inspect or check a checkpoint.

    python -m nvio.checkpoint info ckpt.pt [--json]
    python -m nvio.checkpoint verify ckpt.pt [--json] [--quiet]

(also ``nvio checkpoint ...`` where nvio was installed with pip). Exit
status: 0 when the file was read (info) or is intact (verify), 1 when it is
not a readable checkpoint or a check failed, 2 for a usage error.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from ._inspect import LegacyFormat, NotACheckpoint, info, verify

PROG = "python -m nvio.checkpoint"


def _parser(prog):
    p = argparse.ArgumentParser(
        prog=prog, description="Inspect or check torch checkpoints (nvio.save's and "
        "torch.save's zip format). Nothing in the file is executed.")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND")
    sub.required = True
    i = sub.add_parser("info", help="list the tensors and records of a checkpoint",
                       description="List every tensor (key path, dtype, shape, storage "
                       "bytes, record, file offset and its alignment, shared storage) and, "
                       "with --records, every zip record.")
    i.add_argument("path")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    i.add_argument("--records", action="store_true", help="list every zip record too")
    v = sub.add_parser("verify", help="check that a checkpoint is intact",
                       description="Check the zip structure, every record's CRC-32 against "
                       "the central directory, that sizes agree (directory, local headers, "
                       "data descriptors, the pickle's storages), and that the pickle loads "
                       "with weights_only=True. Exit status 0 if intact, 1 if not.")
    v.add_argument("path")
    v.add_argument("--json", action="store_true", help="print one JSON object")
    v.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    return p


def _size(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.1f %s" % (n, unit))
        n /= 1024.0
    return str(n)


def _print_info(d, records, out):
    n_data = [r for r in d["records"] if "/data/" in r["name"] or r["name"].startswith("data/")]
    writer = "nvio (layout %s)" % d["nvio_format"] if d["writer"] == "nvio" else "torch.save"
    print("%s: torch zip checkpoint written by %s, %s (%d bytes)"
          % (d["path"], writer, _size(d["size"]), d["size"]), file=out)
    print("archive %r, %d records, %d storages, %d tensors, storage alignment %s, byteorder %s"
          % (d["archive"], len(d["records"]), len(d["storages"]), len(d["tensors"]),
             d["storage_alignment"] or "-", d["byteorder"] or "-"), file=out)
    if d["pickle"] != "ok":
        print("pickle: %s" % d["pickle"], file=out)
    if d["tensors"]:
        rows = [("KEY", "DTYPE", "SHAPE", "STORAGE_BYTES", "RECORD", "OFFSET", "ALIGN", "SHARED")]
        for t in d["tensors"]:
            rows.append((t["key"] or "(the object)", t["dtype"],
                         "-" if t["shape"] is None else
                         "(" + ", ".join(str(s) for s in t["shape"]) + ")",
                         "-" if t["storage_bytes"] is None else str(t["storage_bytes"]),
                         t["record"] or "-",
                         "-" if t["offset"] is None else str(t["offset"]),
                         "-" if t["align"] is None else str(t["align"]),
                         "yes" if t["shared"] else "no"))
        _table(rows, out)
    if n_data:
        page = sum(1 for r in n_data if r["align"] and r["align"] >= 4096)
        print("%d of %d tensor records start on a 4096-byte boundary%s"
              % (page, len(n_data), " (nvio.load reads them with O_DIRECT straight into "
                 "place)" if page == len(n_data) else ""), file=out)
    if records:
        rows = [("RECORD", "HEADER", "OFFSET", "ALIGN", "SIZE", "CRC32")]
        for r in d["records"]:
            rows.append((r["name"], str(r["header_offset"]), str(r["offset"]),
                         str(r["align"]), str(r["size"]), r["crc32"]))
        _table(rows, out)


def _table(rows, out):
    w = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w[i]) if i < len(r) - 1 else c
                        for i, c in enumerate(r)).rstrip(), file=out)


def _progress():
    """A progress printer for stderr when it is a terminal, else None."""
    if not sys.stderr.isatty():
        return None
    last = [-1]

    def show(done, total):
        pct = 100 * done // total if total else 100
        if pct != last[0]:
            last[0] = pct
            sys.stderr.write("\rverifying: %3d%% of %s" % (pct, _size(total)))
            if done >= total:
                sys.stderr.write("\r" + " " * 40 + "\r")
            sys.stderr.flush()
    return show


def main(argv=None, prog=PROG):
    args = _parser(prog).parse_args(argv)
    try:
        return _run(args, prog)
    except BrokenPipeError:
        raise
    except (OSError, ValueError, RecursionError, MemoryError, RuntimeError) as e:
        # what the checks above do not foresee in a hostile file is still
        # one line naming the file, never a traceback
        print("%s %s: %s: internal error reading the file (%s: %s)"
              % (prog, args.cmd, args.path, type(e).__name__, e), file=sys.stderr)
        return 1


def _run(args, prog):
    out = sys.stdout
    if args.cmd == "info":
        try:
            d = info(args.path)
        except LegacyFormat as e:
            print("%s info: %s" % (prog, e), file=sys.stderr)
            return 1
        except NotACheckpoint as e:
            print("%s info: %s" % (prog, e), file=sys.stderr)
            return 1
        except OSError as e:
            print("%s info: %s: %s" % (prog, args.path, e.strerror or e), file=sys.stderr)
            return 1
        if args.json:
            json.dump(d, out, indent=1)
            out.write("\n")
        else:
            _print_info(d, args.records, out)
        return 0
    rep = verify(args.path, None if args.json or args.quiet else _progress())
    if args.json:
        json.dump(rep, out, indent=1)
        out.write("\n")
    else:
        for p in rep["problems"]:
            where = []
            if p["record"] is not None:
                where.append("record %s" % p["record"])
            if p["offset"] is not None:
                where.append("offset %d" % p["offset"])
            prefix = "%s: " % rep["path"] + (", ".join(where) + ": " if where else "")
            msg = p["message"]
            if msg.startswith(rep["path"] + ": "):
                msg = msg[len(rep["path"]) + 2:]
            print("%s%s" % (prefix, msg), file=out)
        if not args.quiet:
            for w in rep["warnings"]:
                print("%s: warning: %s" % (rep["path"], w), file=out)
            if rep["status"] == "legacy":
                print("%s: NOT VERIFIED (legacy format)" % rep["path"], file=out)
            elif rep["ok"]:
                print("%s: OK: %d records, %s checked (CRC-32, sizes, pickle)"
                      % (rep["path"], rep["records_checked"], _size(rep["bytes_checked"])),
                      file=out)
            else:
                print("%s: CORRUPT: %d problem%s" % (rep["path"], len(rep["problems"]),
                                                     "" if len(rep["problems"]) == 1 else "s"),
                      file=out)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except BrokenPipeError:
        os._exit(1)
