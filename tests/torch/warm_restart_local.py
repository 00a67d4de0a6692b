"""The program's own module, beside tests/torch/warm_restart_worker.py: the warm process never
imports such a file (only installed packages), so it reads the worker's RANK in every start."""
import os

RANK_AT_IMPORT = os.environ.get("RANK")
