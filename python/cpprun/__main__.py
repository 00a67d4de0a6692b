"""``python -m cpprun ARGS``: executes the installed cpprun with ARGS (see ``cpprun.main``)."""

from cpprun import main

if __name__ == "__main__":
    main()
