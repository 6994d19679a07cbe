# The init container the Kubeflow training-operator adds to PyTorchJob workers
# (`--pytorch-init-container-image`): `sh -c '... if nslookup <master>; then ...'` until the
# master's Service resolves. The operator's default (alpine) cannot be pulled by the local cluster.
#   docker build -f docker/pytorch-init.Dockerfile -t kubeckpt/pytorch-init:0.1.0 .
ARG BASE=python:3.11-slim
FROM ${BASE}
COPY --chmod=0755 docker/nslookup.py /usr/local/bin/nslookup
USER 65534:65534
