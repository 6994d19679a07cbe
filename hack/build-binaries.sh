#!/usr/bin/env bash
# Builds the real Kubernetes components the tests and the demo run as local processes, from their Go
# modules at the versions pinned in hack/versions.env, and caches them under ~/.cache/kubeckpt/
# (override with KUBECKPT_CACHE). A second run finds every binary in the cache and returns at once.
#
# Prints, as its last line, the path of an env file that names every binary built (read by
# hack/localcluster/binaries.py). Usage: hack/build-binaries.sh [--for demo|demo-kueue|all] (default all)
# or hack/build-binaries.sh --only STEP[,STEP...] (those steps alone, e.g. --only seaweedfs; the env
# file is rewritten and names every complete build, as after a full run).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$here/versions.env"
# shellcheck source-path=SCRIPTDIR source=apt.sh
source "$here/apt.sh"

CACHE=${KUBECKPT_CACHE:-$HOME/.cache/kubeckpt}
mkdir -p "$CACHE"
# No DWARF from the compiler: every link here strips it (-w) anyway, and generating it cost 8 % of
# a cold compile (kube-scheduler from an empty build cache: 354 s of user CPU against 385 s).
export GOFLAGS="-buildvcs=false -trimpath -gcflags=all=-dwarf=false"
# The compiler and linker collect garbage less often: kube-scheduler from an empty build cache took
# 136 s wall and 208 s of user CPU at GOGC=400 against 152 to 166 s and 249 to 269 s at the
# default 100, with the largest process 1.1 GB either way (docs/benchmarks.md). A GOGC already
# set is kept.
export GOGC=${GOGC:-400}
export GOTOOLCHAIN=local
export CGO_ENABLED=0

log() { printf '[build-binaries] %s\n' "$*" >&2; }
die() { printf '[build-binaries] error: %s\n' "$*" >&2; exit 1; }

