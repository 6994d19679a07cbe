#!/usr/bin/env bash
# The demo's scenario on a kind cluster, for users who have Docker (this project's machines have
# none: this script is checked with shellcheck only, see the README).
#
#   hack/kind-e2e.sh            create the cluster "kubeckpt-e2e", run the scenario, delete it
#   KEEP=1 hack/kind-e2e.sh     keep the cluster
#
# Needs: docker, kind, kubectl. It builds the same images as `make images` (from the same
# Dockerfiles, on python:3.11-slim), loads them into the kind node under the same names, installs
# the Kubeflow training-operator and kubeckpt from the same overlay (config/local), and runs the
# same PyTorchJob (hack/demo/pytorchjob.yaml): train, `kubectl drain` the job's pods, check that
# both ranks resume at exactly the just-in-time step and the job completes.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$here/versions.env"

CLUSTER=${CLUSTER:-kubeckpt-e2e}
NS=demo
JOB=tiny-mlp
STEPS=${STEPS:-160}
CTX="kind-$CLUSTER"

log() { printf '\n== %s\n' "$*"; }
die() { printf 'FAIL: %s\n' "$*" >&2; exit 1; }
k() { kubectl --context "$CTX" "$@"; }

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || die "$tool is needed (this script is for machines with Docker)"
done

cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT

log "kind cluster $CLUSTER"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 120s

log "images (the Dockerfiles make images uses, on python:3.11-slim)"
docker build -t kubeckpt.local/kubeckpt:local "$repo"
docker build -f "$repo/docker/runtime.Dockerfile" -t kubeckpt.local/kubeckpt-runtime:local "$repo"
docker build -f "$repo/docker/training.Dockerfile" -t kubeckpt.local/kubeckpt-training:local "$repo"
for image in kubeckpt kubeckpt-runtime kubeckpt-training; do
  kind load docker-image --name "$CLUSTER" "kubeckpt.local/$image:local"
done

log "the Kubeflow training-operator $TRAINING_OPERATOR_VERSION"
k apply --server-side -k \
  "github.com/kubeflow/training-operator.git/manifests/overlays/standalone?ref=$TRAINING_OPERATOR_VERSION"
k -n kubeflow rollout status deployment/training-operator --timeout=300s

log "kubeckpt from config/local"
k apply -k "$repo/config/local"
k -n kubeckpt-system rollout status deployment/kubeckpt-webhook --timeout=300s
k -n kubeckpt-system rollout status deployment/kubeckpt-reconciler --timeout=300s

log "an opted-in namespace with a policy, a claim, a Secret and the training script"
k create namespace "$NS" --dry-run=client -o yaml | k apply -f -
k label namespace "$NS" kubeckpt.io/inject=enabled --overwrite
k -n "$NS" create secret generic hf-token --from-literal=token=hf_demo_not_a_real_token \
  --dry-run=client -o yaml | k apply -f -
k -n "$NS" create configmap train --from-file=train.py="$here/demo/train.py" \
  --dry-run=client -o yaml | k apply -f -
# kind's default StorageClass (local-path) provisions the claim on the node.
k -n "$NS" apply -f - <<EOF
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: checkpoints}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: kubeckpt.io/v1alpha1
kind: CheckpointPolicy
metadata: {name: default}
spec:
  storage: {uri: pvc://checkpoints/runs, mountPath: /mnt/kubeckpt}
  strategy: steps
  saveSteps: $((STEPS / 4))
  maxCheckpoints: 3
  resume: true
  jit: {enabled: true, maxGracePeriodSeconds: 600}
  localTier: {enabled: false}
  progress: {updateEverySteps: 5}
EOF

log "the unchanged PyTorchJob"
sed -e "s/--steps=[0-9]* --step-seconds=[0-9.]*/--steps=$STEPS --step-seconds=0.1/" \
  "$here/demo/pytorchjob.yaml" | k -n "$NS" apply -f -
for pod in "$JOB-master-0" "$JOB-worker-0"; do
  k -n "$NS" wait --for=condition=Ready "pod/$pod" --timeout=600s
done

log "training: kubectl get tp"
for _ in $(seq 1 120); do
  step=$(k -n "$NS" get tp "$JOB" -o jsonpath='{.status.step}' 2>/dev/null || true)
  [ "${step:-0}" -ge $((STEPS / 2)) ] && break
  sleep 2
done
k -n "$NS" get tp
[ "${step:-0}" -ge $((STEPS / 2)) ] || die "the job did not reach step $((STEPS / 2))"

log "preemption: kubectl drain evicts the job's pods"
node=$(k -n "$NS" get pod "$JOB-master-0" -o jsonpath='{.spec.nodeName}')
k drain "$node" --pod-selector "training.kubeflow.org/job-name=$JOB" --delete-emptydir-data \
  --ignore-daemonsets --timeout=300s
k uncordon "$node"

log "the recreated pods resume at the just-in-time step"
resumed=()
for pod in "$JOB-master-0" "$JOB-worker-0"; do
  line=""
  for _ in $(seq 1 150); do
    line=$(k -n "$NS" logs "$pod" 2>/dev/null | grep -o 'resumed from checkpoint-[0-9]* at step [0-9]*' || true)
    [ -n "$line" ] && break
    sleep 2
  done
  [ -n "$line" ] || die "$pod did not resume"
  echo "$pod: $line"
  resumed+=("${line##* }")
done
[ "${resumed[0]}" = "${resumed[1]}" ] || die "the ranks resumed at different steps: ${resumed[*]}"

log "to the end"
k -n "$NS" wait --for=condition=Succeeded "pytorchjob/$JOB" --timeout=900s
k -n "$NS" get pytorchjob,tp
k -n "$NS" describe tp "$JOB"
echo
echo "PASS: kubeckpt on kind: both ranks resumed at step ${resumed[0]} and the job completed"
