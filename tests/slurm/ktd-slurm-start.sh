#!/bin/sh
# Start munge and one Slurm daemon in this container (run by the cluster fixture with `docker exec`).
#   ktd-slurm-start controller|node
# /run/ktd-slurm (a read-only bind mount) holds slurm.conf, gres.conf and munge.key, shared by every container.
# KTD_FAKE_GPUS=N makes /dev/nvidia0..N-1 (character devices 195:i, what the NVIDIA driver creates), which
# gres.conf's File= lines name: Slurm allocates them as GPUs without any driver.
set -eu
role="$1"
conf=/run/ktd-slurm
install -d -o munge -g munge -m 0700 /etc/munge /var/lib/munge /var/log/munge
install -d -o munge -g munge -m 0755 /run/munge
install -o munge -g munge -m 0400 "$conf/munge.key" /etc/munge/munge.key
install -d /etc/slurm /var/log/slurm
install -m 0644 "$conf/slurm.conf" /etc/slurm/slurm.conf
[ -f "$conf/gres.conf" ] && install -m 0644 "$conf/gres.conf" /etc/slurm/gres.conf
[ -f "$conf/cgroup.conf" ] && install -m 0644 "$conf/cgroup.conf" /etc/slurm/cgroup.conf
i=0
while [ "$i" -lt "${KTD_FAKE_GPUS:-0}" ]; do
  [ -e "/dev/nvidia$i" ] || mknod "/dev/nvidia$i" c 195 "$i"
  i=$((i + 1))
done
runuser -u munge -- /usr/sbin/munged
case "$role" in
  controller)
    install -d -o slurm -g slurm /var/lib/slurm/slurmctld /var/log/slurm
    exec /usr/sbin/slurmctld ;;
  node)
    install -d /var/lib/slurm/slurmd
    # KTD_CGROUP=1: slurmd fences its jobs with cgroups (proctrack/cgroup, task/cgroup). docker mounts this
    # container's cgroup hierarchies read-only; mount them again, writable (its own cgroup namespace is the root)
    if [ "${KTD_CGROUP:-0}" = 1 ]; then
      if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
        umount /sys/fs/cgroup 2>/dev/null || true
        mount -t cgroup2 -o rw,nosuid,nodev,noexec cgroup2 /sys/fs/cgroup
      else
        for s in cpuset memory devices freezer; do
          umount "/sys/fs/cgroup/$s" 2>/dev/null || true
          mkdir -p "/sys/fs/cgroup/$s"
          mount -t cgroup -o "rw,nosuid,nodev,noexec,$s" cgroup "/sys/fs/cgroup/$s"
        done
      fi
    fi
    exec /usr/sbin/slurmd ;;
  *) echo "ktd-slurm-start: controller or node, not $role" >&2; exit 2 ;;
esac
