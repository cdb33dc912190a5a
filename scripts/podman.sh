#!/usr/bin/env bash
# Make `podman` usable for the image test (crates/vigil/tests/image.rs), once:
# installs podman and runc from Debian's packages (skipped when present) and writes
# a containers.conf that works on these machines (no ulimits to set, runc, cgroupfs).
#
#   eval "$(scripts/podman.sh)"   # -> exports CONTAINERS_CONF and VIGIL_PODMAN
#
# stdout: only the export lines. Progress goes to stderr. Exits 3 when the packages
# cannot be installed (apt-get failed): the image test then skips, saying so.
set -euo pipefail

log() { printf '[podman] %s\n' "$*" >&2; }

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/podman"
mkdir -p "$CACHE"

if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
  exec 9>"$CACHE/.install.lock"
  flock 9
  if ! command -v podman >/dev/null 2>&1 || ! command -v runc >/dev/null 2>&1; then
    SUDO=""
    [[ "$(id -u)" == 0 ]] || SUDO="sudo"
    log "installing podman and runc with apt-get ..."
    export DEBIAN_FRONTEND=noninteractive
    if ! { $SUDO apt-get update -qq >&2 &&
           $SUDO apt-get install -y -qq --no-install-recommends podman runc uidmap >&2; }; then
      log "ERROR: apt-get could not install podman/runc"
      exit 3
    fi
  fi
fi

# Storage under the cache (vfs: works inside any container or VM, no fuse or overlay module).
# Each run writes its own temporary file ($$): the image tests run this script concurrently, and
# a shared name made one run's mv find the file already moved by the other.
CONF="$CACHE/containers.conf"
cat >"$CONF.tmp.$$" <<CONF
[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
CONF
mv "$CONF.tmp.$$" "$CONF"
STORAGE="$CACHE/storage.conf"
cat >"$STORAGE.tmp.$$" <<CONF
[storage]
driver = "vfs"
graphroot = "$CACHE/graph"
runroot = "$CACHE/run"
CONF
mv "$STORAGE.tmp.$$" "$STORAGE"

log "$(podman --version)"
printf 'export CONTAINERS_CONF=%q\n' "$CONF"
printf 'export CONTAINERS_STORAGE_CONF=%q\n' "$STORAGE"
printf 'export VIGIL_PODMAN=%q\n' "$(command -v podman)"
