#!/usr/bin/env bash
# Installs and starts what Vertal Run needs on a Debian 12 / Ubuntu host.
#
#   scripts/setup.sh serve   what `vertal serve` needs on its embedded default
#                            (OCI runtimes, the sandbox image, SQLite is built in)
#   scripts/setup.sh engine  serve, plus the Docker engine with gVisor and the
#                            imported sandbox image: what the engine's end-to-end
#                            suites drive (scripts/vm-test.sh uses it in its guest)
#   scripts/setup.sh test    all of the above, plus what the whole test suite
#                            drives: PostgreSQL, Chromium, the MCP client's npm
#                            packages, wrangler/workerd for the edge Worker,
#                            ShellCheck (actionlint runs it), Docker Compose v2,
#                            the local base image deploy/Dockerfile builds
#                            from, cloud-init (only its `schema` command
#                            is used: it is kept from running at boot) and
#                            nftables (`nft -c` checks the cloud-init's
#                            firewall; nothing is loaded on the host)
#
# Go: the one named by go.mod's go line (or newer) is used from PATH or
# /usr/local/go. If there is none, it is installed into /usr/local/go from the
# Go module proxy (see install_go below), so a fresh server needs nothing first.
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
# A freshly booted Debian or Ubuntu server runs apt-daily/unattended-upgrades,
# which hold apt's locks for a while: wait for them instead of failing.
apt_get() { apt-get -o DPkg::Lock::Timeout=600 "$@"; }

# npm fetches the official Node.js build for the sandbox image (vertal image build).
pkgs=(crun runc runsc bubblewrap tini debootstrap ca-certificates iproute2 nodejs npm fakeroot)
case "$mode" in
  serve) ;;
  engine) pkgs+=(docker.io curl) ;;
  test) pkgs+=(docker.io postgresql chromium chromium-driver python3 python3-pytest python3-aiosmtpd curl shellcheck nftables) ;;
  *) echo "setup: unknown mode $mode (serve, engine or test)" >&2; exit 2 ;;
esac
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
# cloud-init validates deploy/hetzner/cloud-init.yaml (tests/deploy). Installed
# on a machine that did not have it, it would run its datasource search on the
# next boot: cloud-init.disabled, written first, keeps it to a schema checker.
if [ "$mode" = test ] && ! dpkg-query -W -f='${Status}' cloud-init 2>/dev/null | grep -q "ok installed"; then
  mkdir -p /etc/cloud && touch /etc/cloud/cloud-init.disabled
  missing+=(cloud-init)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt_get update -qq
  apt_get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- Go ------------------------------------------------------------------------
# The version go.mod asks for: its toolchain line if any, else its go line.
want_go=$(awk '$1 == "toolchain" { sub(/^go/, "", $2); print $2; exit }' go.mod)
[ -n "$want_go" ] || want_go=$(awk '$1 == "go" { print $2; exit }' go.mod)
# "1.26" names the language; the first release of it is go1.26.0.
case "$want_go" in *.*.* | *rc* | *beta*) ;; *) want_go=$want_go.0 ;; esac

# go_version GO: prints 1.26.8 for a go binary that says go1.26.8.
go_version() { "$1" env GOVERSION 2>/dev/null | sed 's/^go//'; }
# new_enough V: true when V >= want_go (sort -V orders Go versions right).
new_enough() { [ -n "$1" ] && [ "$(printf '%s\n' "$want_go" "$1" | sort -V | head -n1)" = "$want_go" ]; }

find_go() {
  local g
  for g in "$(command -v go || true)" /usr/local/go/bin/go; do
    if [ -x "$g" ] && new_enough "$(GOTOOLCHAIN=local go_version "$g")"; then
      echo "$g"
      return 0
    fi
  done
  return 1
}

