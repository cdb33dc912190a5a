#!/usr/bin/env bash
# Install (once, cached) mdBook from its published crate, to build the book under docs/.
# Only crates.io is used (`cargo install --locked`, no release downloads); the serve and watch
# features are left out: the suite only builds.
#
#   MDBOOK=$(scripts/mdbook.sh)   # -> path of the mdbook binary
#   "$MDBOOK" build docs          # -> target/book/index.html
#
# stdout: only the binary's path. Progress goes to stderr.
set -euo pipefail

MDBOOK_VERSION="0.5.4"   # crates.io: mdbook

log() { printf '[mdbook] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

CARGO="${CARGO:-$(command -v cargo 2>/dev/null || echo "$HOME/.cargo/bin/cargo")}"
[[ -x "$CARGO" ]] || die "cargo not found (set CARGO=/path/to/cargo)"

OUT="${VIGIL_MDBOOK_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vigil/mdbook-${MDBOOK_VERSION}}"

is_complete() {
  [[ -x "$1/bin/mdbook" ]] && "$1/bin/mdbook" --version 2>/dev/null | grep -qxF "mdbook v${MDBOOK_VERSION}"
}

if is_complete "$OUT"; then
  printf '%s\n' "$OUT/bin/mdbook"
  exit 0
fi

PARENT="$(dirname "$OUT")"
mkdir -p "$PARENT"
# Serialize concurrent invocations.
exec 9>"$PARENT/.$(basename "$OUT").lock"
flock 9
if is_complete "$OUT"; then
  printf '%s\n' "$OUT/bin/mdbook"
  exit 0
fi
rm -rf "$PARENT/.staging.$(basename "$OUT")."*

STAGE="$(mktemp -d "$PARENT/.staging.$(basename "$OUT").XXXXXX")"
trap 'rm -rf "$STAGE"' EXIT
trap 'exit 130' INT TERM HUP

start=$SECONDS
log "installing mdbook ${MDBOOK_VERSION} with $("$CARGO" --version) into $OUT"
# Its own target directory inside the staging one, so the workspace's target/ is untouched.
CARGO_TARGET_DIR="$STAGE/target" "$CARGO" install mdbook --version "=${MDBOOK_VERSION}" --locked \
  --no-default-features --features search --root "$STAGE" >&2
rm -rf "$STAGE/target"
is_complete "$STAGE" || die "installed mdbook does not report v${MDBOOK_VERSION}"
chmod 0755 "$STAGE"
[[ -e "$OUT" ]] && rm -rf "$OUT"
mv -T "$STAGE" "$OUT"
log "done in $((SECONDS - start))s"
printf '%s\n' "$OUT/bin/mdbook"
