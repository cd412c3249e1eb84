#!/usr/bin/env bash
# Proves the README on a truly fresh machine: a stock Debian 12 guest (systemd,
# Debian's kernel, pure cgroup v2, no Go, nothing of ours) booted under QEMU.
#
#   scripts/vm-test.sh [test] [--head]   the whole fresh-host proof, by hand (over
#                                        an hour under TCG): a throw-away copy of
#                                        the cached guest, this checkout copied
#                                        in, `sudo scripts/serve.sh` verbatim and
#                                        one execution per language, then every
#                                        cgroup- and runtime-dependent suite
#   scripts/vm-test.sh smoke             what CI runs (scripts/test.sh): oci+crun's
#                                        attack, cleanup and crash suites on a
#                                        throw-away copy of the guest (pure
#                                        cgroup v2); see scripts/vm/cgroup-v2-smoke.sh
#   scripts/vm-test.sh run [--head] -- CMD...
#                                        for development: boots the "dev" guest
#                                        if it is not up (it keeps its disk
#                                        between runs, so Go and the runtimes are
#                                        installed once), copies the working
#                                        tree in and runs CMD as root there
#   scripts/vm-test.sh cloud-init        by hand (11 to 16 minutes under TCG, so
#                                        not in CI): a throw-away copy of the
#                                        guest with cloud-init added boots
#                                        deploy/hetzner/cloud-init.yaml from a
#                                        NoCloud seed disk; checks the API, the
#                                        tunnel unit, the firewall and the update
#                                        timer, and exits non-zero if any check
#                                        fails; see scripts/vm/cloud-init.sh
#   scripts/vm-test.sh ssh [CMD...]      a root shell (or CMD) in the dev guest
#   scripts/vm-test.sh stop              stops the dev guest
#   scripts/vm-test.sh reset             stops it and drops its disk: fresh again
#   scripts/vm-test.sh build             builds the cached guest only
#
# The copied tree is the working tree's files as git sees them (tracked files
# as they are now, with uncommitted changes, and new files not ignored), so
# colleagues test what they have; --head copies the last commit instead.
# In a fresh clone, as in CI, both are the same.
#
# Environment:
#   VERTAL_VM_CACHE   guest images and dev-guest state (default /var/cache/vertal-vm)
#   VERTAL_VM_ACCEL   auto (default), kvm or tcg. auto uses KVM only when the CPU
#                     flags show vmx/svm and a KVM boot comes up; otherwise TCG.
#                     This CI host's /dev/kvm is PVM-backed: it hangs a stock
#                     kernel, and its CPU flags show no vmx, so auto picks TCG.
#   VERTAL_VM_CPUS    vCPUs (default 2: the doctor needs two to observe a CPU quota)
#   VERTAL_VM_MEM     guest memory (default 6G)
#   VERTAL_VM_PORT    host port forwarded to the dev guest's ssh (default 10022;
#                     the test guest takes the next one)
#
# Needs root on the host (debootstrap for the first build); installs qemu if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

cache=${VERTAL_VM_CACHE:-/var/cache/vertal-vm}
accel_want=${VERTAL_VM_ACCEL:-auto}
cpus=${VERTAL_VM_CPUS:-2}
mem=${VERTAL_VM_MEM:-6G}
dev_port=${VERTAL_VM_PORT:-10022}
test_port=$((dev_port + 1))
# Where the checkout lives inside the guest.
guest_dir=/root/vertal-run

say() { printf '== vm-test: %s\n' "$*" >&2; }
die() { say "FAIL: $*"; exit 1; }
now() { date +%s; }

[ "$(id -u)" -eq 0 ] || die "run as root (sudo $0 $*): it builds and boots a VM"

# --- the cached guest ---------------------------------------------------------
# The cache key is a hash of the recipe: a changed recipe builds a new guest.
recipe=scripts/vm/guest-image.sh
key=$(sha256sum "$recipe" | cut -c1-12)
image=$cache/guest-$key

