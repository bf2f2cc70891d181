#!/usr/bin/env python3
"""No module of tiermem.torch imports another feature's private names.

A feature is a subpackage of python/tiermem/torch (activations, optim, params, fsdp, fit) or a
module at its top (allocator, the re-exports of the old paths). A private name starts with an
underscore: a function, class or constant, or a module (fit._cost). A module may import its own
feature's private names, and any name of the shared internal package (_shared); from another
feature it imports only public names of public modules. Imports from outside tiermem.torch
(tiermem's own _capi, torch's _pytree) are not this check's business, nor are attribute reads
through an imported module (fit._cost.DRAM after `from .. import fit`): import statements only.

usage: tools/scripts/check_imports.py [PACKAGE_DIR]   (default: python/tiermem/torch)
exit status 1 and a line per offender when any module breaks the rule.
"""

import ast
import os
import sys

PACKAGE = "tiermem.torch"
SHARED = "_shared"


def module_name(root, path):
    """tiermem.torch's dotted name of the file at path (a package's own name for __init__.py)."""
    parts = os.path.relpath(path, root)[:-len(".py")].split(os.sep)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE] + parts)


def resolve(importer, is_package, node):
    """The absolute module an ImportFrom names, for importer (a package when is_package)."""
    if node.level == 0:
        return node.module or ""
    base = importer.split(".")
    if not is_package:
        base.pop()
    if node.level > 1:
        base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def feature(dotted):
    """The feature a module of tiermem.torch belongs to; None outside tiermem.torch or for the
    package itself."""
    if dotted != PACKAGE and not dotted.startswith(PACKAGE + "."):
        return None
    rest = dotted[len(PACKAGE) + 1:].split(".") if dotted != PACKAGE else []
    return rest[0] if rest else None


def private_part(dotted):
    """The first underscored component of dotted below its feature, or None."""
    rest = dotted[len(PACKAGE) + 1:].split(".")[1:]
    return next((p for p in rest if p.startswith("_")), None)


def imports(tree, importer, is_package):
    """(line, module, name) for each imported name; name is None for `import a.b`."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = resolve(importer, is_package, node)
            for alias in node.names:
                yield node.lineno, source, alias.name
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None


def offences(root, path):
    importer = module_name(root, path)
    own = feature(importer)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for line, source, name in imports(tree, importer, path.endswith("__init__.py")):
        target = source if name is None or feature(source) is not None else None
        if name is not None and source == PACKAGE:  # from tiermem.torch import fit._cost-like
            target = PACKAGE + "." + name
            name = None
        if target is None:
            continue
        theirs = feature(target)
        if theirs is None or theirs == own or theirs == SHARED:
            continue
        private = private_part(target) or (name if name and name.startswith("_") else None)
        if theirs.startswith("_") and theirs != SHARED:
            private = theirs
        if private is not None:
            what = target + ("." + name if name else "")
            yield "%s:%d: %s imports %s (private to %s)" % (os.path.relpath(path), line,
                                                             importer, what, theirs)


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    root = argv[1] if len(argv) > 1 else os.path.join(here, "..", "..", "python", "tiermem",
                                                       "torch")
    root = os.path.normpath(root)
    bad = []
    for folder, _, files in sorted(os.walk(root)):
        for f in sorted(files):
            if f.endswith(".py"):
                bad.extend(offences(root, os.path.join(folder, f)))
    for line in bad:
        print(line)
    if bad:
        print("check_imports: %d imports of another feature's private names" % len(bad))
        return 1
    print("check_imports: no module imports another feature's private names")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
