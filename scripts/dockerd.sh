#!/bin/sh
# dockerd.sh prepares the Docker engine for the docker sandbox driver on
# Debian 12 and leaves it running. Run it as root; running it again changes
# nothing that is already right.
#
# It installs docker.io and runsc if missing, registers runsc (gVisor) as a
# Docker runtime in /etc/docker/daemon.json, starts dockerd (through systemd
# when systemd runs, otherwise directly in the background with its log in
# /var/log/dockerd.log), waits until it answers, and imports the sandbox root
# filesystem as the image the driver runs.
#
#   ROOTFS        root filesystem to import (default /var/lib/vertal/images/default/rootfs)
#   VERTAL_DOCKER_IMAGE   image name (default vertal/default:latest)
set -eu

ROOTFS=${ROOTFS:-/var/lib/vertal/images/default/rootfs}
IMAGE=${VERTAL_DOCKER_IMAGE:-vertal/default:latest}
DAEMON_JSON=/etc/docker/daemon.json
LOG=/var/log/dockerd.log

say() { echo "dockerd.sh: $*" >&2; }
die() {
	say "$*"
	exit 1
}

[ "$(id -u)" -eq 0 ] || die "run as root: it installs packages and starts dockerd"

# --- packages ---------------------------------------------------------------
missing=""
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
command -v runsc >/dev/null 2>&1 || missing="$missing runsc"
if [ -n "$missing" ]; then
	say "installing$missing"
	export DEBIAN_FRONTEND=noninteractive
	apt-get update -q >/dev/null
	# shellcheck disable=SC2086 # word splitting is the point
	apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
RUNSC=$(command -v runsc)

# --- daemon.json: register runsc ----------------------------------------------
# runsc's arguments, for every container Docker runs with it:
#   --platform=ptrace  the default platform; --platform=kvm hangs on our VMs.
#   --network=none     sandboxes never have a network, and Debian's runsc
#                      (2022-12) refuses to copy a Docker network namespace on
#                      newer kernels ("cannot run with network enabled in root
#                      network namespace": its root-namespace test is a sysctl
#                      file newer kernels show in every namespace). gVisor's
#                      own network stack then has loopback only.
#   --oci-seccomp      apply the container's seccomp profile inside the
#                      sandbox too; without it runsc ignores the profile.
#   --host-uds=open    let the sandbox connect to a host unix socket mounted
#                      into it: a live sandbox's egress socket (the server's
#                      proxy, mounted read-only at /.vertal/net). It opens
#                      only sockets bind-mounted into the container, which
#                      the driver does for that one directory; it never
#                      lets the sandbox create a socket on the host.
RUNSC_ARGS='["--platform=ptrace", "--network=none", "--oci-seccomp", "--host-uds=open"]'
want=$(cat <<EOF
{
  "runtimes": {
    "runsc": {
      "path": "$RUNSC",
      "runtimeArgs": $RUNSC_ARGS
    }
  }
}
EOF
)
changed=0
mkdir -p /etc/docker
if [ ! -s "$DAEMON_JSON" ]; then
	printf '%s\n' "$want" >"$DAEMON_JSON"
	changed=1
elif [ "$(cat "$DAEMON_JSON")" != "$want" ]; then
	# Keep whatever else the operator configured; set our runtime.
	[ -x /usr/bin/python3 ] || die "$DAEMON_JSON has other settings and python3 is missing to merge them; add the runtime by hand: $want"
	cp "$DAEMON_JSON" "$DAEMON_JSON.new"
	/usr/bin/python3 - "$DAEMON_JSON.new" "$RUNSC" "$RUNSC_ARGS" <<'EOF'
import json, sys
path, runsc, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
with open(path) as f:
    cfg = json.load(f)
cfg.setdefault("runtimes", {})["runsc"] = {"path": runsc, "runtimeArgs": args}
with open(path, "w") as f:
    json.dump(cfg, f, indent=2)
    f.write("\n")
