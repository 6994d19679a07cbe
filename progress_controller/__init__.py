"""kubeckpt's progress controller (issue 7): every injected job's live progress in kubectl.

Built on the reconciler library (informers, manager, leader election, apply, exec); the API it
reads and writes (TrainingProgress, CheckpointPolicy, the status vocabulary) is kubeckpt_api's.

discovery  which pods belong to a job, its rank-0 pod, the target container, the progress path
reading    the progress file through pods/exec (`cat`, `python3 -c` fallback, byte cap) or the
           terminated container's termination message; validated by the contract
decide     the TrainingProgress status from a record and the stored status, and the events a
           change means
lastcheckpoint
           the annotations that put the latest complete checkpoint on the job's pods, for
           checkpoint-aware preemption
schedule   adaptive polling intervals and the exec limiter (global, fair per namespace)
trainjob   TrainJob support: the API noticed when installed later, status.trainerStatus
policy_status
           each CheckpointPolicy's status: whether the webhook applies it
metrics    the per-job Prometheus series, read from the controller's cache at scrape time
trim       what the informer caches keep of each object (pods: only the fields read)
controller the reconcile loop on the reconciler library's informers and manager
main       the `kubeckpt-reconciler` entry point
"""
