# Shared by the scripts that build a pinned Go tool once and cache it (capi-mhc.sh,
# capi-managers.sh, promql-check.sh, medik8s-nhc.sh): the module pin check, the cache key, the lock, the staging
# directory, the atomic move and the pruning of older builds are written here once.
#
# A script sets TOOL (its log prefix and cache name), VERSION, SRC (its Go main's directory) and
# MODULES (the modules go.mod must require at VERSION), defines
#   is_complete DIR   whether DIR holds a finished, runnable build
#   build DIR         builds into DIR (GOFLAGS, CGO_ENABLED exported; stdout goes to stderr)
# and calls `go_tool_main SUFFIX`, which prints the cached build's directory followed by SUFFIX
# ("" or "/binary") on stdout and nothing else. The cache directory is
# ~/.cache/vigil/<TOOL>-<VERSION>/<hash of go.mod, go.sum and the Go sources>, so any change
# rebuilds.

log() { printf '[%s] %s\n' "$TOOL" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

go_tool_main() {
  local suffix="$1"
  GO="${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}"
  [[ -x "$GO" ]] || die "go toolchain not found (set GO=/path/to/go)"
  local m
  for m in "${MODULES[@]}"; do
    grep -qE "^[[:space:]]*${m//./\\.} ${VERSION}\$" "$SRC/go.mod" \
      || die "$SRC/go.mod does not require $m ${VERSION}"
  done
  local key out parent
  key="$(cat "$SRC/go.mod" "$SRC/go.sum" "$SRC"/*.go | sha256sum | cut -c1-16)"
  out="${XDG_CACHE_HOME:-$HOME/.cache}/vigil/${TOOL}-${VERSION}/${key}"
  if is_complete "$out"; then
    printf '%s%s\n' "$out" "$suffix"
    return 0
  fi
  parent="$(dirname "$out")"
  mkdir -p "$parent"
  # Serialize concurrent invocations.
  exec 9>"$parent/.lock"
  flock 9
  if is_complete "$out"; then
    printf '%s%s\n' "$out" "$suffix"
    return 0
  fi
  rm -rf "$parent/.staging."*
  STAGE="$(mktemp -d "$parent/.staging.XXXXXX")"
  trap 'rm -rf "$STAGE"' EXIT
  trap 'exit 130' INT TERM HUP
  export CGO_ENABLED=0
  # go.sum is committed: -mod=readonly makes a stale go.mod/go.sum an error instead of a silent edit.
  export GOFLAGS="${GOFLAGS:-} -mod=readonly -buildvcs=false"
  local start=$SECONDS
  log "building ${MODULES[0]} ${VERSION} with $("$GO" version) into $out"
  build "$STAGE" >&2
  chmod -R u+w,a+rX "$STAGE"
  is_complete "$STAGE" || die "the build in $STAGE is incomplete or does not run"
  [[ -e "$out" ]] && rm -rf "$out"
  mv -T "$STAGE" "$out"
  # Builds under other keys untouched for a day are not needed any more (a newer one, still in
  # use by another checkout of another commit, stays).
  find "$parent" -mindepth 1 -maxdepth 1 -type d ! -name "$key" ! -name '.staging.*' -mtime +0 -exec rm -rf {} +
  log "done in $((SECONDS - start))s"
  printf '%s%s\n' "$out" "$suffix"
}