version_ge() { # $1 >= $2, both dotted
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

# --- Go toolchain -------------------------------------------------------------------------------
ensure_go() {
  local have=""
  if command -v go >/dev/null 2>&1; then
    have=$(go env GOVERSION 2>/dev/null | sed 's/^go//')
  fi
  if [ -n "$have" ] && version_ge "$have" "$GO_MIN_VERSION"; then
    GO=$(command -v go)
    return
  fi
  local dir="$CACHE/go-$GO_TOOLCHAIN_VERSION"
  if [ ! -x "$dir/bin/go" ]; then
    if ! command -v curl >/dev/null || ! command -v unzip >/dev/null; then
      apt_install build-binaries curl unzip ca-certificates || true
    fi
    command -v curl >/dev/null || die "curl is needed to fetch Go $GO_TOOLCHAIN_VERSION: apt-get install -y curl"
    command -v unzip >/dev/null || die "unzip is needed to unpack Go $GO_TOOLCHAIN_VERSION: apt-get install -y unzip"
    local proxy=${GOPROXY:-https://proxy.golang.org}
    proxy=${proxy%%,*}
    [ "$proxy" = direct ] || [ "$proxy" = off ] && proxy=https://proxy.golang.org
    local url="$proxy/golang.org/toolchain/@v/v0.0.1-go$GO_TOOLCHAIN_VERSION.linux-amd64.zip"
    log "Go >= $GO_MIN_VERSION not found (have: ${have:-none}); fetching the toolchain from $url"
    local tmp
    tmp=$(mktemp -d)
    curl -fsSL -o "$tmp/go.zip" "$url" || die "could not download the Go toolchain from $url"
    unzip -q "$tmp/go.zip" -d "$tmp/x"
    # The module zip holds golang.org/toolchain@<version>/... ; its contents are a GOROOT.
    mkdir -p "$dir"
    cp -a "$tmp"/x/golang.org/toolchain@*/. "$dir/"
    chmod +x "$dir"/bin/* "$dir"/pkg/tool/*/* 2>/dev/null || true
    rm -rf "$tmp"
  fi
  GO="$dir/bin/go"
  export PATH="$dir/bin:$PATH"
}

# --- one cached build -----------------------------------------------------------------------------
# A build is done once its directory holds a .complete stamp; a half-built directory is rebuilt.
done_stamp() { [ -f "$1/.complete" ]; }

# Where the module cache holds a module's source (downloading it if needed).
module_dir() {
  "$GO" mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'
}

# A wrapper module around k8s.io/kubernetes: the staging modules it replaces with local paths are
# replaced with their published versions (the documented "use k8s.io/kubernetes as a library"
# pattern). $1: the module directory; the rest: packages to import (so `go mod tidy` keeps them).
k8s_wrapper_module() {
  local mod=$1; shift
  local staging="v0.${K8S_VERSION#v1.}"
  rm -rf "$mod"
  mkdir -p "$mod"
  local gomod
  gomod=$(cd "$mod" && "$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy"
  gomod=$(cat "$gomod")
  {
    echo "module kubeckpt.local/kubernetes-build"
    echo
    echo "go $GO_MIN_VERSION"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    printf '%s\n' "$gomod" | sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p'
    echo ")"
  } >"$mod/go.mod"
  {
    printf '//go:build tools\n\npackage tools\n\nimport (\n'
    printf '\t_ "%s"\n' "$@"
    printf ')\n'
  } >"$mod/tools.go"
  (cd "$mod" && "$GO" mod tidy >&2)
}

k8s_ldflags() {
  local major=${K8S_VERSION#v}; major=${major%%.*}
  local minor=${K8S_VERSION#v*.}; minor=${minor%%.*}
  local ldflags="-s -w"
  ldflags+=" -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=$major"
  ldflags+=" -X k8s.io/component-base/version.gitMinor=$minor"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$K8S_VERSION"
  printf '%s' "$ldflags"
}

build_kubernetes() {
  local out="$CACHE/kubernetes-$K8S_VERSION"
  done_stamp "$out" && return
  log "building kube-apiserver, kube-controller-manager, kube-scheduler $K8S_VERSION (cold: several minutes)"
  local mod="$CACHE/src/kubernetes-$K8S_VERSION"
  rm -rf "$out"
  mkdir -p "$out"
  k8s_wrapper_module "$mod" k8s.io/kubernetes/cmd/kube-apiserver/app \
    k8s.io/kubernetes/cmd/kube-controller-manager/app k8s.io/kubernetes/cmd/kube-scheduler/app \
    k8s.io/kubectl/pkg/cmd
  (
    cd "$mod"
    local pkgs=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
      k8s.io/kubernetes/cmd/kube-scheduler)
    [ "${BUILD_KUBECTL:-0}" = 1 ] && pkgs+=(k8s.io/kubernetes/cmd/kubectl)
    "$GO" build -mod=mod -ldflags "$(k8s_ldflags)" -o "$out/" "${pkgs[@]}" >&2
  )
  touch "$out/.complete"
}

# The real node: kubelet and kube-proxy from the same Kubernetes version as the control plane.
build_kubernetes_node() {
  local out="$CACHE/kubernetes-node-$K8S_VERSION"
  done_stamp "$out" && return
  log "building kubelet, kube-proxy $K8S_VERSION"
  local mod="$CACHE/src/kubernetes-node-$K8S_VERSION"
  rm -rf "$out"
  mkdir -p "$out"
  k8s_wrapper_module "$mod" k8s.io/kubernetes/cmd/kubelet/app k8s.io/kubernetes/cmd/kube-proxy/app
  (cd "$mod" && "$GO" build -mod=mod -ldflags "$(k8s_ldflags)" -o "$out/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy >&2)
  touch "$out/.complete"
}

# Cluster DNS for the real node's pods (the training-operator's MASTER_ADDR is a Service name).
# CoreDNS documents two ways to choose its plugins at compile time: plugin.cfg with `go generate`,
# or a main of one's own that imports coremain and the plugins wanted. We do the second, with only
# the plugins the local cluster's Corefile names (hack/localcluster/node.py): the stock build
# compiles every plugin, and the cloud ones (Azure, AWS, DataDog, etcd, QUIC...) were most of its
# compile time. The server itself (coremain, dnsserver) is CoreDNS's own, at the pinned version.
COREDNS_PLUGINS=(bind errors ready kubernetes cache loop)
# Its cache directory names the plugin set too: a build with other plugins is another build.
COREDNS_DIR="coredns-$COREDNS_VERSION-$(printf '%s\n' "${COREDNS_PLUGINS[@]}" | sha256sum | cut -c1-8)"
build_coredns() {
  local out="$CACHE/$COREDNS_DIR"
  done_stamp "$out" && return
  log "building CoreDNS $COREDNS_VERSION (plugins: ${COREDNS_PLUGINS[*]})"
  local mod="$CACHE/src/coredns-$COREDNS_VERSION"
  rm -rf "$mod" "$out"
  mkdir -p "$mod" "$out"
  cat >"$mod/go.mod" <<EOF
module kubeckpt.local/coredns-build

go $GO_MIN_VERSION

require github.com/coredns/coredns $COREDNS_VERSION
EOF
  {
    printf 'package main\n\nimport (\n\t"github.com/coredns/coredns/coremain"\n\n'
    printf '\t_ "github.com/coredns/coredns/plugin/%s"\n' "${COREDNS_PLUGINS[@]}"
    printf ')\n\nfunc main() { coremain.Run() }\n'
  } >"$mod/main.go"
  (
    cd "$mod"
    "$GO" mod tidy >&2
    "$GO" build -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION" \
      -o "$out/coredns" . >&2
  )
  # (-plugins prints one name a line; no -q: grep reads it all, so no SIGPIPE under pipefail.)
  "$out/coredns" -plugins | grep -x kubernetes >/dev/null || die "the CoreDNS build has no kubernetes plugin"
  touch "$out/.complete"
}

# The monitoring test's Prometheus. Build tags leave out every service discovery but Kubernetes'
# (the cloud SDKs are most of its compile time); the web UI's assets are not embedded (the test
# uses the HTTP API only).
build_prometheus() {
  local out="$CACHE/prometheus-$PROMETHEUS_VERSION"
  done_stamp "$out" && return
  log "building Prometheus ($PROMETHEUS_VERSION)"
  rm -rf "$out"
  mkdir -p "$out"
  GOBIN="$out" "$GO" install -tags remove_all_sd,enable_kubernetes_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=$PROMETHEUS_VERSION" \
    "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" >&2
  touch "$out/.complete"
}

# What the real node runs from Debian's packages: containerd (with ctr), runc, the CNI plugins,
# iptables and conntrack for kube-proxy. Installed when missing and we are root.
NODE_PACKAGES=(containerd runc containernetworking-plugins iptables conntrack)
NODE_COMMANDS=(containerd ctr runc /usr/lib/cni/bridge iptables conntrack)
ensure_node_packages() {
  local missing=0 c
  for c in "${NODE_COMMANDS[@]}"; do
    command -v "$c" >/dev/null 2>&1 || [ -x "$c" ] || missing=1
  done
  [ "$missing" = 0 ] && return
  apt_install build-binaries "${NODE_PACKAGES[@]}" || log "only KWOK nodes can start here"
}

# What the tests need beyond Python and the binaries: tmux, the real terminal in which
# tests/integration/cli drives `kubeckpt status --watch` and reads its screen back.
ensure_test_packages() {
  command -v tmux >/dev/null 2>&1 && return
  apt_install build-binaries tmux || log "the CLI's live-view test will fail: it needs tmux"
}

build_etcd() {
  local out="$CACHE/etcd-$ETCD_VERSION"
  done_stamp "$out" && return
  log "building etcd $ETCD_VERSION"
  local mod="$CACHE/src/etcd-$ETCD_VERSION"
  rm -rf "$mod" "$out"
  mkdir -p "$mod" "$out"
  # The etcd repository's root module uses local replaces and cannot be installed with go install;
  # a two-line wrapper around etcdmain builds the same server from the published server module.
  cat >"$mod/go.mod" <<EOF
module kubeckpt.local/etcd-build

go $GO_MIN_VERSION

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
EOF
  cat >"$mod/main.go" <<'EOF'
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
EOF
  (
    cd "$mod"
    "$GO" mod tidy >&2
    "$GO" build -ldflags "-s -w" -o "$out/etcd" . >&2
  )
  touch "$out/.complete"
}

build_kwok() {
  local out="$CACHE/kwok-$KWOK_VERSION"
  done_stamp "$out" && return
  log "building kwok $KWOK_VERSION"
  rm -rf "$out"
  mkdir -p "$out"
  GOBIN="$out" "$GO" install -ldflags "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" \
    "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" >&2
  # KWOK's own CRDs (Exec, ClusterExec: the tests map each pod's exec to a directory) and its stock
  # lifecycle stages (fast node and pod stages: pods become Running without a random delay).
  local src
  src=$(module_dir "sigs.k8s.io/kwok@$KWOK_VERSION")
  mkdir -p "$out/crds" "$out/stages"
  cp "$src"/kustomize/crd/bases/kwok.x-k8s.io_{execs,clusterexecs,logs,clusterlogs}.yaml "$out/crds/"
  cp "$src"/kustomize/stage/node/fast/node-initialize.yaml \
    "$src"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    "$src"/kustomize/stage/pod/fast/pod-{ready,complete,delete}.yaml "$out/stages/"
  chmod -R u+w "$out"
  touch "$out/.complete"
}

build_training_operator() {
  local out="$CACHE/training-operator-$TRAINING_OPERATOR_VERSION"
  done_stamp "$out" && return
  log "building the Kubeflow training-operator $TRAINING_OPERATOR_VERSION"
  rm -rf "$out"
  mkdir -p "$out/crds" "$out/webhook"
  GOBIN="$out" "$GO" install -ldflags "-s -w" \
    "github.com/kubeflow/training-operator/cmd/training-operator.v1@$TRAINING_OPERATOR_VERSION" >&2
  # The CRDs and the webhook configuration ship in the same module.
  local src
  src=$(module_dir "github.com/kubeflow/training-operator@$TRAINING_OPERATOR_VERSION")
  [ -d "$src/manifests/base/crds" ] || die "no CRDs found in $src/manifests/base/crds"
  cp "$src"/manifests/base/crds/*.yaml "$out/crds/"
  rm -f "$out/crds/kustomization.yaml"
  cp "$src"/manifests/base/webhook/manifests.yaml "$out/webhook/" 2>/dev/null || true
  chmod -R u+w "$out"
  touch "$out/.complete"
}

# Kubeflow Trainer v2 and JobSet: each built inside its own module (its go.mod and go.sum, as
# upstream builds it; `go install mod@version` of JobSet's root package needs the module's version
# list, which the proxy may refuse). Their CRDs, webhook manifests (rendered at cluster start with
# kubectl kustomize) and Trainer's torch-distributed ClusterTrainingRuntime ship in the same modules.
build_in_module() { # $1: module@version, $2: package (relative), $3: output file
  local src work
  src=$(module_dir "$1")
  [ -d "$src" ] || die "could not download $1 from the Go module proxy"
  work=$(mktemp -d)
  cp -a "$src/." "$work/"
  chmod -R u+w "$work"
  (cd "$work" && "$GO" build -mod=readonly -ldflags "-s -w" -o "$3" "$2" >&2)
  rm -rf "$work"
}

build_jobset() {
  local out="$CACHE/jobset-$JOBSET_VERSION"
  done_stamp "$out" && return
  log "building the JobSet controller $JOBSET_VERSION"
  rm -rf "$out"
  mkdir -p "$out/crds"
  build_in_module "sigs.k8s.io/jobset@$JOBSET_VERSION" . "$out/jobset-controller"
  local src
  src=$(module_dir "sigs.k8s.io/jobset@$JOBSET_VERSION")
  cp "$src"/config/components/crd/bases/*.yaml "$out/crds/"
  cp -r "$src/config/components/webhook" "$out/webhook"
  chmod -R u+w "$out"
  touch "$out/.complete"
}

build_trainer() {
  local out="$CACHE/trainer-$TRAINER_VERSION"
  done_stamp "$out" && return
  log "building the Kubeflow Trainer controller manager $TRAINER_VERSION"
  rm -rf "$out"
  mkdir -p "$out/crds" "$out/runtimes"
  build_in_module "github.com/kubeflow/trainer/v2@$TRAINER_VERSION" ./cmd/trainer-controller-manager \
    "$out/trainer-controller-manager"
  local src
  src=$(module_dir "github.com/kubeflow/trainer/v2@$TRAINER_VERSION")
  cp "$src"/manifests/base/crds/trainer.kubeflow.org_*.yaml "$out/crds/"
  cp -r "$src/manifests/base/webhook" "$out/webhook"
  cp "$src/manifests/base/runtimes/torch_distributed.yaml" "$out/runtimes/"
  chmod -R u+w "$out"
  touch "$out/.complete"
}

# Kueue: its manager, the CRDs (the bases, without the conversion webhook patches: the local
# cluster serves the storage version v1beta2 that the manager and kubeckpt use), the webhook
# manifests (rendered at cluster start) and the default manager configuration, as reference.
build_kueue() {
  local out="$CACHE/kueue-$KUEUE_VERSION"
  done_stamp "$out" && return
  log "building the Kueue manager $KUEUE_VERSION"
  rm -rf "$out"
  mkdir -p "$out/crds" "$out/manager"
  build_in_module "sigs.k8s.io/kueue@$KUEUE_VERSION" ./cmd/kueue "$out/kueue"
  local src
  src=$(module_dir "sigs.k8s.io/kueue@$KUEUE_VERSION")
  cp "$src"/config/components/crd/bases/kueue.x-k8s.io_*.yaml "$out/crds/"
  cp -r "$src/config/components/webhook" "$out/webhook"
  cp "$src/config/components/manager/controller_manager_config.yaml" "$out/manager/"
  chmod -R u+w "$out"
  touch "$out/.complete"
}

# SeaweedFS's `weed` (the S3 tests' server, tests/support/seaweedfs.py): built inside its module, as
# upstream builds it (its go.mod replaces a module, which `go install mod@version` refuses).
build_seaweedfs() {
  local out="$CACHE/seaweedfs-$SEAWEEDFS_VERSION"
  done_stamp "$out" && return
  log "building SeaweedFS (weed) $SEAWEEDFS_VERSION (cold: about 6 minutes on 2 cores)"
  rm -rf "$out"
  mkdir -p "$out"
  build_in_module "github.com/seaweedfs/seaweedfs@$SEAWEEDFS_VERSION" ./weed "$out/weed"
  touch "$out/.complete"
}

find_kubectl() {
  # The machine's kubectl when it is within one minor version of the server (the supported skew),
  # else one built from the same Kubernetes module.
  local want=${K8S_VERSION#v1.}; want=${want%%.*}
  if command -v kubectl >/dev/null 2>&1; then
    local minor
    minor=$(kubectl version --client -o json 2>/dev/null | sed -n 's/.*"minor": "\([0-9]*\).*/\1/p' | head -n1)
    if [ -n "$minor" ] && [ $((minor - want)) -le 1 ] && [ $((want - minor)) -le 1 ]; then
      KUBECTL=$(command -v kubectl)
      return
    fi
  fi
  local out="$CACHE/kubectl-$K8S_VERSION"
  if ! done_stamp "$out"; then
    log "no kubectl within one minor version of $K8S_VERSION on PATH; building it"
    BUILD_KUBECTL=1 build_kubernetes_kubectl "$out"
  fi
  KUBECTL="$out/kubectl"
}

build_kubernetes_kubectl() {
  local out=$1
  build_kubernetes
  local mod="$CACHE/src/kubernetes-$K8S_VERSION"
  mkdir -p "$out"
  (cd "$mod" && "$GO" build -mod=mod -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION" \
    -o "$out/kubectl" k8s.io/kubernetes/cmd/kubectl >&2)
  touch "$out/.complete"
}

# What each purpose builds. demo: what `make demo` starts (the control plane, the
# training-operator, the real node: about half the cold build; the demo's cluster has no KWOK
# node, so no KWOK); demo-kueue: that and Kueue (`make demo DEMO_ARGS=--kueue`). all: everything
# the tests start (KWOK, Kubeflow Trainer and JobSet, Kueue, Prometheus, SeaweedFS, tmux).
# Three lanes run at once: the Kubernetes builds (the longest), the other Go builds, the Debian
# packages. Go's module and build caches are safe to share between concurrent builds; the overlap
# hides downloads behind compiling, which a 2-core machine otherwise waits for.
LANE_K8S=(kubernetes kubernetes_node kubectl)
# SeaweedFS goes after the Kubernetes builds: that lane is the shorter one in a cold `--for all`.
LANE_K8S_ALL=(seaweedfs)
LANE_GO_DEMO=(etcd training_operator coredns)
LANE_GO_ALL=(kwok jobset trainer kueue prometheus)
LANE_APT_DEMO=(node_packages)
LANE_APT_ALL=(test_packages)

# Whether a step has nothing to do, for the plan line (each build checks again by itself).
cached() {
  case $1 in
    kubernetes) done_stamp "$CACHE/kubernetes-$K8S_VERSION" ;;
    kubernetes_node) done_stamp "$CACHE/kubernetes-node-$K8S_VERSION" ;;
    kubectl) command -v kubectl >/dev/null 2>&1 || done_stamp "$CACHE/kubectl-$K8S_VERSION" ;;
    etcd) done_stamp "$CACHE/etcd-$ETCD_VERSION" ;;
    kwok) done_stamp "$CACHE/kwok-$KWOK_VERSION" ;;
    training_operator) done_stamp "$CACHE/training-operator-$TRAINING_OPERATOR_VERSION" ;;
    coredns) done_stamp "$CACHE/$COREDNS_DIR" ;;
    jobset) done_stamp "$CACHE/jobset-$JOBSET_VERSION" ;;
    trainer) done_stamp "$CACHE/trainer-$TRAINER_VERSION" ;;
    kueue) done_stamp "$CACHE/kueue-$KUEUE_VERSION" ;;
    prometheus) done_stamp "$CACHE/prometheus-$PROMETHEUS_VERSION" ;;
    seaweedfs) done_stamp "$CACHE/seaweedfs-$SEAWEEDFS_VERSION" ;;
    node_packages) command -v containerd >/dev/null 2>&1 && command -v runc >/dev/null 2>&1 ;;
    test_packages) command -v tmux >/dev/null 2>&1 ;;
    *) return 1 ;;
  esac
}

