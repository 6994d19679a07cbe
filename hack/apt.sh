# shellcheck shell=bash
# Sourced by the build scripts: Debian packages they need, installed when we are root.
# apt_install TAG PACKAGE...   installs them (apt-get update first), or says what to run and
#                              returns 1 when it cannot (not root, or no apt-get).
apt_install() {
  local tag=$1
  shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    printf '[%s] installing Debian packages: %s\n' "$tag" "$*" >&2
    apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
  else
    printf '[%s] needs Debian packages %s: as root, apt-get install -y %s\n' "$tag" "$*" "$*" >&2
    return 1
  fi
}
