# shellcheck shell=bash
# Sourced by the build scripts: Debian packages they need, installed when we are root.
# apt_install TAG PACKAGE...   installs them (apt-get update first), or says what to run and
#                              returns 1 when it cannot (not root, or no apt-get).
apt_install() {
  local tag=$1
  shift
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    printf '[%s] installing Debian packages: %s\n' "$tag" "$*" >&2
    # The build scripts run side by side (hack/prepare.py): one apt-get at a time among them
    # (flock), and apt waits for a dpkg lock that someone else holds instead of failing.
    (
      command -v flock >/dev/null && flock 8
      apt-get -o DPkg::Lock::Timeout=600 update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq "$@" >&2
    ) 8>"${TMPDIR:-/tmp}/kubeckpt-apt.lock"
  else
    printf '[%s] needs Debian packages %s: as root, apt-get install -y %s\n' "$tag" "$*" "$*" >&2
    return 1
  fi
}
