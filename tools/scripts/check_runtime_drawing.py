#!/usr/bin/env python3
"""Checks docs/building.md's drawing of lib/runtime against the code: the parts that each part
holds a reference to (the wiring in lib/runtime/runtime.h: `Part part_{core_, other_, ...};`)
and each part header's lib/runtime includes. The drawing is the fenced block that follows the
line "<!-- lib/runtime drawing -->" in docs/building.md, one line a part:

    Part -> Other Other ...   (includes: a.h b.h)

Exit 1, naming each difference, when they disagree.

    python3 tools/scripts/check_runtime_drawing.py [ROOT]
"""

import os
import re
import sys

MARK = "<!-- lib/runtime drawing -->"
HEADERS = {"Moves": "moves.h", "Room": "room.h", "Prefetcher": "prefetcher.h",
           "Movers": "movers.h", "CallerCopies": "caller_copies.h",
           "RecomputeCallbacks": "recompute.h", "WriteThrough": "write_through.h",
           "MoveJobs": "move_jobs.h", "Core": "core.h"}


def from_code(root):
    runtime = open(os.path.join(root, "lib/runtime/runtime.h")).read()
    by_member = {m: t for t, m in re.findall(r"^\s+(\w+) (\w+_)(?:\{[^}]*\})?;", runtime, re.M)
                 if t in HEADERS}
    parts = {}
    for part, args in re.findall(r"^\s+(\w+) \w+_\{([^}]*)\};", runtime, re.M):
        refs = [by_member[a.strip()] for a in args.split(",") if a.strip() in by_member]
        parts[part] = refs
    parts.setdefault("Core", [])
    includes = {}
    for part, header in HEADERS.items():
        text = open(os.path.join(root, "lib/runtime", header)).read()
        includes[part] = re.findall(r'#include "lib/runtime/(\w+\.h)"', text)
    return parts, includes


def from_doc(root):
    text = open(os.path.join(root, "docs/building.md")).read()
    if MARK not in text:
        sys.exit("check_runtime_drawing: no %r in docs/building.md" % MARK)
    block = text.split(MARK, 1)[1].split("```", 2)[1]
    parts, includes = {}, {}
    for line in block.splitlines():
        m = re.match(r"\s*(\w+)\s+->\s*([\w ]*?)\s*\(includes:\s*([\w. ]*)\)\s*$", line)
        if m:
            parts[m.group(1)] = m.group(2).split()
            includes[m.group(1)] = m.group(3).split()
    return parts, includes


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
    code_parts, code_inc = from_code(root)
    doc_parts, doc_inc = from_doc(root)
    errors = []
    for part in sorted(set(code_parts) | set(doc_parts)):
        if sorted(code_parts.get(part, ["(missing)"])) != sorted(doc_parts.get(part, ["(missing)"])):
            errors.append("%s: the code holds %s, the drawing says %s" % (
                part, code_parts.get(part), doc_parts.get(part)))
        if sorted(code_inc.get(part, [])) != sorted(doc_inc.get(part, [])):
            errors.append("%s: its header includes %s, the drawing says %s" % (
                part, code_inc.get(part), doc_inc.get(part)))
    for e in errors:
        print("check_runtime_drawing: " + e)
    if errors:
        sys.exit(1)
    print("check_runtime_drawing: docs/building.md matches lib/runtime (%d parts)" % len(code_parts))


if __name__ == "__main__":
    main()