EOF
	if cmp -s "$DAEMON_JSON" "$DAEMON_JSON.new"; then
		rm -f "$DAEMON_JSON.new"
	else
		cp "$DAEMON_JSON" "$DAEMON_JSON.bak"
		mv "$DAEMON_JSON.new" "$DAEMON_JSON"
		changed=1
	fi
fi

# --- start dockerd ------------------------------------------------------------
answers() { docker info >/dev/null 2>&1; }

wait_until_up() {
	i=0
	until answers; do
		i=$((i + 1))
		if [ "$i" -ge 120 ]; then
			[ -f "$LOG" ] && tail -n 20 "$LOG" >&2
			die "dockerd does not answer after 60s"
		fi
		sleep 0.5
	done
}

# The running engine has our runsc registration when its runsc runtime
# shows every argument above (a daemon started on an older daemon.json
# lacks the newer ones until it reloads).
registered() {
	have=$(docker info --format '{{json .Runtimes.runsc}}' 2>/dev/null) || return 1
	for arg in $(printf '%s' "$RUNSC_ARGS" | tr -d '[],"'); do
		case "$have" in
		*"\"$arg\""*) ;;
		*) return 1 ;;
		esac
	done
}

if answers; then
	if [ "$changed" -eq 1 ] || ! registered; then
		# Runtimes are reloadable: SIGHUP re-reads daemon.json without
		# stopping running containers.
		say "reloading dockerd configuration"
		# shellcheck disable=SC2046 # one or more pids
		kill -HUP $(pidof dockerd)
		i=0
		until registered; do
			i=$((i + 1))
			[ "$i" -lt 20 ] || die "dockerd did not pick up the runsc runtime from $DAEMON_JSON; see $LOG"
			sleep 0.5
		done
	fi
elif pidof systemd >/dev/null 2>&1 && command -v systemctl >/dev/null 2>&1; then
	say "starting docker.service"
	systemctl enable --now docker >/dev/null 2>&1 || systemctl restart docker
	wait_until_up
else
	# No service manager: run dockerd ourselves, detached from this shell,
	# so it outlives the script (CI and the README's commands).
	if pidof dockerd >/dev/null 2>&1; then
		die "dockerd runs (pid $(pidof dockerd)) but does not answer; see $LOG"
	fi
	say "starting dockerd (log: $LOG)"
	nohup setsid dockerd >>"$LOG" 2>&1 </dev/null &
	wait_until_up
fi

registered || die "dockerd does not list the runsc runtime with our arguments; check $DAEMON_JSON and $LOG"

# --- sandbox image --------------------------------------------------------------
# The label records which root filesystem the image came from, so a rebuilt
# rootfs is imported again instead of silently running the stale one.
[ -d "$ROOTFS/usr" ] || die "no root filesystem at $ROOTFS: build it first (vertal image build)"
stamp=$( (cat "$ROOTFS/../versions.json" 2>/dev/null || true; stat -c '%n %Y' "$ROOTFS" "$ROOTFS/usr/bin" "$ROOTFS/usr/lib" "$ROOTFS/usr/local/bin") | sha256sum | cut -c1-16)
have=$(docker image inspect --format '{{index .Config.Labels "vertal.rootfs"}}' "$IMAGE" 2>/dev/null || true)
if [ "$have" != "$stamp" ]; then
	say "importing $ROOTFS as $IMAGE"
	old=$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)
	tar -C "$ROOTFS" -c . | docker import --change "LABEL vertal.rootfs=$stamp" - "$IMAGE" >/dev/null
	# The stale image goes unless a running sandbox still uses it.
	[ -z "$old" ] || docker image rm "$old" >/dev/null 2>&1 || true
fi
say "ready: $(docker version --format 'Docker {{.Server.Version}}'), runtimes: $(docker info --format '{{range $k, $v := .Runtimes}}{{$k}} {{end}}'), image $IMAGE"
