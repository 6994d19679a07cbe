#!/usr/bin/env bash
# Render the one-file install manifest of this version: dist/kubeckpt-<version>.yaml, config/default
# with the controller image (and the zero-code init image, which is the same) set to
# $IMAGE:<version>. `kubectl apply --server-side -f dist/kubeckpt-<version>.yaml` installs it.
#   IMAGE=registry.example.com/ml/kubeckpt hack/release.sh
set -euo pipefail
cd "$(dirname "$0")/.."
image=${IMAGE:-kubeckpt/kubeckpt}
version=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' trainer_runtime/__init__.py)
[ -n "$version" ] || { echo "no __version__ in trainer_runtime/__init__.py" >&2; exit 1; }
# kubectl kustomize from the binaries the tests use (built or found by hack/build-binaries.sh).
env_file=${KUBECKPT_BINARIES_ENV:-$(bash hack/build-binaries.sh | tail -n 1)}
# shellcheck disable=SC1090
source "$env_file"
overlay=$(mktemp -d)
trap 'rm -rf "$overlay"' EXIT
cp -r config "$overlay/config"
mkdir -p "$overlay/release"
cat >"$overlay/release/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../config/default
images:
  - name: kubeckpt/kubeckpt
    newName: ${image}
    newTag: "${version}"
# config/default copied the image into the zero-code env var before this overlay's images ran.
replacements:
  - source:
      kind: Deployment
      name: kubeckpt-webhook
      fieldPath: spec.template.spec.containers.[name=webhook].image
    targets:
      - select:
          kind: Deployment
          name: kubeckpt-webhook
        fieldPaths:
          - spec.template.spec.containers.[name=webhook].env.[name=KUBECKPT_RUNTIME_IMAGE].value
YAML
dist=${DIST:-dist}
mkdir -p "$dist"
out="$dist/kubeckpt-${version}.yaml"
{
  echo "# kubeckpt ${version}: kubectl apply --server-side -f kubeckpt-${version}.yaml"
  echo "# image ${image}:${version}; rendered from config/default by hack/release.sh"
  "$KUBECKPT_KUBECTL" kustomize "$overlay/release"
} >"$out"
echo "$out"
