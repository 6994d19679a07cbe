#!/usr/bin/env bash
# Builds kubeckpt's container images without a Docker daemon, for the local cluster's real node:
#   base        kubeckpt.local/debian-python:bookworm   Debian from its packages (debootstrap)
#   pause       kubeckpt.local/pause:3.10               the pod sandbox (hack/images/pause.c)
#   init        kubeckpt.local/pytorch-init:local       docker/pytorch-init.Dockerfile: the init
#                                                       container the training-operator adds to workers
#   controller  kubeckpt.local/kubeckpt:local           Dockerfile (webhook and reconciler)
#   runtime     kubeckpt.local/kubeckpt-runtime:local   docker/runtime.Dockerfile (zero-code init,
#                                                       the lister pod: with fsspec/s3fs)
#   training    kubeckpt.local/kubeckpt-training:local  docker/training.Dockerfile (CPU torch, HF)
# The Dockerfiles are built with buildah (chroot isolation, layer cache) on the base made here.
# Each image is saved as a docker-archive under ~/.cache/kubeckpt/images/ (KUBECKPT_CACHE), named
# by a hash of its inputs: nothing changed, nothing is rebuilt (a second run takes a second).
#
# Usage: hack/images/build.sh [--no-build] [NAME...]   (default: all)
# Prints, for each image asked for, "<image> <archive>" on stdout; logs go to stderr.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
# shellcheck source-path=SCRIPTDIR source=versions.env
source "$here/versions.env"
# shellcheck source-path=SCRIPTDIR source=../apt.sh
source "$here/../apt.sh"

CACHE=${KUBECKPT_CACHE:-$HOME/.cache/kubeckpt}
OUT="$CACHE/images"
STORE="$CACHE/buildah"
mkdir -p "$OUT" "$STORE"

declare -A IMAGE=(
  [base]="kubeckpt.local/debian-python:$DEBIAN_SUITE"
  [pause]="kubeckpt.local/pause:$PAUSE_TAG"
  [init]="kubeckpt.local/pytorch-init:local"
  [controller]="kubeckpt.local/kubeckpt:local"
  [runtime]="kubeckpt.local/kubeckpt-runtime:local"
  [training]="kubeckpt.local/kubeckpt-training:local"
)
ORDER=(base pause init controller runtime training)
BASE_RECIPE=1

log() { printf '[images] %s\n' "$*" >&2; }
die() { printf '[images] error: %s\n' "$*" >&2; exit 1; }

# --- inputs and cache keys ---------------------------------------------------------------------
# Hash of files and directory trees (contents and relative paths), relative to the repository.
hash_inputs() {
  (
    cd "$repo"
    for p in "$@"; do
      if [ -d "$p" ]; then
        find "$p" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | sort -z |
          xargs -0 sha256sum
      else
        sha256sum "$p"
      fi
    done
  ) | sha256sum | cut -c1-16
}

declare -A KEY
compute_keys() {
  # The base's recipe is build_base below: bump BASE_RECIPE when it changes (hashing this whole
  # script would rebuild every image for any edit of it).
  KEY[base]=$(printf '%s %s' "$BASE_RECIPE" "$(hash_inputs hack/images/versions.env)" |
    sha256sum | cut -c1-16)
  KEY[pause]=$(hash_inputs hack/images/pause.c hack/images/versions.env)
  local b=${KEY[base]}
  KEY[controller]=$(printf '%s %s' "$b" "$(hash_inputs Dockerfile .dockerignore pyproject.toml \
    docker/runtime-requirements.txt kubeckpt_api progress_controller reconciler webhook \
    trainer_runtime kubeckpt_cli)" | sha256sum | cut -c1-16)
  KEY[init]=$(printf '%s %s' "$b" "$(hash_inputs docker/pytorch-init.Dockerfile docker/nslookup.py)" |
    sha256sum | cut -c1-16)
  KEY[runtime]=$(printf '%s %s' "$b" "$(hash_inputs docker/runtime.Dockerfile \
    docker/runtime-requirements.txt trainer_runtime)" |
    sha256sum | cut -c1-16)
  # The training image's dependencies (its Dockerfile's `deps` stage), a tagged image of the
  # store rather than an archive: nothing runs it, and the training build starts from it.
  KEY[training_deps]=$(printf '%s %s' "$b" "$(hash_inputs docker/training.Dockerfile \
    docker/training-requirements.lock docker/prune_cuda.py)" | sha256sum | cut -c1-16)
  KEY[training]=$(printf '%s %s' "${KEY[training_deps]}" "$(hash_inputs docker/training.Dockerfile \
    pyproject.toml trainer_runtime)" | sha256sum | cut -c1-16)
}
DEPS_REPO=kubeckpt.local/kubeckpt-training-deps

