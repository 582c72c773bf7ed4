#!/usr/bin/env bash
# Import a Debian base image built from Debian's packages with debootstrap.
#
# For machines that cannot pull from a container registry (air-gapped hosts, CI
# without registry access). The result is tagged with the same name the
# Dockerfile's FROM line uses, so Dockerfile.desktop builds unchanged.
#
# Usage: scripts/import-base.sh [TAG] [SUITE] [MIRROR]
#   TAG     default debian:bookworm-slim
#   SUITE   default bookworm
#   MIRROR  default http://deb.debian.org/debian
# Needs: root, debootstrap, docker CLI.
set -euo pipefail
tag=${1:-debian:bookworm-slim}
suite=${2:-bookworm}
mirror=${3:-http://deb.debian.org/debian}

if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "import-base: $tag already present"
  exit 0
fi
if docker pull "$tag" >/dev/null 2>&1; then
  echo "import-base: pulled $tag"
  exit 0
fi
command -v debootstrap >/dev/null || { echo "import-base: debootstrap is not installed (apt-get install debootstrap)" >&2; exit 1; }

root=$(mktemp -d /tmp/debootstrap.XXXXXX)
trap 'rm -rf "$root"' EXIT
echo "import-base: no registry; building $tag from $mirror ($suite) with debootstrap"
start=$(date +%s)
debootstrap --variant=minbase --components=main "$suite" "$root" "$mirror" \
  | sed -u 's/^/  debootstrap: /' | grep -E 'Retrieving|Validating|Extracting base|Installing core|Configuring|Base system' --line-buffered | awk 'NR%40==1 || /Base system/' || true
[ -x "$root/bin/sh" ] || { echo "import-base: debootstrap failed" >&2; exit 1; }
# Trim what a container never needs, as the official slim images do.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/info/*
printf 'deb %s %s main\ndeb %s %s-updates main\ndeb http://deb.debian.org/debian-security %s-security main\n' \
  "$mirror" "$suite" "$mirror" "$suite" "$suite" > "$root/etc/apt/sources.list"
tar -C "$root" --numeric-owner -c . | docker import --change 'CMD ["bash"]' - "$tag" >/dev/null
echo "import-base: imported $tag in $(( $(date +%s) - start ))s"
