"""Put into a venv's site-packages as cpprun_test_site_module by tests/e2e/warm_restart_test.cc:
an installed module that reads RANK at import. In a warm-started worker it was imported by the
warm process, which has no RANK (the documented difference of --warm-restart)."""
import os

RANK_AT_IMPORT = os.environ.get("RANK")
