#!/bin/sh
# Container entrypoint: pick the role's supervisord configuration.
#   desktop  Xvfb, openbox, the demo app (user sandbox), the guest agent (user agent) and the launch
#            broker, under supervisord run as root with only CAP_SETUID/CAP_SETGID/CAP_KILL
#            (images/supervisor/desktop.conf). Needs uid 0 and, made by the container's tmpfs mounts
#            or the VM's unit: /run/desktop-sandbox (agent, 0700), /run/desktop-sandbox-control
#            (root, group agent, 0750), /run/desktop-sandbox-browser (agent, 0755: the proxy routes
#            of the agent's chromium), /home/sandbox (sandbox, 0750), /home/browser (browser, 0700).
#   gateway  egress policy proxy and the agent relay (user gateway)
# Any other command is run as given (diagnostics: `docker run --rm IMAGE xdpyinfo`).
set -eu
conf_dir=/opt/desktop-sandbox/src/images/supervisor
session=/opt/desktop-sandbox/src/images/session
case "${1:-desktop}" in
  desktop)
    if [ "$(id -u)" != 0 ]; then
      echo "entrypoint: the desktop role runs supervisord as root (uid 0, only CAP_SETUID/CAP_SETGID/CAP_KILL); got uid $(id -u)" >&2
      exit 1
    fi
    # One X cookie per session, copied to the desktop user (also the X server's -auth file) and to
    # the agent, each written by that user so each file is its own.
    cookie=$(/opt/desktop-sandbox/bin/python -c 'import secrets; print(secrets.token_hex(16))')
    printf '%s\n' "$cookie" | setpriv --reuid=sandbox --regid=sandbox --init-groups -- \
      /opt/desktop-sandbox/bin/python "$session/xauth.py" /home/sandbox/.Xauthority
    printf '%s\n' "$cookie" | setpriv --reuid=agent --regid=agent --init-groups -- \
      /opt/desktop-sandbox/bin/python "$session/xauth.py" /run/desktop-sandbox/xauthority
    # The agent's chromium runs as `browser` (contract 8). Without a writable home of its own (an old
    # image or disk) the session still starts; only that browser cannot open the display.
    if [ -d /home/browser ]; then
      printf '%s\n' "$cookie" | setpriv --reuid=browser --regid=browser --init-groups -- \
        /opt/desktop-sandbox/bin/python "$session/xauth.py" /home/browser/.Xauthority \
        || echo "entrypoint: no X cookie for the user browser (/home/browser not writable): the agent's chromium cannot start" >&2
    fi
    unset cookie
    exec /usr/bin/supervisord --nodaemon --configuration "$conf_dir/desktop.conf" ;;
  gateway)
    mkdir -p /run/desktop-sandbox 2>/dev/null || true
    exec /usr/bin/supervisord --nodaemon --configuration "$conf_dir/gateway.conf" ;;
  *) exec "$@" ;;
esac
