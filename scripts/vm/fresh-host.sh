# Sourced by scripts/vm-test.sh: the fresh-host proof, `scripts/vm-test.sh test`.
#
# On a throw-away copy of the cached stock Debian 12 guest:
#   1. checks it is what a self-hoster has: systemd as PID 1, pure cgroup v2
#      (cgroup2fs), no Go;
#   2. copies this checkout in and runs the README's first command verbatim,
#      `sudo scripts/serve.sh`, as root in the checkout; waits for the API,
#      reads the printed development key, runs one execution per language with
#      the README's curl and checks the output; stops the server;
#   3. runs scripts/vm/engine-tests.sh there: every suite that depends on the
#      host's cgroups and runtimes, zero skips.
# Prints the measured times and PASS or FAIL; returns non-zero on any failure.
#
# Why not the README's whole second command (scripts/test.sh) in the guest: under
# TCG emulation on this 2-core CI host, compiling and running every package
# (the API, store, web/Chromium, MCP client suites) would add far more than
# CI's budget allows, and none of those depend on the host's cgroups or
# runtimes: CI already runs them on the host right before this. The guest runs
# what differs between hosts: the engine, pool, doctor, sandbox and serve-level
# suites on every driver/runtime pair.

# Seconds each step may take before the run is failed. TCG is slow: on the
# 2-core CI host, busy with other work, `sudo scripts/serve.sh` took more than
# 45 minutes on the fresh guest (apt's ~400 packages for npm, Go's first
# build of vertal). These are safety nets, not targets.
serve_limit=${VERTAL_VM_SERVE_TIMEOUT:-5400}
suite_limit=${VERTAL_VM_SUITE_TIMEOUT:-5400}

# guest_job PORT NAME LIMIT SCRIPT: runs SCRIPT (bash, from stdin of this
# function's caller) in the guest in the background, detached from ssh so a
# dropped connection cannot kill it; streams its log here and returns its exit
# status. The log stays in the guest as /root/NAME.log.
guest_job() {
  local port=$1 name=$2 limit=$3 script t0 off=0 size rc
  script=$(cat)
  printf '%s\n' "$script" | gssh_in "$port" "cat >/root/$name.sh && rm -f /root/$name.rc /root/$name.log &&
    (cd $guest_dir && setsid nohup bash -c 'bash /root/$name.sh; echo \$? >/root/$name.rc' >/root/$name.log 2>&1 </dev/null &)"
  t0=$(now)
  while :; do
    sleep 10
    # Stream what the job printed since the last look.
    size=$(gssh "$port" "stat -c %s /root/$name.log" 2>/dev/null || echo "$off")
    if [ "$size" -gt "$off" ]; then
      gssh "$port" "tail -c +$((off + 1)) /root/$name.log | head -c $((size - off))" | sed "s/^/  [$name] /" || true
      off=$size
    fi
    rc=$(gssh "$port" "cat /root/$name.rc 2>/dev/null" || true)
    if [ -n "$rc" ]; then
      return "$rc"
    fi
    if [ $(($(now) - t0)) -ge "$limit" ]; then
      say "$name still running after ${limit}s"
      return 124
    fi
  done
}

# The one cache that crosses into the guest: Go's build cache, saved from the
# last run's guest and restored into the next one. Under TCG, compiling is most
# of the guest's time. It does not weaken the proof: Go itself is still
# installed by setup.sh from the proxy, every package and image is still
# fetched and built fresh, and the build cache only skips compiling inputs
# that hash identically (the go command checks, as on any machine). A fresh
# CI machine has no cache and takes the cold path. VERTAL_VM_GOCACHE=0 turns
# it off for a fully cold run.
gocache=$cache/go-build
gocache_restore() {
  [ "${VERTAL_VM_GOCACHE:-1}" = 1 ] && [ -d "$gocache" ] || return 0
  say "restoring the Go build cache of the last run ($(du -sh "$gocache" | cut -f1))"
  tar -C "$gocache" -cf - . | gssh_in "$1" 'mkdir -p /root/.cache/go-build && tar -C /root/.cache/go-build -xf -' ||
    say "could not restore the Go build cache; compiling from scratch"
}
gocache_save() {
  [ "${VERTAL_VM_GOCACHE:-1}" = 1 ] || return 0
  rm -rf "$gocache.new" && mkdir -p "$gocache.new"
  # The go command trims entries unused for five days by itself, so the cache
  # does not grow without end across runs.
  if gssh "$1" 'test -d /root/.cache/go-build && tar -C /root/.cache/go-build -cf - .' | tar -C "$gocache.new" -xf -; then
    rm -rf "$gocache" && mv "$gocache.new" "$gocache"
  else
    rm -rf "$gocache.new"
  fi
}

