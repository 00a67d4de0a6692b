#!/usr/bin/env python3
"""Seeds for record_fuzz: one valid record of each type the agents read from a store, as the
agents write them (job_keys.h), with the type byte record_fuzz.cc reads first.

Usage: make_record_corpus.py OUT_DIR
"""
import json
import os
import sys

failure = {"local_rank": 0, "rank": 3, "pid": 4242, "exit_code": 1, "signal": 0,
           "time_us": 1700000000000000, "error_file": "/tmp/e.json", "message": "boom",
           "traceback": "Traceback", "stderr_tail": ["a", "b"], "teardown": False,
           "collateral": False, "waiting": False, "host": "n1", "error_document": None,
           "unreaped": False, "state": "", "wchan": ""}
rank = {"r": 2, "l": 0, "p": 99, "s": True, "in": True, "op": "all_reduce", "g": "default",
        "q": 7, "f": "train.py:40 in step", "k": ["Current thread 0x1", "  File x"]}
member = {"host": "n0", "nproc": 2, "id": "n0:1:ab", "scheduler_rank": 0, "previous_rank": -1,
          "index": 1}
SEEDS = [
    (0, {"by": 1, "reason": "node 1: rank 3 exited with code 1", "cause": "failure", "signal": 0}),
    (0, {"by": -1, "reason": "the job ended", "cause": "end", "signal": 0}),
    (1, {"kind": "failed", "signal": 0, "error": "", "failures": [failure], "ranks": [rank]}),
    (2, {"kind": "restart", "readers": 2, "signal": 0, "summary": "s", "restarts_used": 1,
         "membership_change": False, "failures": [failure],
         "excluded": {"rank": 1, "host": "n1", "agent_id": "x", "reason": "r"}}),
    (3, member),
    (4, {"attempt": 0, "round": 3, "members": [member, dict(member, id="n1", index=2)]}),
    (4, {"error": "too few nodes"}),
    (4, {"job_over": "succeeded"}),
    (5, {"kind": "member", "attempt": 0, "round": 0, "rank": 1, "nodes": 2, "base_rank": 2,
         "world_size": 4, "digest": "0123456789abcdef"}),
    (5, {"kind": "error", "message": "m"}),
    (6, rank),
]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for i, (kind, doc) in enumerate(SEEDS):
        with open(os.path.join(out, "seed-%02d" % i), "wb") as f:
            f.write(bytes([kind]) + json.dumps(doc).encode())


if __name__ == "__main__":
    main()