plan_of() { # the steps of a lane that have work to do, comma-separated
  local s todo=()
  for s in "$@"; do cached "$s" || todo+=("$s"); done
  (IFS=,; echo "${todo[*]}")
}

# One step: its function, announced with a start and an end line that hack/prepare.py follows.
step() {
  local name=$1 t0=$SECONDS
  log "step $name: start"
  if [ "$name" = kubectl ]; then
    find_kubectl
  elif declare -F "build_$name" >/dev/null; then
    "build_$name"
  else
    "ensure_$name"
  fi
  log "step $name: done in $((SECONDS - t0)) s"
}

# A lane runs its steps in order in a subshell of its own, started in the background: errexit
# stays in force there (it would not inside `if` or `||`), so a failed command ends the lane, and
# the EXIT trap names the step that failed.
lane() (
  current=""
  trap '[ $? = 0 ] || log "step ${current:-?}: FAILED"' EXIT
  for current in "$@"; do
    step "$current"
  done
)

# The env file names every binary that is complete in the cache (a demo build names fewer; a test
# that needs one it lacks gets MissingBinaries saying to rerun this script without --for demo).
env_line() { # $1: key, $2: path, $3: the build directory whose .complete stamp vouches for it
  done_stamp "$3" && echo "$1=$2"
  return 0
}

