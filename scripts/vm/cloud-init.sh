# shellcheck shell=bash disable=SC2154,SC2034 # sourced by vm-test.sh: it sets dev_port, cache, image and reads qemu_extra, qemu_hostfwd
# Sourced by scripts/vm-test.sh: `scripts/vm-test.sh cloud-init`, the first
# boot of deploy/hetzner/cloud-init.yaml on a fresh Debian 12, by hand (under
# TCG it takes long; CI validates the file's schema instead, tests/deploy).
#
# On a throw-away copy of the cached guest:
#   1. installs Debian's cloud-init (a cloud image has it; our guest is a
#      plain server install) and clears its state, so the next boot is a
#      first boot;
#   2. makes a NoCloud seed disk (genisoimage, volume id cidata) whose
#      user-data is the file as shipped with its fill-ins replaced: a random
#      edge secret, a dummy tunnel token, this guest's ssh key, and the
#      API image: VERTAL_VM_API_IMAGE, or else vertal/api:vm-test built
#      from this checkout as tests/deploy builds it (no registry is
#      reachable here, so the image is copied in and `docker load`ed once
#      cloud-init's docker.io is up; the unit's ExecStartPre pull
#      fails until then and systemd restarts it, as on a server whose
#      registry is slow);
#   3. reboots with the seed and checks: cloud-init done without errors, GET
#      /health inside, one execution through the edge secret (python
#      print(6 * 7) gives 42) and a 403 without it, vertal status and logs,
#      the tunnel unit enabled and retrying (activating, its restart count
#      rising: cloudflared cannot reach Cloudflare here), `ss -ltnp` with
#      only :22 listening on a non-loopback address, and from the host:
#      sshd's banner through the forwarded :22, no answer through the
#      forwarded :8080, nor through :9999 with a guest listener behind it,
#      which does answer once a rule for it is added (so the firewall is
#      what stops it), and the rule gone after `systemctl reload nftables`;
#   4. the update timer: enabled and active; its service with nothing new
#      leaves the API alone (same container, same unit invocation), and
#      with a newer image under the same tag (docker commit of the running
#      container, retagged) restarts the API onto it.
# Any failed check makes the run exit non-zero. The guest's cloud-init logs
# and the units' journal are copied to VERTAL_VM_CLOUD_INIT_LOGS (default
# $cache/cloud-init-logs) before the guest is thrown away.
#
# VERTAL_VM_CLOUD_INIT_UPGRADE=0 turns the file's package_upgrade off in the
# seed only (the shipped file keeps it on): under TCG the upgrade (a new
# kernel and its initramfs) takes over 10 minutes by itself.
# Prints the measured times and PASS or FAIL.

ci_limit=${VERTAL_VM_CLOUD_INIT_TIMEOUT:-5400}

