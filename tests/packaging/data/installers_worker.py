"""A worker for tests/packaging/installers_test.sh: writes which python ran it, as JSON.

    installers_worker.py OUT_DIR   ->  OUT_DIR/rank-$RANK.json
        {"rank": ..., "world_size": ..., "executable": sys.executable, "prefix": sys.prefix}

No torch: it shows only which interpreter cpprun started for this rank.
"""

import json
import os
import sys

rank = os.environ["RANK"]
record = {
    "rank": int(rank),
    "world_size": int(os.environ["WORLD_SIZE"]),
    "executable": sys.executable,
    "prefix": sys.prefix,
}
path = os.path.join(sys.argv[1], f"rank-{rank}.json")
with open(path + ".tmp", "w") as f:
    json.dump(record, f)
os.rename(path + ".tmp", path)
print(f"rank {rank} ran {sys.executable}")
