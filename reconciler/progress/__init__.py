"""kubeckpt's progress controller (issue 7): every injected job's live progress in kubectl.

discovery  which pods belong to a job, its rank-0 pod, the target container, the progress path
reading    the progress file through pods/exec (`cat`, `python3 -c` fallback, byte cap) or the
           terminated container's termination message; validated by the contract
status     TrainingProgress status from a record, conditions, the events a change means
lastcheckpoint
           the annotations that put the latest complete checkpoint on the job's pods, for
           checkpoint-aware preemption
schedule   adaptive polling intervals and the global exec limiter
controller the reconcile loop on the reconciler library's informers and manager
main       the `kubeckpt-reconciler` entry point
"""