# install_go puts the official Go toolchain go$want_go into /usr/local/go,
# through the only places a fresh server is sure to reach: its package
# archive and the Go module proxy.
#  1. A bootstrap Go >= 1.21 from the distribution (Debian 12: bookworm-backports;
#     Ubuntu: its archive), because Go 1.21+ can fetch any newer toolchain.
#  2. GOTOOLCHAIN=go$want_go makes it download golang.org/toolchain from the Go
#     module proxy, checked against the Go checksum database (which the proxy
#     also serves), the same way `go` itself switches toolchains.
#  3. That toolchain is a complete GOROOT: copied to /usr/local/go, where the
#     official tarball would put it. The bootstrap packages are then removed, so
#     exactly one Go is left and no older /usr/bin/go shadows it.
install_go() {
  export DEBIAN_FRONTEND=noninteractive
  local added_list="" boot_pkg bootstrap goroot tmp
  # shellcheck disable=SC1091 # the host's file
  . /etc/os-release
  if [ "${ID:-}" = debian ] && [ "${VERSION_CODENAME:-}" = bookworm ] &&
    ! grep -rqs '^[^#]*bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    added_list=/etc/apt/sources.list.d/vertal-bookworm-backports.list
    echo "deb http://deb.debian.org/debian bookworm-backports main" >"$added_list"
  fi
  apt_get update -qq
  # The newest versioned golang-1.N-go package the archive has (N >= 21).
  boot_pkg=$(apt-cache search --names-only '^golang-1\.[0-9]+-go$' | awk '{ print $1 }' |
    sed 's/^golang-1\.\([0-9]*\)-go$/\1 &/' | sort -n | awk '$1 >= 21 { p = $2 } END { print p }')
  if [ -z "$boot_pkg" ]; then
    [ -z "$added_list" ] || rm -f "$added_list"
    echo "setup: no Go >= 1.21 in this machine's package archive to bootstrap Go $want_go;" \
      "install Go $want_go into /usr/local/go (https://go.dev/dl/) and run me again" >&2
    exit 1
  fi
  log "bootstrapping Go from $boot_pkg"
  apt_get install -y -qq --no-install-recommends "$boot_pkg" >/dev/null
  bootstrap=/usr/lib/go-$(echo "$boot_pkg" | sed 's/^golang-\(1\.[0-9]*\)-go$/\1/')/bin/go
  log "fetching Go $want_go from the Go module proxy"
  tmp=$(mktemp -d)
  # A private module cache and no go.mod around: nothing else is touched.
  goroot=$(cd "$tmp" && HOME=$tmp GOPATH=$tmp/gopath GOMODCACHE=$tmp/mod GOFLAGS=-modcacherw \
    GOTOOLCHAIN=go$want_go "$bootstrap" env GOROOT)
  rm -rf /usr/local/go.new
  cp -a "$goroot" /usr/local/go.new
  rm -rf "$tmp"
  if [ -e /usr/local/go ]; then
    rm -rf /usr/local/go.old
    mv /usr/local/go /usr/local/go.old
  fi
  mv /usr/local/go.new /usr/local/go
  rm -rf /usr/local/go.old
  log "removing the bootstrap Go ($boot_pkg)"
  apt_get purge -y -qq "$boot_pkg" >/dev/null
  apt_get autoremove -y -qq >/dev/null
  [ -z "$added_list" ] || rm -f "$added_list"
}

if ! go_bin=$(find_go); then
  log "no Go >= $want_go on PATH or in /usr/local/go; installing Go $want_go"
  install_go
  go_bin=$(find_go) || { echo "setup: Go $want_go is still missing after installing it" >&2; exit 1; }
fi
# The Go found comes first on PATH for the build below.
export PATH=$(dirname "$go_bin"):$PATH
log "using $(go version) from $go_bin"

log "building vertal"
mkdir -p bin
go build -o bin/vertal ./cmd/vertal
# The agent that sandboxes that stay run: static, so it runs on any image.
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o bin/vertal-agent ./cmd/vertal-agent


image_dir=${VERTAL_IMAGE_DIR:-/var/lib/vertal/images/default}
if [ ! -f "$image_dir/versions.json" ] || [ ! -d "$image_dir/rootfs" ]; then
  log "building the sandbox image into $image_dir (debootstrap, about a minute)"
  bin/vertal image build --out "$image_dir"
else
  log "sandbox image present at $image_dir"
fi

if [ "$mode" = engine ] || [ "$mode" = test ]; then
  log "Docker engine (with runsc) and the imported sandbox image"
  ROOTFS="$image_dir/rootfs" scripts/dockerd.sh
