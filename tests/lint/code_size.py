#!/usr/bin/env python3
"""The code-size limits of docs/architecture.md: no function over 120 lines and no class over 600
lines in the given folders (agent/, launcher/, rendezvous/ and common/ in CI).

  code_size.py --build BUILD_DIR [--max-function-lines 120] [--max-class-lines 600] DIR...
  code_size.py --flags "-std=c++20 -I..." [...] FILE...     (files outside a build, e.g. fixtures)

Functions are measured by clang-tidy's readability-function-size check (LineThreshold), which
parses the code as the compiler does: every definition in the .cc files, and the inline ones of
the headers in the same folders. Classes (and structs) are measured here, on the source text: the
lines from the line that opens `class X {` to its closing brace, plus the lines of every
out-of-line definition `X::name(...) { ... }` in a .cc file. The sources are clang-formatted, so a
top-level definition opens and closes at column 0, which is what this reader relies on.

Prints one line per violation, `path:line: function|class NAME is N lines (limit L)`, and exits 1
if there is any; exits 2 when it cannot check (clang-tidy missing or failing, no sources found).
"""
import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys

CLASS_OPEN = re.compile(r"^\s*(?:template\s*<[^>]*>\s*)?(class|struct)\s+(?:\[\[[^\]]*\]\]\s*)?"
                        r"([A-Za-z_]\w*(?:::[A-Za-z_]\w*)*)\b[^;()]*\{")
OUT_OF_LINE = re.compile(r"^[A-Za-z_][^;]*?\b((?:[A-Za-z_]\w*::)+)~?[A-Za-z_]\w*\s*\(")
TIDY_WARNING = re.compile(r"^(.*?):(\d+):\d+: warning: function '([^']*)' exceeds recommended "
                          r"size/complexity thresholds")
TIDY_LINES = re.compile(r"note: (\d+) lines including whitespace and comments")


def cannot_check(message):
    print("code_size: " + message, file=sys.stderr)
    sys.exit(2)


def strip_code(line, in_comment):
    """The line without comments, string and character literals, and whether a /* */ comment is
    still open at its end."""
    out = []
    i = 0
    while i < len(line):
        if in_comment:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_comment = end + 2, False
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            in_comment = True
            i += 2
        elif line[i] in "\"'":
            quote = line[i]
            i += 1
            while i < len(line) and line[i] != quote:
                i += 2 if line[i] == "\\" else 1
            i += 1
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_comment


