#!/bin/sh
# Container entrypoint: pick the role's supervisord configuration.
#   desktop  Xvfb, openbox, the guest agent and the demo app (user sandbox)
#   gateway  egress policy proxy and the agent relay (user gateway)
# Any other command is run as given (diagnostics: `docker run --rm IMAGE xdpyinfo`).
set -eu
conf_dir=/opt/desktop-sandbox/src/images/supervisor
case "${1:-desktop}" in
  desktop|gateway)
    mkdir -p /run/desktop-sandbox 2>/dev/null || true
    exec /usr/bin/supervisord --nodaemon --configuration "$conf_dir/$1.conf" ;;
  *) exec "$@" ;;
esac
