#!/usr/bin/env bash
# Runs every test of Vertal Run against real components: OCI runtimes (crun,
# runc, runsc), a Docker engine with gVisor, SQLite and PostgreSQL, headless
# Chromium and the official MCP TypeScript client. Installs and starts what is
# missing first (scripts/setup.sh test). Needs root. Fails if any test skips.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$PATH:/usr/local/go/bin

scripts/setup.sh test

export VERTAL_E2E=1
export VERTAL_ROOTFS=${VERTAL_ROOTFS:-/var/lib/vertal/images/default/rootfs}
export VERTAL_IMAGE_DIR=${VERTAL_IMAGE_DIR:-/var/lib/vertal/images/default}
export VERTAL_DOCKER_IMAGE=${VERTAL_DOCKER_IMAGE:-vertal/default:latest}
export VERTAL_TEST_DATABASE_URL=${VERTAL_TEST_DATABASE_URL:-postgres://vertal:vertal@127.0.0.1:5432/vertal?sslmode=disable}

# Logs stay after the run, for a look at what failed.
out=${VERTAL_TEST_LOGS:-/tmp/vertal-test-logs}
rm -rf "$out" && mkdir -p "$out"

echo "== go vet"
go vet ./...

# The engineering gates: go.mod and go.sum tidy, staticcheck and actionlint
# clean (pinned releases, run from the module proxy without touching go.mod).
echo "== go mod tidy -diff"
go mod tidy -diff
echo "== staticcheck"
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
# The GitHub Actions workflows, with shellcheck on their run: scripts
# (settings in .github/actionlint.yaml).
echo "== actionlint"
go run github.com/rhysd/actionlint/cmd/actionlint@v1.7.12

# Unit tests once more under the race detector (the end-to-end suites,
# gated by VERTAL_E2E and a database URL, run in the pass below: under the
# detector's load on two cores, sandbox start-up times stop being those of
# a real host).
echo "== go test -race (unit tests)"
env -u VERTAL_E2E -u VERTAL_TEST_DATABASE_URL go test -race -count=1 -timeout 15m ./... >"$out/race.log" 2>&1 || {
  echo "== go test -race failed:"; grep -vE '^(ok|\?)\s' "$out/race.log" | tail -200; echo "tests: FAILED"; exit 1; }
grep -E '^(ok|FAIL)\s' "$out/race.log" | sed 's/^/race: /'

# Every fuzz target for a bounded time from its committed seed corpus
# (scripts/fuzz.sh; FUZZTIME, 10 s each by default, which keeps the 19
# targets near 4 minutes). A failing input is left under the package's
# testdata/fuzz/ to commit with the fix.
echo "== go test -fuzz (every target, ${FUZZTIME:-10s} each)"
env -u VERTAL_E2E -u VERTAL_TEST_DATABASE_URL bash scripts/fuzz.sh >"$out/fuzz.log" 2>&1 || {
  cat "$out/fuzz.log"; echo "tests: FAILED (fuzz)"; exit 1; }
grep -E '^fuzz: ' "$out/fuzz.log" | tail -1

echo "== go test"
set +e
go test -count=1 -timeout 25m -v ./... >"$out/go.log" 2>&1
go_rc=$?
set -e
grep -E '^(=== RUN|--- (PASS|FAIL|SKIP)|PASS|FAIL|ok|panic)' "$out/go.log" | grep -v '^=== RUN' | grep -vE '^\s*--- PASS' || true
if [ $go_rc -ne 0 ]; then
  echo "== go test failed; test output other than progress lines (full log: $out/go.log):"
  grep -vE '^\s*(=== (RUN|PAUSE|CONT|NAME)|--- PASS)' "$out/go.log" | grep -vE '^(ok|PASS)\s' | tail -800
fi
skips=$(grep -cE '^\s*--- SKIP' "$out/go.log" || true)
go_pass=$(grep -cE '^\s*--- PASS' "$out/go.log" || true)
go_fail=$(grep -cE '^\s*--- FAIL' "$out/go.log" || true)

echo
echo "go: $go_pass passed, $go_fail failed, $skips skipped"
if [ "$skips" -ne 0 ]; then
  echo "skipped tests are not allowed in CI:"; grep -E '^\s*--- SKIP' -A3 "$out/go.log" | head -60
fi
if [ $go_rc -ne 0 ] || [ "$skips" -ne 0 ]; then
  echo "tests: FAILED"
  exit 1
fi
echo "tests: OK on this host"

# Pure cgroup v2, which this host (a v1/v2 hybrid) cannot show: oci+crun's
# attack, cleanup and crash suites in a stock Debian 12 guest under QEMU
# (scripts/vm-test.sh smoke; the whole fresh-host proof, `scripts/vm-test.sh
# test`, takes over an hour under emulation and is run by hand). CI always runs
# it. Locally, VERTAL_SKIP_VM=1 leaves it out; inside that guest it is left out
# by itself (no VM in the VM).
if [ -e /etc/vertal-vm-guest ]; then
  echo "== fresh-host VM: not run (this is the VM)"
elif [ "${VERTAL_SKIP_VM:-}" = 1 ] && [ "${CI:-}" != true ]; then
  echo "== fresh-host VM: skipped (VERTAL_SKIP_VM=1); CI always runs it"
else
  echo "== pure cgroup v2 in a Debian 12 VM (scripts/vm-test.sh smoke)"
  if ! scripts/vm-test.sh smoke; then
    echo "tests: FAILED (fresh-host VM)"
    exit 1
  fi
fi
echo "tests: OK"