archive() { printf '%s/%s-%s.tar' "$OUT" "$1" "${KEY[$1]}"; }

# --- tools -----------------------------------------------------------------------------------------
ensure_tools() {
  local missing=()
  command -v buildah >/dev/null || missing+=(buildah)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v gcc >/dev/null || missing+=(gcc)
  [ -f /usr/lib/x86_64-linux-gnu/libc.a ] || missing+=(libc6-dev)
  [ ${#missing[@]} = 0 ] && return
  apt_install images "${missing[@]}" || exit 1
}

bah() {
  buildah --root "$STORE/storage" --runroot "$RUNROOT" --storage-driver "$DRIVER" "$@"
}

setup_buildah() {
  [ "$(id -u)" = 0 ] || die "building images needs root (buildah's chroot isolation, debootstrap)"
  RUNROOT=$(mktemp -d "${TMPDIR:-/tmp}/kubeckpt-buildah-run.XXXXXX")
  WORK=$(mktemp -d "$CACHE/images/.work.XXXXXX")
  trap 'rm -rf "$RUNROOT" "$WORK"' EXIT
  # overlay where the kernel has it (fast), vfs otherwise; the store remembers its driver.
  DRIVER=${KUBECKPT_BUILDAH_DRIVER:-}
  if [ -z "$DRIVER" ]; then
    if [ -f "$STORE/driver" ]; then
      DRIVER=$(cat "$STORE/driver")
    elif grep -qw overlay /proc/filesystems; then
      DRIVER=overlay
    else
      DRIVER=vfs
    fi
  fi
  echo "$DRIVER" >"$STORE/driver"
  # Working containers of an interrupted build (we hold the lock: no other build runs).
  bah rm --all >/dev/null 2>&1 || true
  export BUILDAH_ISOLATION=chroot TMPDIR="$WORK"
}

# The Debian mirror apt uses on this machine (debootstrap needs one; nothing else is reached).
debian_mirror() {
  local uri
  uri=$(grep -rhs '^URIs:' /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '{print $2}' |
    grep -v security | head -n1)
  [ -n "$uri" ] || uri=$(grep -hs '^deb ' /etc/apt/sources.list 2>/dev/null | awk '{print $2}' | head -n1)
  printf '%s' "${uri:-http://deb.debian.org/debian}"
}

# --- the images ------------------------------------------------------------------------------------
save() { # $1: name; exports the committed image to its archive, atomically, and drops older ones
  local name=$1 out tmp
  out=$(archive "$name")
  tmp="$out.tmp"
  rm -f "$tmp"
  bah push --quiet "${IMAGE[$name]}" "docker-archive:$tmp:${IMAGE[$name]}" >&2
  mv "$tmp" "$out"
  find "$OUT" -maxdepth 1 -name "$name-*" ! -name "$name-${KEY[$name]}.*" -delete
}

build_base() {
  local rootfs="$WORK/rootfs" mirror
  mirror=$(debian_mirror)
  log "base: debootstrap $DEBIAN_SUITE (minbase + $DEBIAN_PACKAGES) from $mirror"
  debootstrap --variant=minbase --include="$DEBIAN_PACKAGES" "$DEBIAN_SUITE" "$rootfs" "$mirror" \
    >"$WORK/debootstrap.log" 2>&1 || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
  # shellcheck disable=SC2016  # dpkg-query's format, not a shell expansion
  chroot "$rootfs" dpkg-query -W -f '${Package} ${Version}\n' >"$OUT/base-${KEY[base]}.packages"
  # An image, not a machine: no package lists, caches, docs; pip may install (like python:slim).
  rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/* "$rootfs"/usr/share/doc/* \
    "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* "$rootfs"/usr/lib/python3*/EXTERNALLY-MANAGED
  tar -C "$rootfs" --numeric-owner -cf "$WORK/rootfs.tar" .
  rm -rf "$rootfs"
  local c
  c=$(bah from scratch)
  bah add "$c" "$WORK/rootfs.tar" / >&2
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$c" >&2
  bah commit --quiet --rm "$c" "${IMAGE[base]}" >&2
  rm -f "$WORK/rootfs.tar"
}

build_pause() {
  log "pause: static build of hack/images/pause.c"
  gcc -static -Os -Wall -o "$WORK/pause" "$here/pause.c"
  strip "$WORK/pause" 2>/dev/null || true
  local c
  c=$(bah from scratch)
  bah copy --chmod 0755 "$c" "$WORK/pause" /pause >&2
  bah config --entrypoint '["/pause"]' --user 65535:65535 "$c" >&2
  bah commit --quiet --rm "$c" "${IMAGE[pause]}" >&2
}

build_dockerfile() { # $1: name, $2: Dockerfile (relative to the repository), $3: tag, then bud's
  local name=$1 file=$2 tag=$3
  shift 3
  log "$name: buildah bud -f $file (BASE=${IMAGE[base]})"
  # pip in the build verifies TLS with this machine's CA bundle (which may hold a local proxy's
  # CA), mounted for the RUN steps only: the image keeps Debian's own.
  local ca=() bundle=/etc/ssl/certs/ca-certificates.crt
  [ -f "$bundle" ] && ca=(--volume "$bundle:$bundle:ro")
  bah bud --quiet --isolation chroot --layers --format docker "${ca[@]}" \
    --build-arg "BASE=${IMAGE[base]}" "$@" -f "$repo/$file" -t "$tag" "$repo" >&2
}

# The training image's dependencies, kept in the store under a tag keyed by their inputs: the
# prune at the end of a build removes untagged layers, which were the pip install's cache, so
# every change to trainer_runtime reinstalled torch (5 to 7 minutes) before this.
ensure_training_deps() {
  DEPS_TAG="$DEPS_REPO:${KEY[training_deps]}"
  bah inspect --type image "$DEPS_TAG" >/dev/null 2>&1 && return
  build_dockerfile training_deps docker/training.Dockerfile "$DEPS_TAG" --target deps
  local old
  for old in $(bah images --format '{{.Name}}:{{.Tag}}' "$DEPS_REPO" 2>/dev/null); do
    [ "$old" = "$DEPS_TAG" ] || bah rmi "$old" >/dev/null 2>&1 || true
  done
}

ensure_base_in_store() {
  # The derived builds need the base in buildah's store; after a store wipe, reload its archive.
  if ! bah inspect --type image "${IMAGE[base]}" >/dev/null 2>&1; then
    bah pull --quiet "docker-archive:$(archive base)" >&2
  fi
}

build() { # $1: name
  local t0=$SECONDS
  case $1 in
    base) build_base ;;
    pause) build_pause ;;
    init) ensure_base_in_store; build_dockerfile init docker/pytorch-init.Dockerfile "${IMAGE[init]}" ;;
    controller) ensure_base_in_store; build_dockerfile controller Dockerfile "${IMAGE[controller]}" ;;
    runtime) ensure_base_in_store; build_dockerfile runtime docker/runtime.Dockerfile "${IMAGE[runtime]}" ;;
    training)
      ensure_base_in_store
      ensure_training_deps
      build_dockerfile training docker/training.Dockerfile "${IMAGE[training]}" \
        --build-arg "DEPS=$DEPS_TAG"
      ;;
  esac
  save "$1"
  log "$1: ${IMAGE[$1]} built in $((SECONDS - t0)) s: $(du -h "$(archive "$1")" | cut -f1)"
}

