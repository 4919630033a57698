#!/bin/sh
# Install the authorized key for root and kt, make fresh host keys, run sshd in the foreground.
set -eu
key="${AUTHORIZED_KEY:-}"
[ -z "$key" ] && [ -f /run/authorized_keys ] && key="$(cat /run/authorized_keys)"
if [ -z "$key" ]; then
  echo "testhost: no AUTHORIZED_KEY env and no /run/authorized_keys mount" >&2
  exit 2
fi
for home in /root /home/kt; do
  mkdir -p "$home/.ssh"
  printf '%s\n' "$key" > "$home/.ssh/authorized_keys"
  chmod 700 "$home/.ssh"; chmod 600 "$home/.ssh/authorized_keys"
done
chown -R kt:kt /home/kt/.ssh
# Let kt use a mounted docker socket (its group id differs between machines).
if [ -S /var/run/docker.sock ]; then
  gid="$(stat -c %g /var/run/docker.sock)"
  getent group "$gid" >/dev/null || groupadd -g "$gid" hostdocker
  usermod -aG "$(getent group "$gid" | cut -d: -f1)" kt
fi
ssh-keygen -A >/dev/null
exec /usr/sbin/sshd -D -e
