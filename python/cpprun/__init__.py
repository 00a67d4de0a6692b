"""cpprun, a torchrun-style launcher written in C++, installed by pip.

The launcher is the native executable the wheel put into the environment's ``bin/`` (next to its
``python``); this package only finds it. ``python -m cpprun ARGS`` replaces the Python process
with that executable and the same ARGS (``os.execv``): nothing is re-implemented here, and
signals, exit codes and the terminal belong to cpprun as when it is run directly.
"""

import os
import sys
import sysconfig
from importlib import metadata

try:
    __version__ = metadata.version("cpprun")
except metadata.PackageNotFoundError:  # imported from a source tree
    __version__ = "unknown"


def executable(name="cpprun"):
    """The path of the installed ``cpprun`` (or ``cpprun-store``) executable.

    Found in the files pip recorded for this distribution (so a ``--user`` or ``--prefix``
    install is found too), else in the running interpreter's scripts directory. In a wheel
    repaired by auditwheel the native executable lies in ``cpprun.scripts/`` in site-packages
    and ``bin/cpprun`` is a script that executes it: the native one is returned.
    """
    try:
        files = metadata.distribution("cpprun").files or ()
    except metadata.PackageNotFoundError:
        files = ()
    # The native executable itself: in cpprun.scripts/ when auditwheel repaired the wheel (its
    # bin/ entry is then a script that executes it), else in bin/.
    for folder in ("cpprun.scripts", "bin"):
        for f in files:
            if f.name == name and f.parent.name == folder:
                path = os.path.realpath(f.locate())
                if os.access(path, os.X_OK):
                    return path
    path = os.path.join(sysconfig.get_path("scripts"), name)
    if os.access(path, os.X_OK):
        return path
    raise FileNotFoundError(f"the {name} executable of the cpprun wheel is not installed")


def main(name="cpprun"):
    """Executes ``name`` with this process's arguments; does not return."""
    exe = executable(name)
    os.execv(exe, [exe] + sys.argv[1:])
