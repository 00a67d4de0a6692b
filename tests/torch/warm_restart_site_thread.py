"""Put into a venv's site-packages as cpprun_test_site_module by tests/e2e/warm_restart_test.cc:
an installed module that starts a thread at import. A warm process that imported it must not
fork (a forked thread-holding process can deadlock), so it says it is unusable."""
import os
import threading
import time

RANK_AT_IMPORT = os.environ.get("RANK")
threading.Thread(target=time.sleep, args=(3600,), name="site-module-thread", daemon=True).start()