write_env() {
  local k="$CACHE/kubernetes-$K8S_VERSION" n="$CACHE/kubernetes-node-$K8S_VERSION"
  local e="$CACHE/etcd-$ETCD_VERSION" w="$CACHE/kwok-$KWOK_VERSION"
  local o="$CACHE/training-operator-$TRAINING_OPERATOR_VERSION" j="$CACHE/jobset-$JOBSET_VERSION"
  local t="$CACHE/trainer-$TRAINER_VERSION" q="$CACHE/kueue-$KUEUE_VERSION"
  local c="$CACHE/$COREDNS_DIR" p="$CACHE/prometheus-$PROMETHEUS_VERSION"
  local s="$CACHE/seaweedfs-$SEAWEEDFS_VERSION"
  env_line KUBECKPT_ETCD "$e/etcd" "$e"
  env_line KUBECKPT_KUBE_APISERVER "$k/kube-apiserver" "$k"
  env_line KUBECKPT_KUBE_CONTROLLER_MANAGER "$k/kube-controller-manager" "$k"
  env_line KUBECKPT_KUBE_SCHEDULER "$k/kube-scheduler" "$k"
  env_line KUBECKPT_KWOK "$w/kwok" "$w"
  env_line KUBECKPT_KWOK_CRDS "$w/crds" "$w"
  env_line KUBECKPT_KWOK_STAGES "$w/stages" "$w"
  env_line KUBECKPT_TRAINING_OPERATOR "$o/training-operator.v1" "$o"
  env_line KUBECKPT_TRAINING_OPERATOR_CRDS "$o/crds" "$o"
  env_line KUBECKPT_JOBSET "$j/jobset-controller" "$j"
  env_line KUBECKPT_JOBSET_MANIFESTS "$j" "$j"
  env_line KUBECKPT_TRAINER "$t/trainer-controller-manager" "$t"
  env_line KUBECKPT_TRAINER_MANIFESTS "$t" "$t"
  env_line KUBECKPT_KUEUE "$q/kueue" "$q"
  env_line KUBECKPT_KUEUE_MANIFESTS "$q" "$q"
  if [ -n "$KUBECTL" ]; then
    echo "KUBECKPT_KUBECTL=$KUBECTL"
  fi
  env_line KUBECKPT_KUBELET "$n/kubelet" "$n"
  env_line KUBECKPT_KUBE_PROXY "$n/kube-proxy" "$n"
  env_line KUBECKPT_COREDNS "$c/coredns" "$c"
  env_line KUBECKPT_PROMETHEUS "$p/prometheus" "$p"
  env_line KUBECKPT_SEAWEEDFS "$s/weed" "$s"
}

