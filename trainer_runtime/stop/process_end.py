"""The end of a process whose training was stopped just in time (zero-code mode): the code after
`train()` in the script assumes training finished, and must not run on the partial model.

Called on every rank once `train()` has done its own ending after the stop (the checkpoint
committed by every rank, or its failure counted; the final progress record and termination message
written; the writer threads and the watcher ended: JitStop.close). Why `os._exit`, after the
atexit handlers, rather than `sys.exit`:

- `SystemExit` unwinds through the script: its `finally:` blocks and `except BaseException:` (or
  bare `except:`) run, and those are where a script saves its "final" model or writes its DONE
  marker as often as after the call; a handler can even swallow it and carry on.
- A normal interpreter exit with torch.distributed's process group still alive can abort
  (SIGABRT in the group's destructor) when a peer rank has exited first, turning the 143 into a
  134; `os._exit` runs no destructors. Peers are not waited for: each rank reaches this point by
  itself after the same agreed stop, and a barrier here would hang on a rank that is gone until
  the kubelet's SIGKILL.
- `os._exit` alone would skip the atexit handlers: logging's flush, and what libraries register
  to finish their work (experiment trackers closing their runs, temporary files). They run first,
  in their usual order, as at a normal exit; what they do is the libraries' and not code of the
  script's that assumes training finished. Non-daemon threads are not joined (Python would join
  them before the handlers): the checkpoint is durable, and the grace period is short.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from typing import NoReturn

log = logging.getLogger("trainer_runtime.stop")


def end_process(code: int) -> NoReturn:
    """Run the atexit handlers, flush the standard streams and `os._exit(code)`; never returns."""
    log.warning(
        "kubeckpt: training was stopped for preemption; the process exits with %d now (the "
        "script's code after train() does not run: training did not finish)",
        code,
    )
    run_handlers = getattr(atexit, "_run_exitfuncs", None)  # CPython's, what a normal exit runs
    try:
        if run_handlers is not None:
            run_handlers()  # logging.shutdown among them; a handler's error is printed, not raised
        else:
            logging.shutdown()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or broken stream: nothing more to say there
                pass
        os._exit(code)
