#!/usr/bin/env python3
"""code_size.py's own test: files just over the limits are reported by name and size, files at the
limits pass. Without this a checker that found nothing would let the repository's check pass.

  code_size_test.py   (exit 0: every case as expected)
"""
import os
import subprocess
import sys
import tempfile

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_size.py")


def function_of(name, lines):
    """A definition of exactly `lines` lines."""
    body = [f"  total += {i};" for i in range(lines - 3)]
    return "\n".join([f"int {name}(int total) {{", *body, "  return total;", "}"]) + "\n"


def class_of(name, declared_lines, method_lines):
    """A class whose declaration spans `declared_lines` lines, plus one out-of-line method of
    `method_lines` lines: `declared_lines + method_lines` lines in all."""
    fields = [f"  int field{i} = {i};" for i in range(declared_lines - 4)]
    header = "\n".join([f"class {name} {{", " public:", "  int sum(int total) const;", *fields, "};"])
    body = [f"  total += field{i % max(1, declared_lines - 4)};" for i in range(method_lines - 3)]
    method = "\n".join([f"int {name}::sum(int total) const {{", *body, "  return total;", "}"])
    return header + "\n\n" + method + "\n"


def check(files, expect_code, expect_lines):
    done = subprocess.run([sys.executable, CHECKER, "--max-function-lines", "120", "--max-class-lines",
                           "600", *files], capture_output=True, text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    ok = done.returncode == expect_code and all(line in output for line in expect_lines)
    print(("ok   " if ok else "FAIL ") + f"exit {done.returncode} (want {expect_code}) for {files}")
    if not ok:
        print(output)
    return ok


def main():
    with tempfile.TemporaryDirectory() as folder:
        os.chdir(folder)
        with open("over.cc", "w", encoding="utf-8") as f:
            f.write(function_of("longFunction", 121) + "\n" + class_of("BigClass", 500, 101))
        with open("at.cc", "w", encoding="utf-8") as f:
            f.write(function_of("fineFunction", 120) + "\n" + class_of("FineClass", 500, 100))
        results = [
            check(["over.cc"], 1, ["over.cc:1: function longFunction is 121 lines (limit 120)",
                                   "class BigClass is 601 lines (limit 600)", "2 over the limits"]),
            check(["at.cc"], 0, ["0 over the limits"]),
        ]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
