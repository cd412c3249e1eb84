#!/usr/bin/env bash
# Runs, on this host, every test that depends on the host's cgroups and
# runtimes, and fails if any test fails or skips. scripts/vm-test.sh runs it in
# its fresh Debian 12 guest; it works on any host scripts/setup.sh supports.
#
# What it covers: the security (attack) suite on every driver/runtime pair
# (oci with crun, runc and runsc; docker with runc and runsc), cleanup after
# SIGKILL, the warm pool, the pool launchers, the doctor and its live self-test,
# the sandbox policy, and the API served end to end on a real driver (cmd/vertal's
# serve tests). What it leaves to scripts/test.sh on the CI host: the suites that
# do not touch cgroups or runtimes (store on PostgreSQL, browser, MCP client,
# image build, benchmarks).
set -euo pipefail
cd "$(dirname "$0")/../.."

# Docker with gVisor and the imported sandbox image; installs Go if missing.
scripts/setup.sh engine
export PATH=/usr/local/go/bin:$PATH

export VERTAL_E2E=1
export VERTAL_IMAGE_DIR=${VERTAL_IMAGE_DIR:-/var/lib/vertal/images/default}
export VERTAL_ROOTFS=${VERTAL_ROOTFS:-$VERTAL_IMAGE_DIR/rootfs}
export VERTAL_DOCKER_IMAGE=${VERTAL_DOCKER_IMAGE:-vertal/default:latest}

log=${VERTAL_ENGINE_TEST_LOG:-/root/go-engine.log}
echo "== engine-tests: cgroup $(stat -fc %T /sys/fs/cgroup), $(nproc) CPUs, $(go version)"
# -p 1: one package at a time, so the suites that time sandboxes (timeouts,
# CPU quotas) do not compete with each other on a small or emulated machine.
# cmd/vertal: only its serve end-to-end tests (the rest is CLI parsing, run on
# the CI host); TestTwoNodesOnPostgres needs PostgreSQL and stays on the host.
set +e
if [ -n "${VERTAL_TEST_BINARIES:-}" ]; then
  # Test binaries compiled elsewhere with `go test -c` from this same tree
  # (scripts/vm/fresh-host.sh builds them on the CI host: compiling them again
  # under emulation would only measure the emulator). Each runs in its
  # package's directory, as go test runs it. The manifest has one line per
  # package: directory, binary, extra flags.
  : >"$log"
  rc1=0
  while IFS=$'\t' read -r dir bin flags; do
    echo "=== package $dir" >>"$log"
    # shellcheck disable=SC2086 # flags are words
    if (cd "$dir" && "$VERTAL_TEST_BINARIES/$bin" -test.v -test.count=1 -test.timeout 60m $flags) >>"$log" 2>&1; then
      echo "ok  	$dir" >>"$log"
    else
      echo "FAIL	$dir" >>"$log"
      rc1=1
    fi
  done <"$VERTAL_TEST_BINARIES/manifest"
  rc2=0
else
  go test -count=1 -p 1 -timeout 60m -v \
    ./internal/engine/... ./internal/securitytest/... ./internal/doctor/... \
    >"$log" 2>&1
  rc1=$?
  go test -count=1 -timeout 30m -v -run 'E2E$' ./cmd/vertal/ >>"$log" 2>&1
  rc2=$?
fi
set -e

grep -E '^(--- (FAIL|SKIP)|FAIL|ok|panic)' "$log" || true
pass=$(grep -cE '^\s*--- PASS' "$log" || true)
fail=$(grep -cE '^\s*--- FAIL' "$log" || true)
skip=$(grep -cE '^\s*--- SKIP' "$log" || true)
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
  echo "== engine-tests: output of the failures (full log: $log):"
  grep -vE '^\s*(=== (RUN|PAUSE|CONT|NAME)|--- PASS)' "$log" | grep -vE '^(ok|PASS)\s' | tail -400
fi
if [ "$skip" -ne 0 ]; then
  echo "== engine-tests: skipped tests are not allowed:"
  grep -E '^\s*--- SKIP' -A3 "$log" | head -60
fi
echo "engine-tests: $pass passed, $fail failed, $skip skipped"
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ] || [ "$skip" -ne 0 ]; then
  echo "engine-tests: FAILED"
  exit 1
fi
echo "engine-tests: OK"
