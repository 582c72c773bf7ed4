#!/bin/sh
# Vagrant shell provisioner (runs as root in the box): the same steps as scripts/build-vm-image.sh on a
# running Debian 12 box instead of a chroot.
#   images/provision.sh packages -> the agent's venv (pyproject.toml dependencies) -> project code ->
#   images/provision.sh configure -> the session unit with Dockerfile.desktop's environment.
# Usage: provision-vagrant.sh SRC   (SRC holds images/, guest/, wire/, pyproject.toml, Dockerfile.desktop,
#                                    scripts/vm/ and agent-token, uploaded by the Vagrantfile)
set -eu
src=$1
sh "$src/images/provision.sh" packages
apt-get update -qq && apt-get install -y -qq --no-install-recommends qemu-guest-agent >/dev/null
python3 -m venv /opt/desktop-sandbox
python3 -c 'import tomllib,sys; print("\n".join(tomllib.load(open(sys.argv[1],"rb"))["project"]["dependencies"]))' \
  "$src/pyproject.toml" > /tmp/requirements.txt
/opt/desktop-sandbox/bin/pip install -q --disable-pip-version-check -r /tmp/requirements.txt
rm -rf /opt/desktop-sandbox/src && mkdir -p /opt/desktop-sandbox/src
cp -a "$src/images" "$src/guest" "$src/wire" /opt/desktop-sandbox/src/
echo /opt/desktop-sandbox/src > "$(/opt/desktop-sandbox/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/desktop-sandbox.pth"
sh /opt/desktop-sandbox/src/images/provision.sh configure /opt/desktop-sandbox/src

install -d /etc/desktop-sandbox
python3 "$src/scripts/vm/dockerfile-env.py" "$src/Dockerfile.desktop" > /etc/desktop-sandbox/session.env
cat "$src/scripts/vm/guest/session-vm.env" >> /etc/desktop-sandbox/session.env
# The box keeps its own network (DHCP on QEMU's user network gives it 10.0.2.15 too) and its root file
# system; the agent binds the guest address the host forward reaches.
grep -q '^10.0.2.100' /etc/hosts || printf '10.0.2.100\tgateway\n' >> /etc/hosts
# Token: given at provisioning time instead of fw_cfg (Vagrant's providers have no fw_cfg option).
install -d -m 0755 /etc/desktop-sandbox
install -o root -g root -m 0600 "$src/agent-token" /etc/desktop-sandbox/agent-token
# The unit's vm-config step (fw_cfg) is replaced by the same directories and the token from the file
# above: the token readable by the agent's user alone, the control directory not usable by the desktop
# user (the privilege model of scripts/vm/guest/vm-config).
sed -e '/^ExecStartPre=+\/usr\/local\/lib\/desktop-sandbox\/vm-config/d' \
  "$src/scripts/vm/guest/desktop-sandbox.service" > /etc/systemd/system/desktop-sandbox.service
install -d -m 0755 /etc/systemd/system/desktop-sandbox.service.d
cat > /etc/systemd/system/desktop-sandbox.service.d/token.conf <<'UNIT'
[Service]
ExecStartPre=+/usr/bin/install -d -o agent -g agent -m 0700 /run/desktop-sandbox
ExecStartPre=+/usr/bin/install -d -o root -g agent -m 0750 /run/desktop-sandbox-control
ExecStartPre=+/usr/bin/install -d -o sandbox -g sandbox -m 0750 /home/sandbox
ExecStartPre=+/usr/bin/install -o agent -g agent -m 0400 /etc/desktop-sandbox/agent-token /run/desktop-sandbox/agent-token
UNIT
systemctl disable --now supervisor.service 2>/dev/null || true
systemctl daemon-reload
systemctl enable desktop-sandbox.service
systemctl restart desktop-sandbox.service
rm -rf "$src" /tmp/requirements.txt
echo "desktop-sandbox: session started; agent on 10.0.2.15:8000 in the guest"
