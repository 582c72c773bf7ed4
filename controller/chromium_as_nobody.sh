#!/bin/sh
# Start Debian's chromium as the unprivileged user "nobody", with its sandbox on, for a caller that runs
# as root (Chromium refuses to run its sandbox as root). Playwright starts this script in place of the
# browser (controller/chromium.py): the profile directory it made, the one --user-data-dir names, is
# handed to nobody and doubles as HOME; the pipes Playwright talks over (fds 3 and 4) are inherited.
set -eu
profile=
for arg; do
  case $arg in --user-data-dir=*) profile=${arg#--user-data-dir=} ;; esac
done
if [ -z "$profile" ] || [ ! -d "$profile" ]; then
  echo "chromium_as_nobody: no --user-data-dir directory in the arguments" >&2
  exit 2
fi
chown -R nobody:nogroup "$profile"
export HOME="$profile"
exec setpriv --reuid=nobody --regid=nogroup --clear-groups --inh-caps=-all \
  "${DESKTOP_SANDBOX_CHROMIUM:-/usr/bin/chromium}" "$@"
