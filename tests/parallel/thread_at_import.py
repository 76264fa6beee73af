"""A module whose import starts a thread, as some libraries do (`tests/parallel/test_launch.py`): a rank forked
after its import would have the module without its thread."""

from __future__ import annotations

import os
import threading

IMPORTED_BY = os.getpid()
started = threading.Thread(target=threading.Event().wait, name="started-at-import", daemon=True)
started.start()
