"""Runs a Python script unchanged as __main__, then ends the process with os._exit.

    python exit_hard.py SCRIPT [ARGS...]

For tests/packaging/old_userland_test.sh: Debian 11's torch 1.7.1 on Python 3.9 aborts
("terminate called without an active exception") or hangs at interpreter exit once autograd
has run, with or without a launcher (pytorch/pytorch#38230, #50893: its autograd threads meet
Python 3.9's finalization). Skipping finalization is the usual workaround; the script itself,
sys.argv (SCRIPT first, as if run directly) and sys.executable are as without this wrapper.
Exit status: the script's SystemExit code, 1 after an uncaught exception (traceback printed),
else 0.
"""
import os
import runpy
import sys
import traceback


def main():
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:  # sys.exit("message"): printed, status 1, as the interpreter does
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:  # noqa: B902 - reported like the interpreter would, then exit 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
