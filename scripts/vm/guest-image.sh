#!/usr/bin/env bash
# Builds the stock Debian 12 guest that scripts/vm-test.sh boots: what a
# self-hoster gets from a fresh Debian 12 server install, nothing of ours.
#
#   scripts/vm/guest-image.sh OUT_DIR
#
# OUT_DIR receives disk.raw (ext4, sparse), vmlinuz, initrd.img and id_ed25519
# (the key that logs in as root over ssh). vm-test.sh names OUT_DIR after a hash
# of this file, so a changed recipe builds a new guest instead of reusing a stale
# one. The build happens in OUT_DIR.tmp.PID and is renamed into place only when
# complete, so an interrupted build never leaves a half guest in the cache.
#
# Why each choice:
#   - debootstrap's default variant (Priority required + important) plus
#     systemd-sysv, Debian's own linux-image-amd64 and openssh-server: the
#     package set of a minimal server install. systemd is PID 1 and the kernel
#     runs with no cgroup flags, so the guest boots pure cgroup v2 like every
#     stock Debian 12 machine.
#   - sudo and curl: the README's commands use them, and a Debian server has them.
#   - No Go, crun, runc, Docker, Node or anything else of ours: setup.sh must
#     install them itself; that is the point of the guest.
#   - The host's extra CA certificates: this network intercepts TLS, so the guest
#     trusts what the host trusts (apt over https, the Go proxy, npm).
#   - No bootloader: QEMU loads the kernel and initrd directly with
#     root=/dev/vda; the command line carries no cgroup or other tuning flags.
set -euo pipefail

out=${1:?usage: guest-image.sh OUT_DIR}
mirror=${VERTAL_VM_MIRROR:-http://deb.debian.org/debian}
debs=${VERTAL_VM_DEB_CACHE:-}
size=${VERTAL_VM_DISK_SIZE:-40G}

[ "$(id -u)" -eq 0 ] || { echo "guest-image: run as root (debootstrap, chroot)" >&2; exit 1; }
for tool in debootstrap mkfs.ext4 ssh-keygen; do
  command -v "$tool" >/dev/null || { echo "guest-image: $tool is missing" >&2; exit 1; }
done

tmp=$out.tmp.$$
root=$tmp/root
cleanup() {
  # Unmount anything the chroot steps mounted, then drop the partial build.
  for m in proc sys dev/pts dev; do mountpoint -q "$root/$m" 2>/dev/null && umount -l "$root/$m"; done
  rm -rf "$tmp"
}
trap cleanup EXIT
rm -rf "$tmp" && mkdir -p "$root"

cache_args=()
if [ -n "$debs" ]; then
  # Keeps downloaded .debs between guest builds (a changed recipe rebuilds
  # without fetching everything again). The guest itself never sees this cache.
  mkdir -p "$debs"
  cache_args=(--cache-dir="$debs")
fi

echo "guest-image: debootstrap bookworm into $root"
debootstrap "${cache_args[@]}" \
  --include=systemd-sysv,linux-image-amd64,openssh-server,sudo,curl,ca-certificates \
  bookworm "$root" "$mirror" >"$tmp/debootstrap.log" 2>&1 || {
  tail -n 30 "$tmp/debootstrap.log" >&2
  echo "guest-image: debootstrap failed" >&2
  exit 1
}

echo "guest-image: configuring"
echo vertal-guest >"$root/etc/hostname"
cat >"$root/etc/hosts" <<'HOSTS'
127.0.0.1 localhost
127.0.1.1 vertal-guest
::1 localhost ip6-localhost ip6-loopback
HOSTS
echo '/dev/vda / ext4 errors=remount-ro 0 1' >"$root/etc/fstab"

# The APT sources of a Debian 12 install.
cat >"$root/etc/apt/sources.list" <<SOURCES
deb $mirror bookworm main
deb $mirror bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
SOURCES

# Network: DHCP from QEMU's user-mode network on whatever the NIC is called.
cat >"$root/etc/systemd/network/80-dhcp.network" <<'NET'
[Match]
Name=en* eth*

[Network]
DHCP=yes
NET
# QEMU's user-mode network answers DNS on 10.0.2.3.
echo 'nameserver 10.0.2.3' >"$root/etc/resolv.conf"

# Trust what the host trusts (see the header).
if compgen -G '/usr/local/share/ca-certificates/*' >/dev/null; then
  cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
# Node reads no system store; npm and node need to be told.
echo 'NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt' >>"$root/etc/environment"

# The way in: root over ssh with a key made for this guest.
ssh-keygen -q -t ed25519 -N '' -C vertal-vm -f "$tmp/id_ed25519"
install -d -m 700 "$root/root/.ssh"
install -m 600 "$tmp/id_ed25519.pub" "$root/root/.ssh/authorized_keys"

mount -t proc proc "$root/proc"
mount -t sysfs sys "$root/sys"
mount --bind /dev "$root/dev"
mount --bind /dev/pts "$root/dev/pts"
chroot "$root" /bin/sh -eu <<'CHROOT'
update-ca-certificates >/dev/null
systemctl enable systemd-networkd ssh >/dev/null 2>&1
# Host keys are made at first boot of each guest, not shared through the image.
rm -f /etc/ssh/ssh_host_*
cat >/etc/systemd/system/ssh-hostkeys.service <<'UNIT'
[Unit]
Description=Generate ssh host keys on first boot
Before=ssh.service
ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key

[Service]
Type=oneshot
ExecStart=/usr/bin/ssh-keygen -A

[Install]
WantedBy=multi-user.target
UNIT
systemctl enable ssh-hostkeys.service >/dev/null 2>&1
# A machine id of its own on first boot, as a fresh install gets.
: >/etc/machine-id
rm -f /var/lib/dbus/machine-id
# As fresh as an installed system: no downloaded package lists or .debs.
apt-get clean
rm -rf /var/lib/apt/lists/*
CHROOT
for m in dev/pts dev sys proc; do umount "$root/$m"; done

# The kernel and initrd Debian installed, for QEMU's direct boot.
cp "$(readlink -f "$root/vmlinuz")" "$tmp/vmlinuz"
cp "$(readlink -f "$root/initrd.img")" "$tmp/initrd.img"

echo "guest-image: making the $size disk"
# mkfs.ext4 -d fills the filesystem from the directory: no loop device needed.
truncate -s "$size" "$tmp/disk.raw"
mkfs.ext4 -q -L vertal-root -d "$root" "$tmp/disk.raw"
rm -rf "$root"

trap - EXIT
rm -rf "$out"
mv "$tmp" "$out"
echo "guest-image: ready in $out"
