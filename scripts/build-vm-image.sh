#!/usr/bin/env bash
# Build the desktop-sandbox guest as a bootable VM image, from the same
# provisioning the container image uses (images/provision.sh), without Vagrant.
#
#   debootstrap (Debian bookworm, minbase) + initramfs-tools + qemu-guest-agent, then the kernel
#   -> images/provision.sh packages, the agent's venv (as Dockerfile.desktop)   [system layer, cached]
#   -> project code, images/provision.sh configure, scripts/vm/guest-setup.sh  [final layer]
#   -> rootfs.raw (ext4, no partition table) + vmlinuz + initrd.img, booted with
#      QEMU's direct kernel boot (-kernel/-initrd/-append root=/dev/vda).
#
# Usage: scripts/build-vm-image.sh [--arch amd64|arm64] [--cache DIR] [--mirror URL] [--force]
#        scripts/build-vm-image.sh --print-dir [--arch ...]   print where the image for the
#                                                             current inputs lives (built or not)
# Output: DIR/{rootfs.raw,vmlinuz,initrd.img,manifest.json}; the last line printed is DIR.
# Cache:  ${DESKTOP_SANDBOX_VM_CACHE:-~/.cache/desktop-sandbox/vm}, keyed by a hash of the inputs;
#         older builds of the same arch are removed after a successful build.
# Needs:  root, debootstrap, e2fsprogs (mke2fs -d), network access to the Debian mirror and PyPI.
#         arm64 on an x86-64 host also needs qemu-user-static with binfmt_misc registered.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
cache=${DESKTOP_SANDBOX_VM_CACHE:-${HOME:-/root}/.cache/desktop-sandbox/vm}
mirror=http://deb.debian.org/debian
suite=bookworm
force=0
print_dir=0
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --cache) cache=$2; shift 2 ;;
    --mirror) mirror=$2; shift 2 ;;
    --force) force=1; shift ;;
    --print-dir) print_dir=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "build-vm-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$arch" in amd64|arm64) ;; *) echo "build-vm-image: --arch must be amd64 or arm64" >&2; exit 2 ;; esac

# Base packages on top of minbase: init, initramfs, and the host's control
# channel (qemu-guest-agent: used by the controller for in-guest probes; its
# virtio port is root-only inside the guest). The kernel comes after them,
# once the initramfs is configured to be small (see the system layer).
include="systemd-sysv,udev,kmod,initramfs-tools,qemu-guest-agent"
kernel="linux-image-$arch"

hash_files() { # stable hash of the named files/directories' contents and paths (relative to the repo)
  # In a git checkout: the files git tracks or would track (what .gitignore leaves out -- caches, test
  # leftovers -- does not change the key); elsewhere every file but Python caches.
  (cd "$repo" && if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
       git ls-files -z --cached --others --exclude-standard -- "$@"
     else
       find "$@" -type f ! -name '*.pyc' ! -path '*/__pycache__/*' -print0
     fi | { grep -zv -e '\.pyc$' -e '__pycache__/' || true; } | LC_ALL=C sort -z \
       | { xargs -0 -r sha256sum 2>/dev/null || true; }) | sha256sum | cut -c1-16
}
deps=$(python3 -c 'import tomllib,sys; p=tomllib.load(open(sys.argv[1],"rb"))["project"]; print("\n".join(p["dependencies"]))' "$repo/pyproject.toml")
system_key=$( { echo "$arch $suite $mirror $include $kernel"; echo "$deps"; sed -n '/^# system-layer-begin/,/^# system-layer-end/p' "$0"; \
  sha256sum < "$repo/images/provision.sh"; } | sha256sum | cut -c1-16)
final_key=$( { echo "$system_key"; hash_files images guest wire scripts/vm Dockerfile.desktop; sed -n '/^# final-layer-begin/,/^# final-layer-end/p' "$0"; } \
  | sha256sum | cut -c1-16)
out="$cache/$arch-$final_key"
if [ "$print_dir" = 1 ]; then echo "$out"; exit 0; fi
if [ "$force" = 0 ] && [ -s "$out/manifest.json" ]; then
  echo "build-vm-image: up to date ($out)"
  echo "$out"
  exit 0
fi