fi
# install_compose builds Docker Compose v2 (the `docker compose` plugin users
# have; Debian 12 packages only v1, docker-compose 1.29) from its source on
# the Go module proxy and installs it as a Docker CLI plugin. The module has
# exclude directives, which `go install pkg@version` refuses, so it is built
# as the main module in a copy of its source. About 7 minutes on 2 busy cores
# (seconds with a warm Go build cache), once: a plugin that already reports
# the version is kept.
compose_version=v2.40.3
compose_plugin=/usr/local/lib/docker/cli-plugins/docker-compose
install_compose() {
  if [ -x "$compose_plugin" ] && [ "$("$compose_plugin" version --short 2>/dev/null)" = "${compose_version#v}" ]; then
    log "Docker Compose $compose_version present"
    return
  fi
  log "building Docker Compose $compose_version from the Go module proxy (a few minutes, once)"
  local src tmp
  src=$(go mod download -json "github.com/docker/compose/v2@$compose_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -n "$src" ] || { echo "setup: downloading github.com/docker/compose/v2@$compose_version failed" >&2; exit 1; }
  tmp=$(mktemp -d)
  cp -r "$src/." "$tmp/"
  chmod -R u+w "$tmp"
  (cd "$tmp" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false go build -trimpath \
    -ldflags "-s -w -X github.com/docker/compose/v2/internal.Version=$compose_version" -o "$tmp/docker-compose" ./cmd)
  install -D -m 0755 "$tmp/docker-compose" "$compose_plugin"
  rm -rf "$tmp"
}

if [ "$mode" = test ]; then
  # The datasci image that the image e2e tests and the security suite use.
  # Rebuilt only when its recipe (deploy/images/datasci.conf) changes: a
  # stamp named after the recipe's hash sits in the image directory.
  # Measured on the 2-core CI host: about 3m40s and 1.2 GiB when built
  # (with the .deb cache warm from the default image), under a second when
  # cached, plus about 20 s to import it into a fresh Docker.
  (
    . deploy/images/datasci.conf
    ds_dir=$(dirname "$image_dir")/$NAME
    stamp="$ds_dir/.recipe-$(sha256sum deploy/images/datasci.conf | cut -c1-16)"
    if [ -f "$stamp" ] && [ -e "$ds_dir/rootfs" ]; then
      log "$NAME image present at $ds_dir (recipe unchanged)"
    else
      log "building the $NAME image into $ds_dir (its recipe changed or it is missing)"
      start=$(date +%s)
      bin/vertal image build --name "$NAME" --images-dir "$(dirname "$ds_dir")" --apt "$APT" --npm "$NPM"
      rm -f "$ds_dir"/.recipe-*
      touch "$stamp"
      log "$NAME image built in $(( $(date +%s) - start ))s"
    fi
    if ! docker image inspect "vertal/$NAME:latest" >/dev/null 2>&1; then
      log "importing $NAME into Docker"
      bin/vertal image import --images-dir "$(dirname "$ds_dir")" "$NAME"
    fi
  )
  install_compose
  log "base image for deploy/Dockerfile"
  scripts/base-image.sh
  log "PostgreSQL"
  scripts/postgres.sh
  if [ -f tests/mcpclient/package.json ]; then
    log "MCP client (npm)"
    (cd tests/mcpclient && npm ci --no-audit --no-fund --loglevel=error)
  fi
  if [ -f tests/openapi/package.json ]; then
    # Redocly, openapi-typescript + openapi-fetch, @hey-api/openapi-ts and
    # typescript for tests/openapi (no install scripts, about 70 MB).
    log "OpenAPI tools (npm)"
    (cd tests/openapi && npm ci --no-audit --no-fund --loglevel=error)
  fi
  if [ -f cloudflare/package.json ]; then
    # wrangler and workerd (its Linux binary is in @cloudflare/workerd-linux-64)
    # for tests/edge, which runs the Worker with `wrangler dev`.
    log "edge Worker toolchain (npm)"
    (cd cloudflare && npm ci --no-audit --no-fund --loglevel=error)
  fi
fi
log "done"
