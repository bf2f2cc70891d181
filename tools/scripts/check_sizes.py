#!/usr/bin/env python3
"""Checks the sizes CONTRIBUTING.md sets for a folder's C/C++ sources: no file over --max-file
lines and no function body over --max-function lines. Prints each offender with its place; exit 1
if any.

usage: tools/scripts/check_sizes.py [--max-file N] [--max-function N] DIR...
"""
import argparse
import pathlib
import re
import sys

SCOPES = re.compile(r"\b(namespace|class|struct|union|enum)\b")
NOT_FUNCTIONS = re.compile(r"^\s*(if|for|while|switch|catch|do|else|return|try)\b|=\s*$|\[[^\]]*\]\s*\(")


def strip(text):
    """Blanks comments, string and character literals, keeping every newline."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith('R"', i):
            m = re.match(r'R"([^(]*)\(', text[i:])
            end = text.find(")" + m.group(1) + '"', i) if m else -1
            j = n if end < 0 else end + len(m.group(1)) + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + " " * (min(j, n) - i - 1) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(text):
    """Yields (name, first line, lines) of every function body at namespace or class scope."""
    # Preprocessor lines are no part of a function's or a scope's head (an `#if defined(...)` or
    # a `#define X __attribute__((...))` before a namespace would read as a function's head).
    code = re.sub(r"(?m)^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group(0)),
                  strip(text))
    stack = []  # per open brace: "scope", "function" (with start) or "block"
    head_start = 0
    for i, c in enumerate(code):
        if c == "{":
            head = code[head_start:i]
            if stack and stack[-1][0] in ("function", "block"):
                kind = ("block", 0, "")
            elif SCOPES.search(head) and "(" not in head.split("=")[0] or "extern" in head and '"' in head:
                kind = ("scope", 0, "")
            elif ")" in head and not NOT_FUNCTIONS.search(head.strip().split("\n")[-1]):
                name = re.findall(r"([~\w:]+)\s*\(", head)
                kind = ("function", code.count("\n", 0, i) + 1, name[0] if name else "?")
            else:
                kind = ("block", 0, "")
            stack.append(kind)
            head_start = i + 1
        elif c == "}":
            if stack:
                kind, start, name = stack.pop()
                if kind == "function":
                    end = code.count("\n", 0, i) + 1
                    yield name, start, end - start + 1
            head_start = i + 1
        elif c == ";":
            head_start = i + 1


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-file", type=int, default=500)
    p.add_argument("--max-function", type=int, default=80)
    p.add_argument("dirs", nargs="+")
    a = p.parse_args()
    bad = 0
    for d in a.dirs:
        for f in sorted(pathlib.Path(d).rglob("*")):
            if f.suffix not in (".h", ".cc", ".c", ".cu"):
                continue
            text = f.read_text()
            lines = text.count("\n")
            if lines > a.max_file:
                print(f"{f}: {lines} lines (at most {a.max_file})")
                bad += 1
            for name, start, length in functions(text):
                if length > a.max_function:
                    print(f"{f}:{start}: {name} is {length} lines (at most {a.max_function})")
                    bad += 1
    if bad:
        print(f"check_sizes: {bad} over the limits")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
