# The zero-code init container's image: trainer_runtime alone (standard library only), which the
# init container copies into the pod (`python -m trainer_runtime.zerocode.install DIR`).
#   docker build -f docker/runtime.Dockerfile -t kubeckpt/kubeckpt-runtime:0.1.0 .
ARG BASE=python:3.11-slim
FROM ${BASE}
COPY trainer_runtime /opt/kubeckpt-runtime/trainer_runtime
ENV PYTHONPATH=/opt/kubeckpt-runtime PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
