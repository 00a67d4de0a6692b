"""What torch's own torchrun is, as facts the compatibility test checks docs/torchrun-compatibility.md
against: every option of its parser (names, default, choices, whether PET_<NAME> is read), the
environment variable names its launcher code reads or sets, and where its source lives.

Run with the interpreter of the torch under test: `python torchrun_facts.py OUT.json`.
"""
import argparse
import json
import os
import re
import sys

import torch
from torch.distributed.run import get_args_parser

LAUNCHER_SOURCES = ["run.py", "argparse_util.py", "launcher", "elastic"]


def options():
    out = []
    for action in get_args_parser()._actions:
        if isinstance(action, argparse._HelpAction) or not action.option_strings:
            continue
        default = action.default
        try:
            json.dumps(default)
        except TypeError:
            default = repr(default)
        out.append({
            "names": action.option_strings,
            "default": default,
            "choices": list(action.choices) if action.choices else [],
            # torch.distributed.argparse_util's env / check_env read PET_<DEST> when absent.
            "pet": type(action).__name__ in ("env", "check_env"),
            "flag": action.nargs == 0,
        })
    return out


def environment_names(root):
    names = set()
    literal = re.compile(r'"((?:TORCHELASTIC|TORCH_ELASTIC)_[A-Z0-9_]+)"')
    read = re.compile(r'os\.(?:getenv|environ\.get)\(\s*"([A-Z][A-Z0-9_]+)"|os\.environ\["([A-Z][A-Z0-9_]+)"\]')
    for entry in LAUNCHER_SOURCES:
        path = os.path.join(root, entry)
        files = [path] if path.endswith(".py") else [
            os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs if f.endswith(".py")]
        for f in files:
            text = open(f, encoding="utf-8").read()
            names.update(literal.findall(text))
            for a, b in read.findall(text):
                names.add(a or b)
    return sorted(names)


root = os.path.dirname(torch.distributed.__file__)
with open(sys.argv[1], "w", encoding="utf-8") as out:
    json.dump(
        {
            "version": torch.__version__,
            "torch_dir": os.path.dirname(torch.__file__),
            "options": options(),
            "environment": environment_names(root),
        },
        out,
    )
