# Sourced by scripts/vm-test.sh: `scripts/vm-test.sh smoke`, the part of the
# fresh-host proof that fits in every CI run.
#
# The whole proof (`scripts/vm-test.sh test`: the README's first command
# verbatim on a fresh guest, then every engine suite) takes well over an hour
# under TCG emulation on a 2-core host: apt installs ~400 packages for npm,
# setup.sh bootstraps Go, and Go compiles vertal, all emulated. CI has 90
# minutes for everything, and the team's budget is 30. So every CI run proves
# the one thing this host cannot show, on a throw-away copy of the cached
# stock Debian 12 guest (systemd as PID 1, Debian's kernel, pure cgroup v2):
#
#   1. the guest really is on the unified hierarchy only, under systemd;
#   2. the oci driver with crun (the default) and with runc, installed from
#      Debian as `scripts/setup.sh serve` does, passes the whole attack suite
#      there, cold and through the warm pool, leaves nothing behind for any
#      kind of outcome, and reaps what a SIGKILLed server left: memory.max +
#      swap.max, pids.max, cpu.max, memory_exceeded from memory.events,
#      cgroup.kill, a host uid per sandbox, each proven by an attack.
#
# The test binary is compiled on this host from the same tree and the sandbox
# root filesystem is the one this host built (both are proven on the host by
# scripts/test.sh right before); compiling or debootstrapping again under
# emulation would only measure the emulator. runsc and docker on v2 are
# covered by the full proof, run by hand (under TCG a cold gVisor start takes
# 15-20 s, so its suite takes most of an hour): see the README.

smoke_limit=${VERTAL_VM_SMOKE_TIMEOUT:-2400}

cgroup_v2_smoke() {
  local port=$((dev_port + 2)) dir t0 total0 rc tb log
  total0=$(now)
  need_host_tools
  build_guest
  local image_dir=${VERTAL_IMAGE_DIR:-/var/lib/vertal/images/default}
  [ -f "$image_dir/versions.json" ] || die "no sandbox image at $image_dir (scripts/setup.sh builds it)"

  for dir in "$cache"/smoke.*; do
    if [ -d "$dir" ] && ! running "$dir"; then rm -rf "$dir"; fi
  done
  dir=$(mktemp -d "$cache/smoke.XXXXXX")
  tb=$(mktemp -d)
  # shellcheck disable=SC2064 # expand now: the trap must know this run's dir
  trap "qemu_stop '$dir' '$port'; rm -rf '$dir' '$tb'" EXIT
  new_disk "$dir"
  boot "$dir" "$port"

  say "checking the guest: systemd as PID 1, pure cgroup v2"
  gssh "$port" 'set -e
    . /etc/os-release; echo "os: $PRETTY_NAME, kernel $(uname -r)"
    [ "$(readlink /proc/1/exe)" = /usr/lib/systemd/systemd ]; echo "PID 1: systemd"
    [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; echo "cgroup: cgroup2fs only"
    ! awk '"'"'$3 == "cgroup" { found = 1 } END { exit !found }'"'"' /proc/mounts || { echo "a cgroup v1 hierarchy is mounted"; exit 1; }' ||
    die "the guest is not a stock Debian 12 on pure cgroup v2"

  t0=$(now)
  say "installing crun, runc, bubblewrap and tini from Debian in the guest, as scripts/setup.sh serve does, and fakeroot (the security suite preloads its stock library)"
  gssh "$port" 'export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq &&
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends crun runc bubblewrap tini fakeroot >/dev/null &&
    crun --version | head -1' || die "apt-get install crun runc bubblewrap tini fakeroot failed in the guest"
  times+=("apt-get install crun runc bubblewrap tini in the guest: $(($(now) - t0))s")

  t0=$(now)
  say "copying the checkout, the sandbox image and the oci and pool test binaries in"
  sync_tree "$port"
  tar -C "$image_dir" -cf - . | gssh_in "$port" "mkdir -p /var/lib/vertal/images/default && tar -C /var/lib/vertal/images/default -xf -"
  PATH=/usr/local/go/bin:$PATH
  (tree_tar | tar -C "$tb" -xf - && cd "$tb" && go test -c -o "$tb/oci.test" ./internal/engine/oci &&
    go test -c -o "$tb/pool.test" ./internal/engine/pool) || die "compiling the test binaries"
  gssh_in "$port" "cat >/root/oci.test && chmod +x /root/oci.test" <"$tb/oci.test"
  gssh_in "$port" "cat >/root/pool.test && chmod +x /root/pool.test" <"$tb/pool.test"
  times+=("copying tree, image and test binary: $(($(now) - t0))s")

  t0=$(now)
  say "running the oci suites for crun, runc and bwrap in the guest (attack suite cold and warm, cleanup, reap after SIGKILL)"
  set +e
  guest_job "$port" smoke "$smoke_limit" <<'EOF'
export VERTAL_E2E=1 VERTAL_IMAGE_DIR=/var/lib/vertal/images/default VERTAL_ROOTFS=/var/lib/vertal/images/default/rootfs
(cd internal/engine/oci && /root/oci.test -test.v -test.count=1 -test.timeout 45m \
  -test.run '^(TestSecuritySuite|TestNothingLeftBehind|TestReapAfterCrash)$/^(crun|runc|bwrap)$') >/root/smoke-go.log 2>&1
rc=$?
(cd internal/engine/pool && /root/pool.test -test.v -test.count=1 -test.timeout 45m \
  -test.run '^(TestSecuritySuiteThroughPool|TestNoLeftovers)$/^(crun|runc|bwrap)$') >>/root/smoke-go.log 2>&1 || rc=1
pass=$(grep -cE '^\s*--- PASS' /root/smoke-go.log)
fail=$(grep -cE '^\s*--- FAIL' /root/smoke-go.log)
skip=$(grep -cE '^\s*--- SKIP' /root/smoke-go.log)
grep -E '^\s*--- (FAIL|SKIP)' -A12 /root/smoke-go.log | head -200
echo "smoke: $pass passed, $fail failed, $skip skipped"
# A filter that matched nothing would pass vacuously: the attack suite alone
# has ~48 cases per runtime, run four times here.
[ "$rc" -eq 0 ] && [ "$skip" -eq 0 ] && [ "$pass" -ge 180 ]
EOF
  rc=$?
  set -e
  times+=("oci suites (crun, runc, bwrap; cold and warm) in the guest: $(($(now) - t0))s")
  log=${VERTAL_VM_LOGS:-/tmp/vertal-vm-logs}
  mkdir -p "$log"
  gssh "$port" 'cat /root/smoke-go.log' >"$log/smoke-go.log" 2>/dev/null || true

  times+=("whole smoke: $(($(now) - total0))s")
  say "times:"
  printf '   %s\n' "${times[@]}" >&2
  say "guest test log: $log/smoke-go.log"
  if [ "$rc" -ne 0 ]; then
    say "FAIL: the oci driver on pure cgroup v2 (exit $rc)"
    return 1
  fi
  say "PASS: oci with crun, runc and bwrap, cold and warm, enforces every protection on a stock Debian 12 with pure cgroup v2"
}