main() {
  local no_build=0 names=()
  for a in "$@"; do
    case $a in
      --no-build) no_build=1 ;;
      base | pause | init | controller | runtime | training) names+=("$a") ;;
      *) die "unknown image $a (one of: ${ORDER[*]})" ;;
    esac
  done
  [ ${#names[@]} -gt 0 ] || names=("${ORDER[@]}")
  compute_keys
  local absent=0
  for n in "${names[@]}"; do [ -f "$(archive "$n")" ] || absent=1; done
  if [ "$absent" = 1 ]; then
    # One build at a time (a test run and the demo may start together); keys again under the lock.
    exec 9>"$OUT/.lock"
    flock 9
    compute_keys
  fi
  local todo=() n
  for n in "${ORDER[@]}"; do
    [[ " ${names[*]} " == *" $n "* ]] || continue
    # A derived image needs the base archive too.
    if [[ $n =~ ^(init|controller|runtime|training)$ ]] && [ ! -f "$(archive base)" ]; then
      [[ " ${todo[*]} " == *" base "* ]] || todo+=(base)
    fi
    [ -f "$(archive "$n")" ] || [[ " ${todo[*]} " == *" $n "* ]] || todo+=("$n")
  done
  if [ ${#todo[@]} -gt 0 ]; then
    [ "$no_build" = 0 ] || die "not built: ${todo[*]}; run \`make images\` (hack/images/build.sh)"
    # "plan" and "step NAME: start/done" lines: hack/prepare.py shows progress from them.
    log "plan: images=image_tools,$(IFS=,; echo "${todo[*]}")"
    log "step image_tools: start"
    ensure_tools
    setup_buildah
    log "step image_tools: done"
    for n in "${todo[@]}"; do
      log "step $n: start"
      build "$n"
      log "step $n: done"
    done
    # The layers of images built before and replaced since: without this the store grows by
    # an image's size with every rebuild (8 GB in a day of development here).
    bah rmi --prune >/dev/null 2>&1 || log "could not prune the old layers of $STORE (ignored)"
  fi
  for n in "${names[@]}"; do
    printf '%s %s\n' "${IMAGE[$n]}" "$(archive "$n")"
  done
}

main "$@"
