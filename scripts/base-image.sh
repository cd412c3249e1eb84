#!/bin/sh
# base-image.sh makes the local base image deploy/Dockerfile builds FROM:
# a minimal Debian bookworm root (debootstrap --variant=minbase) imported
# into Docker. Nothing is pulled from a container registry, so it works
# wherever the Debian archive is reachable, and everyone who runs it gets
# the same base. Run it as root; a second run with the tag present does
# nothing (pass --refresh to rebuild it, e.g. for security updates).
#
#   VERTAL_BASE_IMAGE  tag to create (default vertal/base:bookworm)
#   DEBIAN_MIRROR      archive to debootstrap from (default http://deb.debian.org/debian)
#   VERTAL_BASE_HOST_CAS  1 (default): the base also trusts the CA certificates
#                      this host added in /usr/local/share/ca-certificates (a
#                      TLS-inspecting proxy's, a company CA), so the build's
#                      Go module downloads work where the host's do; 0: Debian's only
#
# The sandbox image the API image copies its sandbox root filesystem from
# (vertal/default:latest) is made by `vertal image build --docker-tag` or
# scripts/setup.sh engine; see deploy/README.md.
set -eu

TAG=${VERTAL_BASE_IMAGE:-vertal/base:bookworm}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm

say() { echo "base-image.sh: $*" >&2; }
die() {
	say "$*"
	exit 1
}

refresh=0
case "${1:-}" in
--refresh) refresh=1 ;;
"") ;;
*) die "usage: $0 [--refresh]" ;;
esac

[ "$(id -u)" -eq 0 ] || die "run as root: debootstrap needs it"
docker info >/dev/null 2>&1 || die "no Docker engine answers (start it with scripts/dockerd.sh)"
if [ "$refresh" -eq 0 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
	say "$TAG present ($(docker image inspect --format '{{index .Config.Labels "io.vertal.base.built"}}' "$TAG")); --refresh rebuilds it"
	exit 0
fi
command -v debootstrap >/dev/null 2>&1 || {
	say "installing debootstrap"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >/dev/null
}

root=$(mktemp -d /var/tmp/vertal-base.XXXXXX)
trap 'rm -rf "$root"' EXIT
say "debootstrapping $SUITE (minbase) from $MIRROR"
# --include: apt over https and Go's TLS both need the CA bundle.
debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$root" "$MIRROR" >"$root.log" 2>&1 ||
	{ tail -n 20 "$root.log" >&2; rm -f "$root.log"; die "debootstrap failed"; }
rm -f "$root.log"

if [ "${VERTAL_BASE_HOST_CAS:-1}" = 1 ] && ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
	say "adding this host's CA certificates: $(cd /usr/local/share/ca-certificates && echo *.crt)"
	cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
	chroot "$root" update-ca-certificates >/dev/null
fi

cat >"$root/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb http://deb.debian.org/debian-security $SUITE-security main
SOURCES
# What a container image needs no copy of: downloaded packages and indexes
# (every Dockerfile step runs apt-get update first), docs, man pages.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* \
	"$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
# Keep apt from installing docs and recommended packages in later steps.
cat >"$root/etc/apt/apt.conf.d/90vertal" <<'APT'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
Acquire::Retries "3";
APT
cat >"$root/etc/dpkg/dpkg.cfg.d/90vertal-nodoc" <<'DPKG'
path-exclude /usr/share/doc/*
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
DPKG

built=$(date -u +%Y-%m-%dT%H:%M:%SZ)
say "importing as $TAG"
old=$(docker image inspect --format '{{.Id}}' "$TAG" 2>/dev/null || true)
tar -C "$root" --numeric-owner -c . | docker import \
	--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
	--change 'ENV LANG=C.UTF-8' \
	--change 'CMD ["/bin/bash"]' \
	--change "LABEL io.vertal.base.suite=$SUITE io.vertal.base.mirror=$MIRROR io.vertal.base.built=$built" \
	- "$TAG" >/dev/null
[ -z "$old" ] || docker image rm "$old" >/dev/null 2>&1 || true
say "ready: $TAG ($(docker image inspect --format '{{.Size}}' "$TAG" | awk '{ printf "%d MB", $1 / 1e6 }'))"
