#!/bin/sh
# VM-only configuration, run inside the guest root (chroot) after
# images/provision.sh: boot, network, read-only root, the session unit.
# Usage: guest-setup.sh DIR   (DIR holds the files of scripts/vm/guest)
set -eu
files=$1

install -m 0644 "$files/desktop-sandbox.service" /etc/systemd/system/desktop-sandbox.service
install -d /usr/local/lib/desktop-sandbox
install -m 0755 "$files/vm-config" /usr/local/lib/desktop-sandbox/vm-config
install -m 0644 "$files/10-sandbox.network" /etc/systemd/network/10-sandbox.network
install -d /etc/desktop-sandbox
# session.env: Dockerfile.desktop's ENV (written by build-vm-image.sh), then the VM's differences.
cat "$files/session-vm.env" >> /etc/desktop-sandbox/session.env

# The same host name as the container's (controller/sandbox/docker.py): the shell prompt, and with it
# where text lands in the terminal, is the same on every backend, so one offline script fits both.
echo desktop > /etc/hostname
printf '127.0.0.1\tlocalhost\n127.0.1.1\tdesktop\n10.0.2.100\tgateway\n' > /etc/hosts
: > /etc/resolv.conf
# The root file system is mounted read-only (and the disk is attached
# read-only); everything that is written lives in tmpfs and is gone at exit.
# Sizes as the container's memory budget (controller/sandbox/docker_hardening.py):
# full, they leave about 900 MiB of the VM's 2 GiB to processes. The home is
# 0750: the agent's user reads the desktop user's files through group sandbox.
cat > /etc/fstab <<'FSTAB'
/dev/vda  /              ext4   ro,noatime                                    0 0
tmpfs     /tmp           tmpfs  mode=1777,nosuid,nodev,size=256m              0 0
tmpfs     /var/tmp       tmpfs  mode=1777,nosuid,nodev,size=32m               0 0
tmpfs     /var/log       tmpfs  mode=0755,nosuid,nodev,size=64m               0 0
tmpfs     /dev/shm       tmpfs  mode=1777,nosuid,nodev,size=256m              0 0
tmpfs     /home/sandbox  tmpfs  mode=0750,uid=1000,gid=1000,nosuid,nodev,size=512m  0 0
tmpfs     /home/browser  tmpfs  mode=0700,uid=1003,gid=1003,nosuid,nodev,size=128m  0 0
FSTAB
: > /etc/machine-id

systemctl enable desktop-sandbox.service systemd-networkd.service >/dev/null 2>&1
systemctl set-default multi-user.target >/dev/null 2>&1
# Nothing to log in with (root is locked; `sandbox` has no password) and
# nothing periodic to run in a disposable guest.
systemctl mask getty.target serial-getty@ttyS0.service serial-getty@ttyAMA0.service \
  systemd-random-seed.service apt-daily.timer apt-daily-upgrade.timer \
  dpkg-db-backup.timer e2scrub_all.timer fstrim.timer systemd-tmpfiles-clean.timer \
  systemd-networkd-wait-online.service supervisor.service e2scrub_reap.service \
  systemd-binfmt.service sys-kernel-debug.mount sys-kernel-tracing.mount \
  modprobe@dm_mod.service modprobe@fuse.service modprobe@loop.service modprobe@efi_pstore.service \
  >/dev/null 2>&1
# Modules a headless guest never needs, which udev would otherwise load at
# every boot (slow under emulation).
cat > /etc/modprobe.d/desktop-sandbox.conf <<'MODS'
blacklist kvm
blacklist kvm_amd
blacklist kvm_intel
blacklist powernow_k8
blacklist cfg80211
blacklist pcspkr
blacklist snd_pcsp
blacklist floppy
blacklist joydev
blacklist psmouse
blacklist serio_raw
blacklist evdev
MODS