# build_test_binaries PORT: compiles the engine suites' test binaries here,
# with this host's Go, from the tree that was copied in, and puts them in the
# guest's /root/vertal-test-bin with a manifest for engine-tests.sh. Go in the
# guest was already proven by `sudo scripts/serve.sh` building vertal there;
# compiling a second, larger set of packages under TCG would add a long wait
# that proves nothing about the host. The tests themselves run in the guest,
# on its kernel, cgroups and runtimes. Returns non-zero (the guest then
# compiles) when this host has no Go as new as go.mod's.
build_test_binaries() {
  local port=$1 tb src rel bin flags want have
  PATH=/usr/local/go/bin:$PATH
  want=$(awk '$1 == "go" { print $2; exit }' go.mod)
  have=$(GOTOOLCHAIN=local go env GOVERSION 2>/dev/null | sed 's/^go//') || return 1
  [ -n "$have" ] && [ "$(printf '%s\n' "$want" "$have" | sort -V | head -n1)" = "$want" ] || return 1
  tb=$(mktemp -d)
  src=$(mktemp -d)
  # The same files the guest has, not this checkout's build output.
  tree_tar $how | tar -C "$src" -xf -
  say "compiling the engine suites' test binaries on this host (go $have)"
  : >"$tb/manifest"
  for rel in $(cd "$src" && go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.Dir}}{{end}}' \
    ./internal/engine/... ./internal/securitytest/... ./internal/doctor/... ./cmd/vertal/ |
    sed "s|^$src/||"); do
    bin=$(echo "$rel" | tr / _).test
    flags=""
    # cmd/vertal: only its serve end-to-end tests (see engine-tests.sh).
    [ "$rel" = cmd/vertal ] && flags="-test.run E2E\$"
    (cd "$src" && go test -c -o "$tb/$bin" "./$rel") || { rm -rf "$tb" "$src"; return 1; }
    printf '%s\t%s\t%s\n' "$rel" "$bin" "$flags" >>"$tb/manifest"
  done
  tar -C "$tb" -cf - . | gssh_in "$port" 'rm -rf /root/vertal-test-bin && mkdir -p /root/vertal-test-bin && tar -C /root/vertal-test-bin -xf -'
  rm -rf "$tb" "$src"
}