[ "$(id -u)" = 0 ] || { echo "build-vm-image: must run as root (debootstrap, chroot)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "build-vm-image: apt-get install debootstrap" >&2; exit 1; }
mkdir -p "$cache"
t0=$(date +%s)
step() { printf 'build-vm-image: [%4ss] %s\n' "$(( $(date +%s) - t0 ))" "$*"; }
log="$cache/build-$arch.log"
: > "$log"
quiet() { # run a command, output to the log; on failure show its tail
  if ! "$@" >>"$log" 2>&1; then
    echo "build-vm-image: failed: $*  (last lines of $log:)" >&2
    tail -n 30 "$log" >&2
    return 1
  fi
}

work=$(mktemp -d "$cache/.work.XXXXXX")
mounted=()
cleanup() {
  local i
  for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

chroot_mounts() { # $1: root
  mount -t proc proc "$1/proc"; mounted+=("$1/proc")
  mount -t sysfs sysfs "$1/sys"; mounted+=("$1/sys")
  mount --bind /dev "$1/dev"; mounted+=("$1/dev")
  mount -t devpts devpts "$1/dev/pts" -o newinstance,ptmxmode=0666 2>/dev/null && mounted+=("$1/dev/pts") || true
  cp /etc/resolv.conf "$1/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' > "$1/usr/sbin/policy-rc.d"; chmod 0755 "$1/usr/sbin/policy-rc.d"
}
in_root() { # $1: root; the rest: command run in it with a clean environment, output to the log
  local r=$1; shift
  quiet chroot "$r" /usr/bin/env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/root LC_ALL=C.UTF-8 DEBIAN_FRONTEND=noninteractive "$@"
}
chroot_umounts() {
  local i
  for ((i=${#mounted[@]}-1; i>=0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
  mounted=()
  rm -f "$1/usr/sbin/policy-rc.d"
}

foreign=()
if [ "$arch" != "$(dpkg --print-architecture)" ]; then
  # The kernel's binfmt_misc runs the foreign binaries through QEMU's user-mode emulator.
  "$repo/scripts/binfmt-register.sh" "$arch"
  foreign=(--arch "$arch")
fi

system="$cache/system-$arch-$system_key"
# system-layer-begin
if [ ! -d "$system" ]; then
  root="$work/system"
  step "debootstrap $suite/$arch (minbase + init) from $mirror"
  quiet debootstrap "${foreign[@]}" --variant=minbase --components=main --include="$include" "$suite" "$root" "$mirror"
  printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
    "$mirror" "$suite" "$mirror" "$suite" "$suite" > "$root/etc/apt/sources.list"
  chroot_mounts "$root"
  # A small initramfs: only what finds the root disk (faster to load under emulation). Set before the
  # kernel is installed, so its one initramfs is built that way: with the default (MODULES=most)
  # mkinitramfs runs modinfo once per module of the kernel, thousands of processes, which under
  # emulation (an arm64 build on x86-64) took over half an hour.
  printf 'MODULES=list\nCOMPRESS=zstd\n' > "$root/etc/initramfs-tools/conf.d/desktop-sandbox"
  printf 'virtio_pci\nvirtio_mmio\nvirtio_blk\next4\n' >> "$root/etc/initramfs-tools/modules"
  step "kernel ($kernel)"
  in_root "$root" apt-get update -qq
  in_root "$root" apt-get install -y -qq --no-install-recommends "$kernel"
  step "images/provision.sh packages"
  install -m 0755 "$repo/images/provision.sh" "$root/usr/local/lib/provision.sh"
  in_root "$root" /bin/sh /usr/local/lib/provision.sh packages
  step "agent virtual environment (pyproject.toml dependencies)"
  # Wheels are fetched on the host (its pip configuration and trust store),
  # for the guest's Python (3.11) and architecture, then installed offline.
  march=$([ "$arch" = amd64 ] && echo x86_64 || echo aarch64)
  plats=()
  for g in 2_17 2_24 2_27 2_28 2_31 2_34 2_35 2_36; do plats+=(--platform "manylinux_${g}_$march"); done
  printf '%s\n' "$deps" > "$work/requirements.txt"
  quiet python3 -m pip download --disable-pip-version-check --progress-bar off -d "$root/tmp/wheels" \
    --only-binary=:all: --python-version 3.11 --implementation cp "${plats[@]}" --platform "manylinux2014_$march" \
    -r "$work/requirements.txt"
  cp "$work/requirements.txt" "$root/tmp/wheels/requirements.txt"
  in_root "$root" python3 -m venv /opt/desktop-sandbox
  in_root "$root" /opt/desktop-sandbox/bin/pip install --no-index --find-links /tmp/wheels --no-cache-dir \
    --disable-pip-version-check --progress-bar off -r /tmp/wheels/requirements.txt
  rm -rf "$root/tmp/wheels"
  step "initramfs"
  in_root "$root" update-initramfs -u -k all
  chroot_umounts "$root"
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/etc/resolv.conf
  rm -rf "$cache"/system-"$arch"-*
  mv "$root" "$system"
else
  step "system layer cached ($system)"
fi
# system-layer-end

# final-layer-begin
root="$work/root"
step "copy system layer"
cp -a "$system" "$root"
step "project code + images/provision.sh configure + VM setup"
src="$root/opt/desktop-sandbox/src"
mkdir -p "$src"
cp -a "$repo/images" "$repo/guest" "$repo/wire" "$src/"
find "$src" -name __pycache__ -prune -exec rm -rf {} +
purelib=$(chroot "$root" /opt/desktop-sandbox/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
echo /opt/desktop-sandbox/src > "$root$purelib/desktop-sandbox.pth"
chroot_mounts "$root"
in_root "$root" /bin/sh /opt/desktop-sandbox/src/images/provision.sh configure /opt/desktop-sandbox/src
in_root "$root" /opt/desktop-sandbox/bin/python -m compileall -q /opt/desktop-sandbox/src
cp -a "$repo/scripts/vm" "$root/tmp/vm"
install -d "$root/etc/desktop-sandbox"
python3 "$repo/scripts/vm/dockerfile-env.py" "$repo/Dockerfile.desktop" > "$root/etc/desktop-sandbox/session.env"
in_root "$root" /bin/sh /tmp/vm/guest-setup.sh /tmp/vm/guest
rm -rf "$root/tmp/vm"
chroot_umounts "$root"
rm -f "$root/etc/resolv.conf"; : > "$root/etc/resolv.conf"

new="$work/out"
mkdir -p "$new"
kver=$(ls "$root/boot" | sed -n 's/^vmlinuz-//p' | sort -V | tail -n1)
cp "$root/boot/vmlinuz-$kver" "$new/vmlinuz"
cp "$root/boot/initrd.img-$kver" "$new/initrd.img"
used_kib=$(du -sk "$root" | cut -f1)
size_mib=$(( used_kib * 12 / 10 / 1024 + 256 ))
step "ext4 image (${size_mib} MiB, from $((used_kib / 1024)) MiB of files)"
quiet mke2fs -q -t ext4 -L sandbox-root -m 0 -E root_owner=0:0 -d "$root" "$new/rootfs.raw" "${size_mib}M"
build_s=$(( $(date +%s) - t0 ))
python3 - "$new" "$arch" "$final_key" "$system_key" "$kver" "$build_s" <<'PY'
import json, os, sys
out, arch, key, system_key, kver, build_s = sys.argv[1:]
files = {}
for name in ("rootfs.raw", "vmlinuz", "initrd.img"):
    st = os.stat(os.path.join(out, name))
    files[name] = {"apparent_bytes": st.st_size, "allocated_bytes": st.st_blocks * 512}
console = "ttyS0" if arch == "amd64" else "ttyAMA0"
json.dump({"arch": arch, "key": key, "system_key": system_key, "kernel": kver,
           "cmdline": f"root=/dev/vda ro console={console} quiet net.ifnames=0 ipv6.disable=1 panic=-1",
           "build_seconds": int(build_s), "files": files},
          open(os.path.join(out, "manifest.json"), "w"), indent=2)
PY
rm -rf "$out"
for old in "$cache/$arch"-*; do [ -d "$old" ] && rm -rf "$old"; done
mv "$new" "$out"
# final-layer-end
step "done: $(du -sh --apparent-size "$out/rootfs.raw" | cut -f1) disk ($(du -sh "$out/rootfs.raw" | cut -f1) allocated), in $(( $(date +%s) - t0 ))s"
echo "$out"
