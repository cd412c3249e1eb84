#!/usr/bin/env bash
# Installs and starts what Vertal Run needs on a Debian 12 / Ubuntu host.
#
#   scripts/setup.sh serve   what `vertal serve` needs on its embedded default
#                            (OCI runtimes, the sandbox image, SQLite is built in)
#   scripts/setup.sh test    all of the above, plus what the test suite drives:
#                            Docker engine with gVisor, PostgreSQL, Chromium, the
#                            MCP client's npm packages
#
# Idempotent: run it as often as you like. Needs root (apt-get, cgroups).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-serve}

if [ "$(id -u)" -ne 0 ]; then
  echo "setup: run as root (sudo $0 $mode): it installs packages and configures cgroups" >&2
  exit 1
fi

log() { printf '\n== setup: %s\n' "$*"; }

# npm fetches the official Node.js build for the sandbox image (vertal image build).
pkgs=(crun runc runsc tini debootstrap ca-certificates iproute2 nodejs npm)
if [ "$mode" = test ]; then
  pkgs+=(docker.io postgresql chromium chromium-driver python3 python3-pytest curl)
fi
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# A machine image may ship node/npm outside dpkg (e.g. /usr/bin/node from another source).
if [ "${#missing[@]}" -gt 0 ]; then
  filtered=()
  for p in "${missing[@]}"; do
    case "$p" in
      nodejs) command -v node >/dev/null || filtered+=("$p") ;;
      npm) command -v npm >/dev/null || filtered+=("$p") ;;
      python3) command -v /usr/bin/python3 >/dev/null || filtered+=("$p") ;;
      *) filtered+=("$p") ;;
    esac
  done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v go >/dev/null; then
  export PATH=$PATH:/usr/local/go/bin
fi

log "building vertal"
mkdir -p bin
go build -o bin/vertal ./cmd/vertal


image_dir=${VERTAL_IMAGE_DIR:-/var/lib/vertal/images/default}
if [ ! -f "$image_dir/versions.json" ] || [ ! -d "$image_dir/rootfs" ]; then
  log "building the sandbox image into $image_dir (debootstrap, about a minute)"
  bin/vertal image build --out "$image_dir"
else
  log "sandbox image present at $image_dir"
fi

if [ "$mode" = test ]; then
  log "Docker engine (with runsc) and the imported sandbox image"
  ROOTFS="$image_dir/rootfs" scripts/dockerd.sh
  log "PostgreSQL"
  scripts/postgres.sh
  if [ -f tests/mcpclient/package.json ]; then
    log "MCP client (npm)"
    (cd tests/mcpclient && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
log "done"