need_host_tools() {
  local missing=()
  command -v qemu-system-x86_64 >/dev/null || missing+=(qemu-system-x86)
  command -v qemu-img >/dev/null || missing+=(qemu-utils)
  command -v debootstrap >/dev/null || missing+=(debootstrap)
  command -v ssh >/dev/null || missing+=(openssh-client)
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

build_guest() {
  if [ -f "$image/disk.raw" ]; then
    return 0
  fi
  mkdir -p "$cache"
  # One builder at a time: a second caller waits and then finds the image.
  exec {lock}>"$cache/build.lock"
  flock "$lock"
  if [ ! -f "$image/disk.raw" ]; then
    say "building the Debian 12 guest into $image (once; cached)"
    local t0
    t0=$(now)
    VERTAL_VM_DEB_CACHE=$cache/debs "$recipe" "$image"
    times+=("guest build: $(($(now) - t0))s")
    # Older guests were built from another recipe; they are of no use now.
    find "$cache" -maxdepth 1 -name 'guest-*' ! -name "guest-$key" -exec rm -rf {} +
  fi
  flock -u "$lock"
}

# --- booting ------------------------------------------------------------------
# Instance state: the dev guest keeps its disk under the cache; the test guest
# lives in a temporary directory and is thrown away.
ssh_opts() {
  echo -i "$image/id_ed25519" -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null \
    -o LogLevel=ERROR -o BatchMode=yes -o ConnectTimeout=10 -o ServerAliveInterval=30 \
    -o ServerAliveCountMax=10
}
# gssh PORT CMD...: runs CMD as root in the guest. The command goes through the
# guest's login shell, so quote it as one string.
gssh() {
  local port=$1
  shift
  # shellcheck disable=SC2046 # ssh_opts is a word list on purpose
  ssh $(ssh_opts) -p "$port" root@127.0.0.1 "$@" </dev/null
}
# gssh_in PORT CMD...: the same with this shell's stdin passed on.
gssh_in() {
  local port=$1
  shift
  # shellcheck disable=SC2046
  ssh $(ssh_opts) -p "$port" root@127.0.0.1 "$@"
}

running() { [ -f "$1/qemu.pid" ] && kill -0 "$(cat "$1/qemu.pid")" 2>/dev/null; }

# qemu_start DIR PORT ACCEL: starts QEMU on DIR/disk.qcow2 in the background.
# A mode may add QEMU arguments (qemu_extra, e.g. a seed disk) and port
# forwards (qemu_hostfwd, ",hostfwd=tcp:127.0.0.1:H-:G" each).
qemu_extra=()
qemu_hostfwd=""
qemu_start() {
  local dir=$1 port=$2 accel=$3 accel_args
  if [ "$accel" = kvm ]; then
    accel_args=(-accel kvm -cpu host)
  else
    # Multi-threaded TCG: one host thread per vCPU. -cpu max offers the guest
    # every instruction set extension TCG emulates (Node and Go check for them).
    accel_args=(-accel tcg,thread=multi -cpu max)
  fi
  rm -f "$dir/qemu.pid"
  : >"$dir/console.log"
  # The kernel command line only says where the root filesystem is and where
  # the console goes: no cgroup flags, so systemd mounts pure cgroup v2 as on
  # any stock Debian 12 machine.
  qemu-system-x86_64 -name "vertal-$(basename "$dir")" "${accel_args[@]}" \
    -smp "$cpus" -m "$mem" -nodefaults -display none \
    -kernel "$image/vmlinuz" -initrd "$image/initrd.img" \
    -append "root=/dev/vda ro console=ttyS0" \
    -drive "file=$dir/disk.qcow2,if=virtio,format=qcow2,cache=unsafe,discard=unmap" \
    -netdev "user,id=net0,hostfwd=tcp:127.0.0.1:$port-:22$qemu_hostfwd" -device virtio-net-pci,netdev=net0 \
    "${qemu_extra[@]+"${qemu_extra[@]}"}" \
    -device virtio-rng-pci \
    -serial "file:$dir/console.log" \
    -daemonize -pidfile "$dir/qemu.pid"
  echo "$accel" >"$dir/accel"
}

# wait_ssh DIR PORT SECONDS: until the guest answers over ssh.
wait_ssh() {
  local dir=$1 port=$2 limit=$3 t0
  t0=$(now)
  while ! gssh "$port" true 2>/dev/null; do
    running "$dir" || return 1
    [ $(($(now) - t0)) -lt "$limit" ] || return 1
    sleep 3
  done
}

qemu_stop() {
  local dir=$1 port=$2 pid
  running "$dir" || return 0
  pid=$(cat "$dir/qemu.pid")
  # A clean shutdown keeps the dev guest's disk consistent; kill if it hangs.
  gssh "$port" 'systemctl poweroff' >/dev/null 2>&1 || true
  for _ in $(seq 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  kill "$pid" 2>/dev/null || true
  sleep 1
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$dir/qemu.pid"
}

kvm_usable() {
  [ -w /dev/kvm ] && grep -qwE 'vmx|svm' /proc/cpuinfo
}

# boot DIR PORT: boots the guest whose disk is DIR/disk.qcow2 and waits for ssh.
boot() {
  local dir=$1 port=$2 accel t0
  if ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
    die "port $port is taken on the host; set VERTAL_VM_PORT to a free one"
  fi
  t0=$(now)
  case "$accel_want" in
    kvm) accel=kvm ;;
    tcg) accel=tcg ;;
    auto)
      accel=tcg
      if kvm_usable; then
        # The probe is a real boot: a host whose KVM cannot run a stock
        # kernel (like a PVM-backed /dev/kvm) never answers, so fall back.
        say "trying KVM"
        qemu_start "$dir" "$port" kvm
        if wait_ssh "$dir" "$port" 120; then
          accel=kvm
        else
          say "KVM boot did not come up in 120s; using TCG emulation"
          kill -9 "$(cat "$dir/qemu.pid" 2>/dev/null)" 2>/dev/null || true
          sleep 1
        fi
      fi
      ;;
    *) die "VERTAL_VM_ACCEL must be auto, kvm or tcg, not $accel_want" ;;
  esac
  if ! running "$dir" || [ "$(cat "$dir/accel" 2>/dev/null)" != "$accel" ]; then
    say "booting the guest ($accel, $cpus vCPUs, $mem)"
    qemu_start "$dir" "$port" "$accel"
    if ! wait_ssh "$dir" "$port" 900; then
      tail -n 40 "$dir/console.log" >&2 || true
      qemu_stop "$dir" "$port"
      die "the guest did not answer over ssh (console: $dir/console.log)"
    fi
  fi
  # Marks the guest as one, so scripts/test.sh run inside it does not start
  # a VM in the VM.
  gssh "$port" 'touch /etc/vertal-vm-guest'
  boot_secs=$(($(now) - t0))
  times+=("boot ($accel): ${boot_secs}s")
  say "guest up after ${boot_secs}s"
}

