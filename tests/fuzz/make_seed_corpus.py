#!/usr/bin/env python3
"""Writes a libFuzzer seed corpus for wire_fuzz: every client->server message and every whole
client stream of the given torch captures (tests/rendezvous/data/torch-*.json: 1.13, 2.1 and
2.15 numbering), plus a torch >= 2.2 handshake.

Usage: make_seed_corpus.py VECTORS_JSON [VECTORS_JSON ...] OUT_DIR
Each file starts with one chunk-size byte (wire_fuzz's first input byte), then the bytes.
"""
import json
import os
import sys


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    files, out = sys.argv[1:-1], sys.argv[-1]
    os.makedirs(out, exist_ok=True)
    scenarios = []
    for vectors in files:
        with open(vectors) as f:
            scenarios.extend(json.load(f)["scenarios"])
    seeds = []
    for scenario in scenarios:
        streams = {}
        for e in scenario["exchanges"]:
            if e["direction"] == "client->server":
                raw = bytes.fromhex(e["hex"])
                seeds.append(raw)
                streams.setdefault(e["conn"], bytearray()).extend(raw)
        seeds.extend(bytes(s) for s in streams.values())
    v2 = bytes.fromhex("00cef7853c" "0d2d090100" "07" "0c")
    seeds.append(v2)
    for i, seed in enumerate(seeds):
        with open(os.path.join(out, f"seed-{i:04d}"), "wb") as f:
            f.write(bytes([i % 17]) + seed)
    print(f"wrote {len(seeds)} seeds to {out}")


if __name__ == "__main__":
    main()
