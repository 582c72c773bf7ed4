#!/usr/bin/env bash
# Make the kernel run binaries of a foreign Debian architecture through QEMU's user-mode emulator.
#
#   scripts/binfmt-register.sh ARCH      (ARCH: arm64 | amd64; needs root unless already registered)
#
# Mounts binfmt_misc where it is not, then registers the handler qemu-<cpu> (qemu-aarch64 for arm64)
# unless the kernel already has it, from whichever description this machine's QEMU packages installed:
# binfmt-support's database (update-binfmts: Debian 12's qemu-user-static), or a systemd binfmt.d file
# (/usr/lib/binfmt.d/qemu-<cpu>.conf: Debian 13's qemu-user-binfmt, also from bookworm-backports),
# whose one line is the registration string itself (binfmt_misc's format; systemd-binfmt writes it the
# same way when it runs, which it does not on hosts without systemd). The F flag those files carry
# keeps the emulator usable inside chroots and containers. Exits 1 saying what to install when no
# description is found.
set -euo pipefail
arch=${1:?usage: binfmt-register.sh ARCH}
cpu=$(case "$arch" in arm64) echo aarch64 ;; amd64) echo x86_64 ;; *) echo "$arch" ;; esac)
misc=/proc/sys/fs/binfmt_misc
[ -e "$misc/status" ] || mount -t binfmt_misc binfmt_misc "$misc" \
  || { echo "binfmt-register: cannot mount binfmt_misc at $misc (needs root)" >&2; exit 1; }
[ -e "$misc/qemu-$cpu" ] && exit 0
update-binfmts --enable "qemu-$cpu" >/dev/null 2>&1 || true
[ -e "$misc/qemu-$cpu" ] && exit 0
for conf in "/etc/binfmt.d/qemu-$cpu.conf" "/run/binfmt.d/qemu-$cpu.conf" "/usr/lib/binfmt.d/qemu-$cpu.conf"; do
  [ -r "$conf" ] || continue
  line=$(grep -v -e '^[#;]' -e '^[[:space:]]*$' "$conf" | head -n 1)
  [ -n "$line" ] || continue
  printf '%s' "$line" > "$misc/register" 2>/dev/null || true
  [ -e "$misc/qemu-$cpu" ] && exit 0
done
echo "binfmt-register: no binfmt handler for $arch (qemu-$cpu): apt-get install qemu-user-static binfmt-support" >&2
exit 1