# new_disk DIR: a copy-on-write disk over the cached guest, so the cached
# image itself is never written.
new_disk() {
  qemu-img create -q -f qcow2 -b "$image/disk.raw" -F raw "$1/disk.qcow2"
  echo "$key" >"$1/key"
}

# throwaway_disk KIND PORT: sets the caller's dir to a new instance directory
# $cache/KIND.XXXXXX with a copy-on-write disk, stopped and removed on exit;
# removes those of earlier runs that were killed before their trap ran. On
# disk under the cache, not in a tmpfs: the disk grows by several GB.
throwaway_disk() {
  local kind=$1 port=$2 d
  for d in "$cache/$kind".*; do
    if [ -d "$d" ] && ! running "$d"; then rm -rf "$d"; fi
  done
  dir=$(mktemp -d "$cache/$kind.XXXXXX")
  # shellcheck disable=SC2064 # expand now: the trap must know this run's dir
  trap "qemu_stop '$dir' '$port'; rm -rf '$dir'" EXIT
  new_disk "$dir"
}

# --- copying the checkout in --------------------------------------------------
# tree_tar [--head]: this checkout as a tar stream on stdout.
tree_tar() {
  if [ "${1:-}" = --head ]; then
    git -C "$repo" archive --format=tar HEAD
  elif git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
    # Tracked files as they are now plus new files git does not ignore; no
    # build output (bin/, node_modules) and nothing deleted.
    git -C "$repo" ls-files -z --cached --others --exclude-standard |
      (cd "$repo" && xargs -0 sh -c 'for f; do [ -e "$f" ] || [ -L "$f" ] && printf "%s\0" "$f"; done' sh) |
      tar -C "$repo" --null -T - -cf -
  else
    tar -C "$repo" --exclude=./bin --exclude=node_modules -cf - .
  fi
}

