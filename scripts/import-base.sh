#!/usr/bin/env bash
# Import a Debian base image built from Debian's packages with debootstrap.
#
# For machines that cannot pull from a container registry (air-gapped hosts, CI
# without registry access). The result is tagged with the same name the
# Dockerfile's FROM line uses, so Dockerfile.desktop builds unchanged.
#
# Usage: scripts/import-base.sh [TAG] [SUITE] [MIRROR] [ARCH]
#   TAG     default debian:bookworm-slim
#   SUITE   default bookworm
#   MIRROR  default http://deb.debian.org/debian
#   ARCH    Debian architecture (amd64, arm64), default the host's. A foreign one
#           (arm64 on an x86-64 host) runs debootstrap's second stage under
#           emulation: it needs qemu-user-static installed (scripts/binfmt-register.sh
#           registers its handler with the kernel when that is not done yet).
# Needs: root, debootstrap, docker CLI.
set -euo pipefail
tag=${1:-debian:bookworm-slim}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}
host_arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
arch=${4:-$host_arch}

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "import-base: $tag already present"
  exit 0
fi
if docker pull --platform "linux/$arch" "$tag" >/dev/null 2>&1; then
  echo "import-base: pulled $tag"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "import-base: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }
if [ "$arch" != "$host_arch" ]; then
  # A foreign architecture's binaries run through the kernel's binfmt_misc and QEMU's user-mode emulator.
  "$(dirname "$0")/binfmt-register.sh" "$arch"
fi

root=$(mktemp -d /tmp/debootstrap.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "import-base: no registry; building $tag ($arch) from $mirror ($suite) with debootstrap"
start=$(date +%s)
debootstrap --arch="$arch" --variant=minbase --components=main "$suite" "$root" "$mirror" \
  | sed -u 's/^/  debootstrap: /' | grep -E 'Retrieving|Validating|Extracting base|Installing core|Configuring|Base system' --line-buffered | awk 'NR%40==1 || /Base system/' || true
[ -x "$root/bin/sh" ] || { echo "import-base: debootstrap failed" >&2; exit 1; }
# Trim what a container never needs, as the official slim images do.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
  "$mirror" "$suite" "$mirror" "$suite" "$suite" > "$root/etc/apt/sources.list"
# Imported through a one-line build rather than `docker import`, whose --platform the engine may
# ignore: the image must record its architecture (arm64) so `docker run --platform` and builds FROM it
# pick it for what it is.
ctx=$(mktemp -d /tmp/import-base-ctx.XXXXXX)
trap 'rm -rf "$root" "$ctx"' EXIT
tar -C "$root" --numeric-owner -cf "$ctx/rootfs.tar" .
printf 'FROM scratch\nADD rootfs.tar /\nCMD ["bash"]\n' > "$ctx/Dockerfile"
docker build -q --platform "linux/$arch" -t "$tag" "$ctx" >/dev/null
[ "$(docker image inspect "$tag" --format '{{.Architecture}}')" = "$arch" ] \
  || { echo "import-base: $tag does not record architecture $arch" >&2; exit 1; }
echo "import-base: imported $tag ($arch) in $(( $(date +%s) - start ))s"
