# The controller image: kubeckpt-webhook and kubeckpt-reconciler (no torch).
# Build: docker build -t kubeckpt/kubeckpt:0.1.0 .   (config/default references this tag)
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY reconciler ./reconciler
COPY webhook ./webhook
COPY trainer_runtime ./trainer_runtime
RUN pip install --no-cache-dir --prefix=/install '.[controller]'

FROM python:3.11-slim
COPY --from=build /install /usr/local
# Non-root, as the manifests require (runAsNonRoot, readOnlyRootFilesystem).
USER 65532:65532
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
ENTRYPOINT ["kubeckpt-webhook"]