main() {
  local purpose=all only=""
  while [ $# -gt 0 ]; do
    case $1 in
      --for) purpose=${2:-}; shift 2 ;;
      --for=*) purpose=${1#--for=}; shift ;;
      --only) only=${2:-}; shift 2 ;;
      --only=*) only=${1#--only=}; shift ;;
      --print-env) shift ;;
      *) die "unknown argument $1 (usage: build-binaries.sh [--for demo|demo-kueue|all] [--only STEP,...])" ;;
    esac
  done
  local k8s_steps=("${LANE_K8S[@]}") go_steps=("${LANE_GO_DEMO[@]}") apt_steps=("${LANE_APT_DEMO[@]}")
  case $purpose in
    demo) ;;
    demo-kueue) go_steps+=(kueue) ;;
    all)
      k8s_steps+=("${LANE_K8S_ALL[@]}")
      go_steps+=("${LANE_GO_ALL[@]}")
      apt_steps+=("${LANE_APT_ALL[@]}")
      ;;
    *) die "--for takes demo, demo-kueue or all, not '$purpose'" ;;
  esac
  if [ -n "$only" ]; then # one lane with just the named steps (a single optional build)
    local s
    IFS=, read -r -a k8s_steps <<<"$only"
    for s in "${k8s_steps[@]}"; do
      declare -F "build_$s" >/dev/null || declare -F "ensure_$s" >/dev/null ||
        die "--only: no step named '$s'"
    done
    go_steps=() apt_steps=()
    purpose="--only $only"
  fi
  # One build at a time per cache (a test run and the demo may start together).
  exec 9>"$CACHE/.build.lock"
  if command -v flock >/dev/null 2>&1; then
    flock 9
  fi
  ensure_go
  local start=$SECONDS pids=() failed=0 pid
  log "plan: k8s=$(plan_of "${k8s_steps[@]}") go=$(plan_of "${go_steps[@]}") apt=$(plan_of "${apt_steps[@]}")"
  # The Kubernetes lane is the longest: the others run niced, so that they take the CPU it
  # leaves idle (links, downloads) rather than slow it down.
  lane "${k8s_steps[@]}" & pids+=($!)
  lane "${go_steps[@]}" & pids+=($!)
  renice -n 10 -p "$!" >/dev/null 2>&1 || true
  lane "${apt_steps[@]}" & pids+=($!)
  for pid in "${pids[@]}"; do
    wait "$pid" || failed=1
  done
  [ "$failed" = 0 ] || die "a build failed: the step marked FAILED above says which"
  # --only builds no kubectl for the env file (the S3 tests need none): one found is named.
  if [ -z "$only" ] || cached kubectl; then
    find_kubectl
  else
    KUBECTL=""
  fi
  local envfile="$CACHE/binaries-$K8S_VERSION-$ETCD_VERSION-$KWOK_VERSION-$TRAINING_OPERATOR_VERSION-$COREDNS_VERSION-$JOBSET_VERSION-$TRAINER_VERSION-$PROMETHEUS_VERSION-$KUEUE_VERSION-$SEAWEEDFS_VERSION.env"
  write_env >"$envfile.tmp"
  mv "$envfile.tmp" "$envfile"
  log "binaries for $purpose ready in $((SECONDS - start)) s"
  echo "$envfile"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