fresh_host_test() {
  local how="" port=$test_port dir t0 api_key lang out failed=0 rc summary
  [ "${1:-}" = --head ] && how=--head
  local total0
  total0=$(now)
  need_host_tools
  build_guest

  throwaway_disk test "$port"
  boot "$dir" "$port"

  say "checking the guest is a fresh stock Debian 12"
  gssh "$port" 'set -e
    . /etc/os-release; echo "os: $PRETTY_NAME, kernel $(uname -r)"
    echo "PID 1: $(readlink /proc/1/exe)"; [ "$(readlink /proc/1/exe)" = /usr/lib/systemd/systemd ]
    echo "cgroup: $(stat -fc %T /sys/fs/cgroup)"; [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]
    if command -v go || [ -e /usr/local/go ]; then echo "Go is preinstalled"; exit 1; fi
    echo "Go: none"
    for h in deb.debian.org proxy.golang.org registry.npmjs.org; do
      # Any HTTP answer will do: this checks the route and TLS trust.
      curl -sS -o /dev/null --max-time 30 "https://$h/" || { echo "cannot reach $h over https"; exit 1; }
      echo "reaches $h"
    done' || die "the guest is not a fresh Debian 12 on pure cgroup v2 with the registries reachable"

  say "copying the checkout${how:+ (HEAD)} to $guest_dir"
  sync_tree "$port" "$how"
  gocache_restore "$port"

  # --- the README's first command ---------------------------------------------
  local readme_cmd
  readme_cmd=$(grep -m1 -o '^sudo scripts/serve.sh' README.md) ||
    die "README.md no longer starts with 'sudo scripts/serve.sh'; update scripts/vm/fresh-host.sh"
  say "running '$readme_cmd' in the guest"
  t0=$(now)
  # Started from the ssh session, as a newcomer would, and left running.
  gssh "$port" "cd $guest_dir && (setsid nohup $readme_cmd >/root/serve.log 2>&1 </dev/null & echo \$! >/root/serve.pid)"
  local off=0 size up=0
  while [ $(($(now) - t0)) -lt "$serve_limit" ]; do
    sleep 10
    size=$(gssh "$port" "stat -c %s /root/serve.log" 2>/dev/null || echo "$off")
    if [ "$size" -gt "$off" ]; then
      gssh "$port" "tail -c +$((off + 1)) /root/serve.log | head -c $((size - off))" | sed 's/^/  [serve] /' || true
      off=$size
    fi
    if gssh "$port" 'curl -fsS -o /dev/null --max-time 5 http://127.0.0.1:8080/health' 2>/dev/null; then
      up=1
      break
    fi
    gssh "$port" 'kill -0 "$(cat /root/serve.pid)"' 2>/dev/null || break
  done
  if [ "$up" -ne 1 ]; then
    gssh "$port" 'tail -n 40 /root/serve.log' >&2 || true
    die "'$readme_cmd' did not bring the API up (log above; $(($(now) - t0))s)"
  fi
  local serve_secs=$(($(now) - t0))
  times+=("serve-ready ('$readme_cmd' on the fresh guest, incl. Go, runtimes, image): ${serve_secs}s")
  say "API up after ${serve_secs}s"

  api_key=$(gssh "$port" "grep -o -m1 'kubo_sk_[A-Za-z0-9_-]*' /root/serve.log") || die "serve.sh printed no development key"
  # The README's curl, once per language; the answer must carry the program's output.
  for lang in python:'print(6 * 7)' javascript:'console.log(6 * 7)' bash:'echo $((6 * 7))'; do
    local code=${lang#*:} name=${lang%%:*} body
    body=$(printf '{"language": "%s", "code": "%s"}' "$name" "$code")
    out=$(gssh "$port" "curl -sS -X POST http://127.0.0.1:8080/api/v1/executions \
      -H 'Authorization: Bearer $api_key' \
      -H 'Content-Type: application/json' \
      -d '$body'") || out="(curl failed) $out"
    if printf '%s' "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(0 if r.get("stdout")=="42\n" and r.get("exit_code")==0 else 1)' 2>/dev/null; then
      say "$name: 42 ok"
    else
      say "$name: wrong answer: $out"
      failed=1
    fi
  done
  # Stop it as Ctrl-C would: sudo passes the signal on to vertal serve.
  gssh "$port" 'kill -INT "$(cat /root/serve.pid)"; for i in $(seq 60); do kill -0 "$(cat /root/serve.pid)" 2>/dev/null || exit 0; sleep 1; done; echo "serve did not stop"; exit 1' ||
    failed=1
  [ "$failed" -eq 0 ] || die "the README's first command does not answer one execution per language"

  # --- the cgroup- and runtime-dependent suites -------------------------------
  say "running the engine suites in the guest (scripts/vm/engine-tests.sh)"
  t0=$(now)
  local job="exec scripts/vm/engine-tests.sh"
  if [ "${VERTAL_VM_COMPILE_IN_GUEST:-0}" != 1 ] && build_test_binaries "$port"; then
    job="VERTAL_TEST_BINARIES=/root/vertal-test-bin exec scripts/vm/engine-tests.sh"
  fi
  set +e
  guest_job "$port" engine-tests "$suite_limit" <<<"$job"
  rc=$?
  set -e
  times+=("engine suites in the guest (setup.sh engine + go test): $(($(now) - t0))s")
  summary=$(gssh "$port" "grep -E '^engine-tests:' /root/engine-tests.log | tail -n 3" || true)
  gocache_save "$port"

  # Copy the logs out for a look at what failed.
  local logs=${VERTAL_VM_LOGS:-/tmp/vertal-vm-logs}
  rm -rf "$logs" && mkdir -p "$logs"
  for f in serve.log engine-tests.log go-engine.log; do
    gssh "$port" "cat /root/$f 2>/dev/null || cat $guest_dir/.vm-logs/$f 2>/dev/null" >"$logs/$f" || true
  done

  times+=("whole vm-test: $(($(now) - total0))s")
  echo
  say "times:"
  printf '   %s\n' "${times[@]}" >&2
  [ -z "$summary" ] || printf '%s\n' "$summary" >&2
  say "logs in $logs"
  if [ "$rc" -ne 0 ]; then
    say "FAIL: the engine suites failed in the fresh Debian 12 guest (exit $rc)"
    return 1
  fi
  say "PASS: the README's first command serves and the engine suites pass on a fresh Debian 12 (pure cgroup v2)"
}