# sync_tree PORT [--head]: makes $guest_dir hold exactly the tree. Not by
# removing the directory first: a colleague's command may be running in it on
# the shared dev guest. tar replaces each file with a new one (a running script
# keeps reading its old copy); files that are no longer in the tree are then
# removed, except build output (bin/, node_modules, .cache).
sync_tree() {
  local port=$1 how=${2:-}
  # shellcheck disable=SC2016 # expanded in the guest
  tree_tar $how | gssh_in "$port" "mkdir -p $guest_dir && cd $guest_dir && l=\$(mktemp) &&
    tar -xvf - | sort >\$l.want &&
    find . \( -path ./bin -o -path ./.cache -o -name node_modules \) -prune -o \( -type f -o -type l \) -print |
      sed 's|^\./||' | sort | comm -23 - \$l.want | tr '\n' '\0' | xargs -0 -r rm -f &&
    rm -f \$l \$l.want"
}

# --- dev guest: run, ssh, stop, reset -----------------------------------------
dev=$cache/dev
dev_up() {
  need_host_tools
  build_guest
  mkdir -p "$dev"
  if [ -f "$dev/disk.qcow2" ] && [ "$(cat "$dev/key" 2>/dev/null)" != "$key" ]; then
    say "the guest recipe changed; starting the dev guest fresh"
    qemu_stop "$dev" "$dev_port"
    rm -f "$dev/disk.qcow2"
  fi
  [ -f "$dev/disk.qcow2" ] || new_disk "$dev"
  running "$dev" || boot "$dev" "$dev_port"
}

cmd_run() {
  local how=""
  while [ $# -gt 0 ]; do
    case "$1" in
      --head) how=--head; shift ;;
      --) shift; break ;;
      *) break ;;
    esac
  done
  [ $# -gt 0 ] || die "usage: $0 run [--head] -- CMD..."
  dev_up
  say "copying the working tree${how:+ (HEAD)} to $guest_dir"
  sync_tree "$dev_port" "$how"
  # As with ssh, the words of CMD are joined and run by the guest's shell, as
  # root in the checkout, with /usr/local/go/bin (where setup.sh puts Go) on
  # PATH; its exit status is ours. stdin is passed on.
  # shellcheck disable=SC2046
  ssh $(ssh_opts) -p "$dev_port" root@127.0.0.1 "cd $guest_dir && export PATH=/usr/local/go/bin:\$PATH && $*"
}

cmd_ssh() {
  dev_up
  # shellcheck disable=SC2046
  if [ $# -gt 0 ]; then
    ssh $(ssh_opts) -p "$dev_port" root@127.0.0.1 "$@"
  else
    ssh -t $(ssh_opts) -p "$dev_port" root@127.0.0.1
  fi
}

# --- the fresh-host proof -----------------------------------------------------
cmd_smoke() {
  # shellcheck source=scripts/vm/fresh-host.sh
  . scripts/vm/fresh-host.sh
  # shellcheck source=scripts/vm/cgroup-v2-smoke.sh
  . scripts/vm/cgroup-v2-smoke.sh
  cgroup_v2_smoke "$@"
}
cmd_cloud_init() {
  # shellcheck source=scripts/vm/cloud-init.sh
  . scripts/vm/cloud-init.sh
  cloud_init_test "$@"
}
cmd_test() {
  # shellcheck source=scripts/vm/fresh-host.sh
  . scripts/vm/fresh-host.sh
  fresh_host_test "$@"
}

times=()
sub=${1:-test}
[ $# -eq 0 ] || shift
case "$sub" in
  test) cmd_test "$@" ;;
  smoke) cmd_smoke "$@" ;;
  cloud-init) cmd_cloud_init "$@" ;;
  --head) cmd_test --head "$@" ;;
  run) cmd_run "$@" ;;
  ssh) cmd_ssh "$@" ;;
  stop) qemu_stop "$dev" "$dev_port" ;;
  reset) qemu_stop "$dev" "$dev_port"; rm -rf "$dev"; say "dev guest dropped" ;;
  build) need_host_tools; build_guest; say "guest ready: $image" ;;
  *) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
