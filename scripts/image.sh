#!/usr/bin/env bash
# Build the Vigil image for the tests, daemonlessly (podman, no base image pulled):
#  1. `vigil` statically linked (gnu target, crt-static; rustls + ring) into a target dir
#     cached between runs (~/.cache/vigil/image-target);
#  2. checks that the binary is static (`file`, `ldd`);
#  3. builds the final stage of ./Containerfile (everything after its "final stage" line) with
#     that binary as the build stage's output.
#
#   eval "$(scripts/podman.sh)"; IMAGE=$(scripts/image.sh)   # -> image reference
#
# stdout: only the image reference. Progress goes to stderr.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[image] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

PODMAN="${VIGIL_PODMAN:-podman}"
TAG="${VIGIL_IMAGE_TAG:-localhost/vigil:test}"
TARGET_DIR="${VIGIL_IMAGE_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/vigil/image-target}"
TRIPLE="x86_64-unknown-linux-gnu"
[[ "$(uname -m)" == x86_64 ]] || TRIPLE="$(uname -m)-unknown-linux-gnu"

start=$SECONDS
log "building vigil (release, static) into $TARGET_DIR"
RUSTFLAGS="-C target-feature=+crt-static" \
  cargo build --release --locked -p vigil --target "$TRIPLE" --target-dir "$TARGET_DIR" >&2
BIN="$TARGET_DIR/$TRIPLE/release/vigil"
log "binary built in $((SECONDS - start))s"

# A dynamic binary would not start on `scratch` (no loader, no libc).
file -L "$BIN" | grep -Eq 'static(-pie)? linked|statically linked' || die "$BIN is not statically linked: $(file -L "$BIN")"
if ldd "$BIN" 2>&1 | grep -q '=>'; then
  die "$BIN has dynamic dependencies: $(ldd "$BIN" 2>&1 | tr '\n' ' ')"
fi

CTX="$(mktemp -d "${TMPDIR:-/tmp}/vigil-image.XXXXXX")"
trap 'rm -rf "$CTX"' EXIT
mkdir -p "$CTX/out"
# Without debug information (100 MB less); the build stage of the Containerfile does the same.
strip -o "$CTX/out/vigil" "$BIN"
CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt
[[ -s "$CA_BUNDLE" ]] || die "$CA_BUNDLE is missing (Debian package ca-certificates)"
cp "$CA_BUNDLE" "$CTX/out/ca-certificates.crt"
# The final stage, its `COPY --from=build /out/...` reading the context instead.
sed -n '/^# ---- final stage ----$/,$p' Containerfile | sed 's#^COPY --from=build /out/#COPY out/#' >"$CTX/Containerfile"
grep -q '^FROM scratch$' "$CTX/Containerfile" || die "Containerfile: no 'FROM scratch' after the final stage line"
grep -q '^COPY out/vigil /vigil$' "$CTX/Containerfile" || die "Containerfile: the final stage must COPY --from=build /out/vigil /vigil"

t0=$SECONDS
"$PODMAN" build --quiet --pull=never -t "$TAG" -f "$CTX/Containerfile" "$CTX" >&2
log "image $TAG built in $((SECONDS - t0))s (total $((SECONDS - start))s)"
printf '%s\n' "$TAG"
