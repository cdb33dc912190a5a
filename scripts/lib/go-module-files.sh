# Shared by the scripts that copy files out of a published Go module once and cache them
# (capi-crds.sh, openshift-crds.sh): the completeness check, the lock, the download through the
# Go module proxy, the staging directory and the atomic move are written here once.
#
# A script sets TOOL (its log prefix), MODULE and VERSION (the pinned module), OUT (the cache
# directory) and PAIRS ("<path in the module>=<file name in OUT>", one per file), then calls
# `go_module_files_main`, which prints OUT on stdout and nothing else. OUT also gets the
# module's LICENSE and a VERSION file naming MODULE@VERSION; it counts as complete when those
# and every file of PAIRS are there and not empty, so a later `go clean -modcache` loses nothing.

log() { printf '[%s] %s\n' "$TOOL" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

is_complete() {
  local dir=$1 pair
  [[ -f "$dir/VERSION" ]] && [[ "$(cat "$dir/VERSION")" == "${MODULE}@${VERSION}" ]] || return 1
  [[ -s "$dir/LICENSE" ]] || return 1
  for pair in "${PAIRS[@]}"; do [[ -s "$dir/${pair#*=}" ]] || return 1; done
}

go_module_files_main() {
  if is_complete "$OUT"; then
    printf '%s\n' "$OUT"
    return 0
  fi
  GO="${GO:-$(command -v go 2>/dev/null || echo /usr/local/go/bin/go)}"
  [[ -x "$GO" ]] || die "go toolchain not found (set GO=/path/to/go)"
  local parent
  parent="$(dirname "$OUT")"
  mkdir -p "$parent"
  # Serialize concurrent invocations (several test binaries may start at once).
  if command -v flock >/dev/null 2>&1; then
    exec 9>"$parent/.$(basename "$OUT").lock"
    flock 9
    if is_complete "$OUT"; then
      printf '%s\n' "$OUT"
      return 0
    fi
  fi
  WORK="$(mktemp -d "${TMPDIR:-/tmp}/vigil-${TOOL}.XXXXXX")"
  STAGE="$(mktemp -d "$parent/.staging.$(basename "$OUT").XXXXXX")"
  trap 'rm -rf "$WORK" "$STAGE"' EXIT
  trap 'exit 130' INT TERM HUP

  log "downloading ${MODULE}@${VERSION} from the Go module proxy ..."
  # Outside any module, so the project's own state plays no part; the Go module cache
  # verifies the download against the checksum database.
  local mod_dir pair src
  mod_dir="$(cd "$WORK" && GOFLAGS=-mod=mod "$GO" mod download -json "${MODULE}@${VERSION}" \
    | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -n "$mod_dir" && -d "$mod_dir" ]] || die "${MODULE}@${VERSION} is not in the module cache after download"
  for pair in "${PAIRS[@]}"; do
    src="$mod_dir/${pair%%=*}"
    [[ -s "$src" ]] || die "$src is missing: the module no longer keeps this file there"
    cp "$src" "$STAGE/${pair#*=}"
  done
  cp "$mod_dir/LICENSE" "$STAGE/LICENSE"
  printf '%s@%s\n' "$MODULE" "$VERSION" >"$STAGE/VERSION"
  chmod -R u+w,a+rX "$STAGE"
  is_complete "$STAGE" || die "copied files failed verification"

  if [[ -e "$OUT" ]]; then
    local old
    old="$(mktemp -d "$parent/.old.XXXXXX")"
    mv "$OUT" "$old/"
    rm -rf "$old"
  fi
  mv -T "$STAGE" "$OUT"
  log "${MODULE}@${VERSION}: files in $OUT"
  printf '%s\n' "$OUT"
}