def code_lines(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        raw = f.read().split("\n")
    stripped, in_comment = [], False
    for line in raw:
        text, in_comment = strip_code(line, in_comment)
        stripped.append(text)
    return stripped


def block_end(lines, start):
    """The index of the line that closes the first brace opened at or after `start`."""
    depth, opened = 0, False
    for index in range(start, len(lines)):
        for char in lines[index]:
            if char == "{":
                depth, opened = depth + 1, True
            elif char == "}":
                depth -= 1
                if opened and depth == 0:
                    return index
    return len(lines) - 1


def class_sizes(paths):
    """{qualified class name: [lines, where it is defined]} over the given files."""
    declared = {}  # name -> [lines, where]
    defined_out_of_line = {}  # owner as written before the method's name -> lines
    for path in paths:
        lines = code_lines(path)
        enclosing = []  # (name, index of the closing line) of the classes around the current line
        index = 0
        while index < len(lines):
            while enclosing and index > enclosing[-1][1]:
                enclosing.pop()
            line = lines[index]
            match = CLASS_OPEN.match(line)
            definition = OUT_OF_LINE.match(line)
            if match:
                end = block_end(lines, index)
                name = match.group(2)
                if enclosing and "::" not in name:
                    name = enclosing[-1][0] + "::" + name
                entry = declared.setdefault(name, [0, f"{path}:{index + 1}"])
                entry[0] += end - index + 1
                enclosing.append((name, end))
            elif (definition and path.endswith(".cc") and not enclosing and line[:1].isalpha()
                  and not line.rstrip().endswith(";")):
                end = block_end(lines, index)
                owner = definition.group(1)[:-2]
                defined_out_of_line[owner] = defined_out_of_line.get(owner, 0) + end - index + 1
                index = end
            index += 1
    for owner, count in defined_out_of_line.items():
        names = [n for n in declared if n == owner or owner.endswith("::" + n)]
        if len(names) == 1:  # a namespace-qualified free function has no class to count toward
            declared[names[0]][0] += count
    return declared


def function_violations(files, build, flags, header_filter, limit):
    tidy = shutil.which("clang-tidy")
    if tidy is None:
        cannot_check("clang-tidy not found (packaging/setup.sh installs it)")
    config = json.dumps({"CheckOptions": [
        # clang-tidy counts the lines after the one that opens the body: a definition of N lines
        # from `{` to `}` counts N - 1.
        {"key": "readability-function-size.LineThreshold", "value": str(limit - 1)}]})

    def run(path):
        command = [tidy, "--quiet", "-checks=-*,readability-function-size", "-config=" + config,
                   "-header-filter=" + header_filter, "--extra-arg=-w", path]
        command += ["-p", build] if build else ["--"] + flags.split()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0 and "error:" in done.stdout + done.stderr:
            cannot_check(f"clang-tidy failed on {path}:\n{done.stdout}{done.stderr}")
        return done.stdout

    found = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        for output in pool.map(run, files):
            lines = output.split("\n")
            for index, line in enumerate(lines):
                warning = TIDY_WARNING.match(line)
                if not warning:
                    continue
                count = next((int(m.group(1)) + 1 for m in map(TIDY_LINES.search, lines[index + 1:index + 6])
                              if m), None)
                key = (os.path.relpath(warning.group(1)), int(warning.group(2)), warning.group(3))
                found[key] = count
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", help="build folder with compile_commands.json")
    parser.add_argument("--flags", default="-std=c++20", help="compiler flags without a build")
    parser.add_argument("--max-function-lines", type=int, default=120)
    parser.add_argument("--max-class-lines", type=int, default=600)
    parser.add_argument("paths", nargs="+", help="folders (with --build) or files")
    args = parser.parse_args()

    sources = []
    for path in args.paths:
        if os.path.isdir(path):
            for folder, _, names in os.walk(path):
                sources += [os.path.join(folder, n) for n in sorted(names) if n.endswith((".h", ".cc"))]
        else:
            sources.append(path)
    sources = [os.path.relpath(s) for s in sources]
    units = [s for s in sources if s.endswith(".cc")]
    if args.build:
        with open(os.path.join(args.build, "compile_commands.json"), encoding="utf-8") as f:
            compiled = {os.path.relpath(e["file"]) for e in json.load(f)}
        missing = [u for u in units if u not in compiled]
        if missing:
            cannot_check(f"not in {args.build}/compile_commands.json: {' '.join(missing)}")
    if not units:
        cannot_check("no .cc files to check")

    folders = sorted({os.path.dirname(os.path.abspath(s)) for s in sources})
    header_filter = "^(" + "|".join(re.escape(f) + "/[^/]*" for f in folders) + ")$"
    violations = []
    for (path, line, name), count in sorted(function_violations(
            units, args.build, args.flags, header_filter, args.max_function_lines).items()):
        violations.append(f"{path}:{line}: function {name} is {count} lines "
                          f"(limit {args.max_function_lines})")
    for name, (count, where) in sorted(class_sizes(sources).items()):
        if count > args.max_class_lines:
            violations.append(f"{where}: class {name} is {count} lines (limit {args.max_class_lines})")
    for violation in violations:
        print(violation)
    print(f"code_size: {len(units)} translation units and {len(sources) - len(units)} headers checked, "
          f"{len(violations)} over the limits")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
