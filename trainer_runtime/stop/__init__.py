"""The just-in-time stop, from the trigger to the exit code (standard library only).

Read top to bottom, as a stop runs:

    prestop.py   the preStop hook (`kubeckpt-prestop`) writes the request file and waits
    triggers.py  SIGTERM sets a flag, the request file is seen: this rank is asked to stop
                 (incarnation.py: a request from an earlier container of the pod is not)
    jit.py       the ask rides in the per-step agreement; every rank stops at one step and the
                 training thread saves it there (JitStop.decide, JitStop.save_at)
    watcher.py   or, the training thread being away from a step boundary, the watcher saves the
                 last completed step (JitStop.owner: exactly one of the two saves a rank's stop)
    triggers.py  local rank 0 answers preStop: `checkpoint-done` or `checkpoint-failed`
    jit.py       JitStop.close: the signals given back (ignored now), a late request answered;
                 the process exits with `exit_code`, 143 (PREEMPTED_EXIT_CODE) after a stop, so
                 that the job is restarted
    process_end.py  zero-code mode: that exit happens where the Trainer's training returns, so
                 the script's code after `train()` (it assumes training finished) never runs;
                 a script that adopted kubeckpt itself gets the return and exits itself

The request, done and failed file names are the pod's contract (contract/env.py).
"""

from .jit import JitStop, StopOwner, exit_code
from .triggers import RequestFile, SignalTrigger, Triggers

__all__ = ["JitStop", "RequestFile", "SignalTrigger", "StopOwner", "Triggers", "exit_code"]
