#!/usr/bin/env python3
"""The longest functions of src/, apps/ and include/, and a check that none is over a limit.

    python3 scripts/function-lengths.py            # the 15 longest, and how many pass 60 and 100 lines
    python3 scripts/function-lengths.py --max 100  # exit 1 naming each function over 100 lines

A definition starts at a line ending in '{' whose statement (from the previous line ending in ';',
'{', '}' or ':', or a blank, comment or preprocessor line) holds a '(' and starts with no control
keyword, and ends at the first line that closes a brace at the statement's indentation ('}',
'};', '});'). Its length counts both, the signature's lines included. Free functions, members
defined in a class, constructors with initializer lists and lambdas given as arguments are all
measured; data tables (an initializer '= {') are not functions. Tests are not looked at.
"""
import argparse
import glob
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTROL = {"if", "for", "while", "switch", "namespace", "struct", "class", "enum", "else", "return", "do", "try",
           "catch", "static_assert", "case", "default", "union", "extern"}


def closes(line, indent):
    close = " " * indent + "}"
    return line.startswith(close) and (len(line) == len(close) or line[len(close)] in " );,")


def functions(path):
    lines = path.read_text().split("\n")
    found, start = [], 0
    for i, line in enumerate(lines):
        text = line.strip()
        if not text or text.startswith(("//", "#")):
            start = i + 1
            continue
        if text.endswith("{") and not text.startswith("}"):
            statement = " ".join(part.strip() for part in lines[start:i + 1])
            words = statement.split()
            before_paren = statement.split("(")[0]
            if ("(" in statement and words and words[0] not in CONTROL and not words[0].startswith(("}", "[", "{", ":"))
                    and "=" not in before_paren):
                indent = len(lines[start]) - len(lines[start].lstrip())
                end = next((j for j in range(i + 1, len(lines)) if closes(lines[j], indent)), None)
                if end is not None:
                    found.append((end - start + 1, start + 1, statement[:100]))
            start = i + 1
        elif text.endswith((";", "}", ":")):
            start = i + 1
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max", type=int, default=0, help="exit 1 if a function is longer than this many lines")
    parser.add_argument("--top", type=int, default=15, help="how many of the longest to list")
    args = parser.parse_args()
    measured = []
    for pattern in ("src/**/*.cpp", "src/**/*.h", "src/**/*.cu", "apps/**/*.cpp", "include/**/*.h"):
        for name in sorted(glob.glob(str(ROOT / pattern), recursive=True)):
            path = Path(name)
            for length, line, signature in functions(path):
                measured.append((length, f"{path.relative_to(ROOT)}:{line}", signature))
    measured.sort(key=lambda m: -m[0])
    if args.max > 0:
        over = [m for m in measured if m[0] > args.max]
        for length, where, signature in over:
            print(f"function-lengths: {where}: {length} lines (more than {args.max}): {signature}")
        if over:
            return 1
        print(f"function-lengths: {len(measured)} functions, none over {args.max} lines "
              f"(the longest: {measured[0][0]} lines, {measured[0][1]})")
        return 0
    for length, where, signature in measured[:args.top]:
        print(f"{length:4d}  {where}  {signature}")
    print(f"{len(measured)} functions; over 60 lines: {sum(1 for m in measured if m[0] > 60)}; "
          f"over 100: {sum(1 for m in measured if m[0] > 100)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