# expect WHAT GOT WANT: says whether GOT is WANT; false when not.
expect() {
  if [ "$2" = "$3" ]; then
    say "$1: $2 ok"
  else
    say "$1: $2, want $3"
    return 1
  fi
}
# host_probe PORT: the HTTP status an attempt from the host gets (000: none).
host_probe() { curl -s -o /dev/null -w '%{http_code}' --max-time 10 "http://127.0.0.1:$1/" || true; }
# host_banner PORT: the first 7 bytes the guest's service behind PORT sends.
host_banner() { timeout 10 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && head -c 7 <&3" 2>/dev/null || true; }

# save_guest_logs PORT: copies the guest's cloud-init logs and the units'
# journal to $logs on the host, which outlive the throw-away guest.
save_guest_logs() {
  mkdir -p "$logs"
  gssh "$1" 'cat /var/log/cloud-init-output.log' >"$logs/cloud-init-output.log" 2>/dev/null || true
  gssh "$1" 'cat /var/log/cloud-init.log' >"$logs/cloud-init.log" 2>/dev/null || true
  gssh "$1" 'journalctl -b --no-pager -u vertal -u vertal-tunnel -u vertal-update -u nftables -u docker' \
    >"$logs/units.log" 2>/dev/null || true
  cp "$dir/console.log" "$logs/console.log" 2>/dev/null || true
  say "the guest's logs: $logs"
}

cloud_init_test() {
  local port=$((dev_port + 3)) fwd_api=$((dev_port + 4)) fwd_probe=$((dev_port + 5))
  local dir t0 total0 api_image secret pub failed=0
  logs=${VERTAL_VM_CLOUD_INIT_LOGS:-$cache/cloud-init-logs}
  rm -rf "$logs"
  total0=$(now)
  api_image=${VERTAL_VM_API_IMAGE:-}
  need_host_tools
  command -v genisoimage >/dev/null || {
    say "installing genisoimage"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends genisoimage >/dev/null
  }
  if [ -z "$api_image" ]; then
    # This checkout's image, built as tests/deploy builds it (compose, the
    # same layer cache: with nothing changed it takes seconds).
    api_image=vertal/api:vm-test
    say "building $api_image from this checkout (deploy/Dockerfile)"
    t0=$(now)
    scripts/base-image.sh >/dev/null || die "scripts/base-image.sh failed"
    COMPOSE_PROFILES='' VERTAL_API_IMAGE=$api_image docker compose -f deploy/compose.yaml build --quiet ||
      die "building $api_image failed"
    times+=("API image build: $(($(now) - t0))s")
  fi
  docker image inspect "$api_image" >/dev/null 2>&1 || die "no $api_image on this host's Docker"
  build_guest

  throwaway_disk cloudinit "$port"

  # --- the seed ---------------------------------------------------------------
  secret=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
  pub=$(ssh-keygen -y -f "$image/id_ed25519")
  mkdir "$dir/seed"
  sed -e "s|^\( *VERTAL_EDGE_SECRET=\).*|\1$secret|" \
    -e "s|^\( *TUNNEL_TOKEN=\).*|\1vm-test-not-a-real-token|" \
    -e "s|^\( *VERTAL_IMAGE=\).*|\1$api_image|" \
    -e "s|^\( *- \)ssh-ed25519 AAAA-CHANGE-ME.*|\1$pub|" \
    deploy/hetzner/cloud-init.yaml >"$dir/seed/user-data"
  # The first run spent over 10 minutes of TCG in package_upgrade alone (a
  # new kernel's initramfs); VERTAL_VM_CLOUD_INIT_UPGRADE=0 skips it.
  if [ "${VERTAL_VM_CLOUD_INIT_UPGRADE:-1}" = 0 ]; then
    sed -i 's/^package_upgrade: true$/package_upgrade: false/' "$dir/seed/user-data"
  fi
  grep -q CHANGE-ME "$dir/seed/user-data" && die "a fill-in of cloud-init.yaml was not replaced"
  printf 'instance-id: vertal-vm-%s\nlocal-hostname: vertal-guest\n' "$(basename "$dir")" >"$dir/seed/meta-data"
  genisoimage -quiet -output "$dir/seed.iso" -volid cidata -joliet -rock \
    "$dir/seed/user-data" "$dir/seed/meta-data"

  qemu_extra=(-drive "file=$dir/seed.iso,if=virtio,format=raw,readonly=on")
  qemu_hostfwd=",hostfwd=tcp:127.0.0.1:$fwd_api-:8080,hostfwd=tcp:127.0.0.1:$fwd_probe-:9999"
  boot "$dir" "$port"

  # --- cloud-init into the guest ----------------------------------------------
  say "installing cloud-init in the guest (a cloud image ships it)"
  t0=$(now)
  gssh "$port" 'set -e; export DEBIAN_FRONTEND=noninteractive
    apt-get -o DPkg::Lock::Timeout=600 update -qq
    apt-get -o DPkg::Lock::Timeout=600 install -y -qq cloud-init >/dev/null
    cloud-init clean --logs
    cloud-init --version' || die "could not install cloud-init in the guest"
  times+=("cloud-init install in the guest: $(($(now) - t0))s")
  say "copying $api_image into the guest (docker save)"
  t0=$(now)
  docker save "$api_image" | gzip -1 | gssh_in "$port" 'cat >/root/vertal-api.tar.gz'
  times+=("image copy: $(($(now) - t0))s")

  # --- the first boot ---------------------------------------------------------
  say "rebooting: cloud-init's first boot with the seed"
  # (systemctl may say "Failed to connect to bus" as the guest goes down)
  gssh "$port" 'systemctl reboot' 2>/dev/null || true
  t0=$(now)
  sleep 20
  wait_ssh "$dir" "$port" 900 || die "the guest did not come back after the reboot (console: $dir/console.log)"
  times+=("reboot to ssh: $(($(now) - t0))s")
  local loaded=0 up=0 st
  while [ $(($(now) - t0)) -lt "$ci_limit" ]; do
    if [ "$loaded" -eq 0 ] && gssh "$port" 'systemctl is-active -q docker.service' 2>/dev/null; then
      say "docker.io is up ($(($(now) - t0))s): loading the image"
      gssh "$port" 'gunzip -c /root/vertal-api.tar.gz | docker load -q && rm /root/vertal-api.tar.gz' || die "docker load failed"
      loaded=1
      times+=("first boot to docker.io up and image loaded: $(($(now) - t0))s")
    fi
    if [ "$loaded" -eq 1 ] && gssh "$port" 'curl -fsS --max-time 5 http://127.0.0.1:8080/health' 2>/dev/null; then
      up=1
      break
    fi
    sleep 10
  done
  [ "$up" -eq 1 ] || {
    gssh "$port" 'cloud-init status --long; journalctl -u vertal --no-pager -n 40' >&2 || true
    save_guest_logs "$port"
    die "the API did not serve within ${ci_limit}s of the first boot"
  }
  echo
  times+=("first boot to API /health: $(($(now) - t0))s")
  # status exits non-zero when cloud-init reports an error: the output says which.
  st=$(gssh "$port" 'cloud-init status --wait >/dev/null; cloud-init status --long; true')
  printf '%s\n' "$st" | sed 's/^/  [cloud-init] /'
  times+=("first boot to cloud-init done: $(($(now) - t0))s")
  if printf '%s\n' "$st" | grep -q '^status: done' && ! gssh "$port" 'grep -E "WARNING|ERROR|Traceback" /var/log/cloud-init.log | grep -v "DEPRECAT"' >&2; then
    say "cloud-init: done, no warnings or errors"
  else
    say "cloud-init: not done cleanly (above)"
    failed=1
  fi

  # --- checks -----------------------------------------------------------------
  # docs/DEPLOY.md, way A, step 4, as written there.
  say "an execution through the edge secret (DEPLOY.md A.4: vertal key, curl on 127.0.0.1)"
  local out
  # shellcheck disable=SC2016 # expanded in the guest
  out=$(gssh "$port" '. /etc/vertal/vertal.env
    key=$(vertal key smoke-test pro)
    curl -s --max-time 300 http://127.0.0.1:8080/v1/executions -H "X-Vertal-Edge-Secret: $VERTAL_EDGE_SECRET" \
      -H "Authorization: Bearer $key" -H "Content-Type: application/json" \
      -d "{\"language\": \"python\", \"code\": \"print(6 * 7)\"}"') || true
  if printf '%s' "$out" | python3 -c 'import json,sys; r=json.load(sys.stdin); sys.exit(0 if r.get("stdout")=="42\n" else 1)' 2>/dev/null; then
    say "python: 42 ok"
  else
    say "execution failed: ${out:-(no answer)}"
    failed=1
  fi
  out=$(gssh "$port" "curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8080/v1/languages")
  expect "without the edge secret" "$out" 403 || failed=1

  say "vertal status and vertal logs"
  gssh "$port" 'vertal status && vertal logs --lines 3' | sed 's/^/  [ops] /' || { say "vertal status or logs failed"; failed=1; }

  say "the tunnel unit: enabled, and retrying (it cannot reach Cloudflare here)"
  local n1 n2
  n1=$(gssh "$port" 'systemctl show -p NRestarts --value vertal-tunnel.service')
  sleep 40
  out=$(gssh "$port" 'systemctl is-enabled vertal-tunnel.service
    systemctl show -p ActiveState,SubState,NRestarts vertal-tunnel.service | tr "\n" " "; echo
    journalctl -u vertal-tunnel --no-pager -o cat -n 4')
  printf '%s\n' "$out" | sed 's/^/  [tunnel] /'
  n2=$(gssh "$port" 'systemctl show -p NRestarts --value vertal-tunnel.service')
  # Between tries it waits RestartSec (activating/auto-restart); during one
  # it is in start-pre or start. Never active (nothing to connect to), never
  # failed (it gives up only if Restart= does).
  if [ "$(printf '%s\n' "$out" | head -n1)" = enabled ] &&
    printf '%s\n' "$out" | grep -qE 'ActiveState=activating SubState=(auto-restart|start-pre|start) ' &&
    [ "${n2:-0}" -gt "${n1:-0}" ]; then
    say "tunnel: enabled, restarted $n1 then $n2 times 40s later"
  else
    say "tunnel: not enabled, or not retrying (restarts $n1 then $n2)"
    failed=1
  fi

  say "listening sockets (ss -ltnp) and the firewall"
  gssh "$port" 'ss -Hltnp' | sed 's/^/  [ss] /'
  out=$(gssh "$port" "ss -Hltn | awk '{ print \$4 }' | grep -vE '^(127\\.[0-9.]+|\\[::1\\]):[0-9]+\$' | grep -vE ':22\$'" || true)
  expect "non-loopback listeners besides :22" "${out:-none}" none || failed=1
  # A listener on every address behind the probe port: the firewall must keep
  # the host from it, and a rule for it must let the host in.
  gssh "$port" '(setsid nohup python3 -m http.server 9999 >/dev/null 2>&1 </dev/null &); sleep 3'
  # 000: no HTTP answer (QEMU accepts on the host side, then the guest drops).
  expect "host → guest :9999 (a listener, firewalled)" "$(host_probe "$fwd_probe")" 000 || failed=1
  expect "host → guest :8080" "$(host_probe "$fwd_api")" 000 || failed=1
  expect "host → guest :22 (sshd's banner)" "$(host_banner "$port")" SSH-2.0 || failed=1
  gssh "$port" 'nft insert rule inet vertal_firewall input tcp dport 9999 accept'
  expect "host → guest :9999 with a rule for it (so the firewall is what stops it)" "$(host_probe "$fwd_probe")" 200 || failed=1
  gssh "$port" 'systemctl reload nftables && nft list table inet vertal_firewall | grep -c 9999 || true' |
    grep -qx 0 || { say "reloading nftables.conf did not drop the extra rule"; failed=1; }

  # --- the update timer -------------------------------------------------------
  say "the update timer: nothing new, then a newer local image"
  t0=$(now)
  out=$(gssh "$port" 'systemctl is-enabled vertal-update.timer; systemctl is-active vertal-update.timer
    systemctl list-timers --no-pager vertal-update.timer | sed -n 2p')
  printf '%s\n' "$out" | sed 's/^/  [timer] /'
  if [ "$(printf '%s\n' "$out" | sed -n 1,2p | tr '\n' ' ')" = "enabled active " ]; then
    say "update timer: enabled and waiting"
  else
    say "update timer: not enabled and active"
    failed=1
  fi
  # What identifies a run of the API: the container's id and the unit's
  # invocation (a restart changes both), and the image it runs.
  # shellcheck disable=SC2016 # expanded in the guest
  out=$(gssh "$port" 'set -e; . /etc/vertal/deploy.env
    run() { echo "$(docker inspect -f "{{.Image}} {{.Id}}" vertal) $(systemctl show -p InvocationID --value vertal)"; }
    healthy() { for i in $(seq 150); do curl -fs -o /dev/null http://127.0.0.1:8080/health && return 0; sleep 2; done; return 1; }
    before=$(run)
    systemctl start vertal-update.service
    same=$(run)
    new=$(docker commit --change "LABEL vertal.vm-test=newer" vertal "$VERTAL_IMAGE")
    systemctl start vertal-update.service
    healthy
    after=$(run)
    echo "$before|$same|$new|$after"') || out=""
  local before same new after
  IFS='|' read -r before same new after <<<"$out"
  printf '  [update] before:    %s\n  [update] no change: %s\n  [update] new image: %s\n  [update] after:     %s\n' \
    "$before" "$same" "$new" "$after"
  expect "update with nothing new: the same image, container and invocation" "$same" "${before:-none}" || failed=1
  if [ -n "$new" ] && [ "${after%% *}" = "$new" ] && [ "${after#* }" != "${before#* }" ] && [ "$new" != "${before%% *}" ]; then
    say "update with a newer image: the API restarted onto it (new container and invocation)"
  else
    say "update with a newer image: not running it after the timer's service"
    failed=1
  fi
  gssh "$port" 'journalctl -u vertal-update --no-pager -o cat | grep vertal-update' | sed 's/^/  [update] /' || true
  times+=("update check and restart: $(($(now) - t0))s")

  save_guest_logs "$port"
  times+=("whole cloud-init run: $(($(now) - total0))s")
  echo
  say "times:"
  printf '   %s\n' "${times[@]}" >&2
  [ "$failed" -eq 0 ] || die "deploy/hetzner/cloud-init.yaml on a fresh Debian 12: see above"
  say "PASS: deploy/hetzner/cloud-init.yaml on a fresh Debian 12: API serving, tunnel unit retrying, only SSH open, updates applied"
}
