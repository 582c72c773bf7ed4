#!/usr/bin/env bash
# Check what `make desktop` needs on the host before any slow step, and say it all in one message.
#
# Usage: scripts/prereqs.sh [BASE_TAG] [ARCH]
#   BASE_TAG  the image Dockerfile.desktop builds FROM (default debian:bookworm-slim)
#   ARCH      the guest's Debian architecture (amd64, arm64; default the host's). A foreign one also
#             needs QEMU's user-mode emulator (qemu-user-static, binfmt-support) and always debootstrap
#             (its base is imported under BASE_TAG-ARCH).
#
# What docs/getting-started.md names for a fresh Debian/Ubuntu machine: Docker (the engine, running), Python >= 3.11
# with venv (python3-venv: Debian's python3 lacks ensurepip without it), make, and debootstrap when the
# base image is neither present nor pullable (no registry). As root with apt-get, a missing Debian package
# is installed here (apt-get update first when the package lists are empty); otherwise the script prints
# the one command that installs everything missing and exits 2. What no package installs here (a Docker
# engine that does not answer) is named with what to do, also exit 2.
#
# Environment: SYSTEM_PYTHON (default python3), DESKTOP_SANDBOX_PREREQS_INSTALL=0 to never install (only
# report), DOCKER_PULL_TIMEOUT seconds for the registry probe (default 60).
set -uo pipefail
base=${1:-debian:bookworm-slim}
host_arch=$(dpkg --print-architecture 2>/dev/null || echo amd64)
arch=${2:-$host_arch}
[ -n "$arch" ] || arch=$host_arch
python=${SYSTEM_PYTHON:-python3}
pull_timeout=${DOCKER_PULL_TIMEOUT:-60}

packages=()   # Debian packages to install
problems=()   # what no package here fixes

have() { command -v "$1" >/dev/null 2>&1; }

have make || packages+=(make)

version=""
have "$python" && version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
if ! have "$python"; then
  packages+=(python3 python3-venv)
elif [ -z "$version" ]; then
  problems+=("$python does not run")
elif ! "$python" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)' 2>/dev/null; then
  problems+=("$python is $version; Python >= 3.11 is needed (SYSTEM_PYTHON=python3.11 make …)")
elif ! "$python" -c 'import venv, ensurepip' 2>/dev/null; then
  packages+=(python3-venv)
fi

docker_ok=0
if ! have docker; then
  problems+=("no docker command: install Docker (Debian: apt-get install docker.io) and start its engine")
elif ! docker info >/dev/null 2>&1; then
  problems+=("the Docker engine does not answer ($(docker info 2>&1 >/dev/null | tail -n 1 | cut -c1-160)): start it (systemctl start docker) or join the docker group")
else
  docker_ok=1
fi

if [ "$arch" != "$host_arch" ]; then
  base="$base-$arch"
  cpu=$(case "$arch" in arm64) echo aarch64 ;; amd64) echo x86_64 ;; *) echo "$arch" ;; esac)
  [ -e "/proc/sys/fs/binfmt_misc/qemu-$cpu" ] || have "qemu-$cpu-static" || packages+=(qemu-user-static binfmt-support)
fi

# debootstrap only matters when the base image is neither here nor pullable; pulling it now is the
# build's own first step, done earlier.
if ! have debootstrap; then
  if [ "$docker_ok" -eq 0 ]; then
    packages+=(debootstrap)   # cannot tell whether a registry answers: needed for the air-gapped path
  elif ! docker image inspect "$base" >/dev/null 2>&1 \
      && ! timeout "$pull_timeout" docker pull -q "$base" >/dev/null 2>&1; then
    packages+=(debootstrap)
  fi
fi

if [ "${#packages[@]}" -gt 0 ] && [ "$(id -u)" -eq 0 ] && have apt-get \
    && [ "${DESKTOP_SANDBOX_PREREQS_INSTALL:-1}" != 0 ]; then
  echo "prereqs: installing ${packages[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  if ! compgen -G '/var/lib/apt/lists/*_Packages' >/dev/null; then
    apt-get update -qq || true
  fi
  if apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null \
      || { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null; }; then
    packages=()
  else
    problems+=("apt-get could not install ${packages[*]}")
  fi
fi

if [ "${#packages[@]}" -eq 0 ] && [ "${#problems[@]}" -eq 0 ]; then
  exit 0
fi
{
  echo "prereqs: make desktop cannot start on this machine:"
  if [ "${#packages[@]}" -gt 0 ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo "
    echo "  missing packages; run: ${sudo}apt-get install -y ${packages[*]}"
  fi
  for p in "${problems[@]}"; do echo "  $p"; done
} >&2
exit 2
