"""kubeckpt admission webhook: injects checkpoint and progress settings into training pods.

The AdmissionReview codec, the TLS serving and the certificate lifecycle are the reconciler
library's (reconciler.admission, reconciler.pki); the CheckpointPolicy model and its selection are
kubeckpt_api's. What is kubeckpt's alone is here: the server and its metrics (server), the pod
mutation (mutation), the informer-backed view of the cluster (view, informer_view), the
certificates' names (certs) and the process (main).
"""
