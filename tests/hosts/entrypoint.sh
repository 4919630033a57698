#!/bin/sh
# Fresh host keys per container; the authorized key comes from the fixture ($AUTHORIZED_KEY).
set -e
ssh-keygen -A >/dev/null
if [ -n "$AUTHORIZED_KEY" ]; then printf '%s\n' "$AUTHORIZED_KEY" > /root/.ssh/authorized_keys; chmod 600 /root/.ssh/authorized_keys; fi
exec /usr/sbin/sshd -D -e
