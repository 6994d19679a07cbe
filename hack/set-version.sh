#!/usr/bin/env bash
# Set kubeckpt's version everywhere it is written: trainer_runtime.__version__ (the source that
# pyproject.toml and the webhook read), config/default's image tag and version label, and the
# image tags in the Dockerfiles' build comments. tests/unit/test_version.py checks they agree.
#   hack/set-version.sh 0.2.0
set -euo pipefail
cd "$(dirname "$0")/.."
new=${1:?usage: hack/set-version.sh X.Y.Z}
[[ $new =~ ^[0-9]+\.[0-9]+\.[0-9]+([.-][0-9A-Za-z.]+)?$ ]] || {
  echo "not a version: $new (expected X.Y.Z)" >&2
  exit 2
}
old=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' trainer_runtime/__init__.py)
[ -n "$old" ] || { echo "no __version__ in trainer_runtime/__init__.py" >&2; exit 1; }
sed -i "s/^__version__ = \"$old\"$/__version__ = \"$new\"/" trainer_runtime/__init__.py
sed -i "s/^\(    newTag: \)$old$/\1$new/; s/^\(      app.kubernetes.io\/version: \)$old$/\1$new/" \
  config/default/kustomization.yaml
sed -i "s/\(kubeckpt[a-z-]*\/[a-z-]*:\)$old /\1$new /" Dockerfile docker/*.Dockerfile
echo "kubeckpt $old -> $new"
