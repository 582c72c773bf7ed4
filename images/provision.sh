#!/bin/sh
# Provision a Debian bookworm guest for desktop-sandbox.
#
# The one provisioning script for every guest: Dockerfile.desktop runs it at
# image build time and the VM path runs it inside the VM. Nothing here is
# architecture-specific (amd64 and arm64 use the same package names).
#
# Usage:
#   provision.sh packages          apt packages, the desktop user `sandbox` (uid 1000, no sudo) and
#                                  the agent's user `agent` (uid 1002, member of group `sandbox`)
#   provision.sh configure SRC     system-wide configuration from the project tree SRC
#                                  (SRC/images/...): browser policies, window manager
#   provision.sh all SRC           both
set -eu

phase=${1:-all}
src=${2:-}

packages() {
  export DEBIAN_FRONTEND=noninteractive
  # Keep documentation and translations out of the image (English UI only).
  cat > /etc/dpkg/dpkg.cfg.d/desktop-sandbox-nodoc <<'CFG'
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
path-exclude=/usr/share/help/*
CFG
  apt-get -o Acquire::Languages=none update
  # xvfb: the X server (24-bit framebuffer); openbox: window manager;
  # firefox-esr: browser (runs with its own sandbox); xterm: terminal;
  # supervisor: starts and watches the session's processes;
  # python3-venv: the agent's virtual environment; ca-certificates: TLS roots
  # for the browser; x11-utils: xdpyinfo/xwininfo for diagnostics; dbus-x11:
  # the session bus GTK asks for (instead of dbus-user-session, which pulls systemd);
  # chromium: the agent's browser, driven over its DevTools pipe (guest/browser.py), run as `browser`.
  apt-get install -y --no-install-recommends \
    xvfb openbox firefox-esr chromium xterm \
    fonts-dejavu-core fonts-liberation2 \
    supervisor python3 python3-venv ca-certificates x11-utils procps \
    dbus-x11
  apt-get clean
  rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin /var/log/apt /var/log/dpkg.log

  # The desktop user: uid/gid 1000, no sudo, no extra groups.
  if ! id sandbox >/dev/null 2>&1; then
    groupadd --gid 1000 sandbox
    useradd --uid 1000 --gid 1000 --create-home --home-dir /home/sandbox \
      --shell /bin/bash sandbox
  fi
  # No path to root: no sudo/su for this user (sudo is not installed; lock
  # the password so su to it is impossible too).
  passwd -l sandbox >/dev/null
  mkdir -p /home/sandbox/Documents /home/sandbox/Downloads
  chown -R sandbox:sandbox /home/sandbox
  # The agent's user: owns the agent process and its token, so the desktop user can neither read
  # the token nor signal or trace the agent. Member of group `sandbox` only to read the desktop
  # user's files for GET /v1/files (the home is 0750); no home, no login, locked.
  if ! id agent >/dev/null 2>&1; then
    groupadd --gid 1002 agent
    useradd --uid 1002 --gid 1002 --groups sandbox --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin agent
  fi
  passwd -l agent >/dev/null
  # The agent's browser's user: chromium under the agent's DevTools pipe runs as `browser` (uid 1003),
  # so neither the desktop user nor a page can read its profile, its memory or the pipe's ends through
  # /proc (docs/ARCHITECTURE.md, contract 8). Its home is 0700; no login.
  if ! id browser >/dev/null 2>&1; then
    groupadd --gid 1003 browser
    useradd --uid 1003 --gid 1003 --create-home --home-dir /home/browser --shell /usr/sbin/nologin browser
  fi
  chmod 0700 /home/browser
  passwd -l browser >/dev/null
}

configure() {
  [ -n "$src" ] || { echo "provision.sh configure: SRC missing" >&2; exit 2; }
  # Browser enterprise policies: fixed proxy (the gateway), no DoH, no
  # telemetry/updates/studies, no first-run pages. Locked, so a page or the
  # model cannot turn them off from about:preferences.
  install -d /usr/lib/firefox-esr/distribution
  install -m 0644 "$src/images/firefox/policies.json" /usr/lib/firefox-esr/distribution/policies.json
  # Default preferences that stop background requests to Mozilla services.
  install -m 0644 "$src/images/firefox/desktop-sandbox.js" /usr/lib/firefox-esr/defaults/pref/desktop-sandbox.js
  # The agent's chromium: managed policies (fixed proxy for everything, loopback included; no password
  # manager, no DevTools for the person at the screen, no javascript: URLs typed in the address bar);
  # see images/chromium/. The second name links to the proxy routes the agent writes as it launches
  # chromium (guest/chromium_policy.py: the guest-local origins the task opens, direct), in a directory
  # only the agent writes; sorting after the first, its ProxySettings win; while it is missing the
  # first file's apply.
  install -d /etc/chromium/policies/managed
  install -m 0644 "$src/images/chromium/policies.json" /etc/chromium/policies/managed/desktop-sandbox.json
  ln -sfn /run/desktop-sandbox-browser/proxy.json /etc/chromium/policies/managed/desktop-sandbox.proxy.json
  # Window manager: the desktop's fixed tiled layout (browser on top, terminal
  # strip below), no key bindings, click-to-focus only (images/openbox/rc.xml).
  install -d /etc/xdg/openbox
  install -m 0644 "$src/images/openbox/rc.xml" /etc/xdg/openbox/rc.xml
  # The gateway's address is given as the name `gateway` (an /etc/hosts entry
  # written by the sandbox backend), so no DNS is needed to find it.
}

case "$phase" in
  packages) packages ;;
  configure) configure ;;
  all) packages; configure ;;
  *) echo "usage: provision.sh packages|configure SRC|all SRC" >&2; exit 2 ;;
esac
