"""The shell that watches a training container for a scheduler (pure: lines of bash). One path for both
schedulers: the Slurm batch script (core/sched/batch.py) and the Kubernetes pod's command (core/sched/k8s.py).

    * before the start it removes an earlier run's stop request and answer (agent/stop_request.py);
    * a ``save`` signal (Slurm: USR1, ``--signal=B:USR1@N`` before the time limit, or at a preemption with
      ``PreemptParameters=send_user_signal``; Kubernetes: TERM, a deleted pod) writes the stop request: the trainer
      saves a checkpoint at its next step boundary, names it in the stopped marker and exits; the shell keeps
      waiting for it (``wait`` returns at every trapped signal);
    * a ``stop`` signal (Slurm: TERM and INT: scancel, a requeue, the time limit itself) stops the container at
      once and exits 143: a user's stop is never requeued;
    * afterwards, when a save was asked for and the marker is there, ``after_save`` runs (Slurm: ``scontrol
      requeue``, so the job starts again and ``train --resume auto`` takes exactly that checkpoint).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

SUPERVISED_ENV = "KTDEPLOY_SUPERVISED"   # set for the agent: this shell owns the stop request (agent/stop_request.py)

# The CPUs of this shell's cgroup (cpuset, v1 or v2), found where this mount namespace has the cgroup file system;
# nothing when the shell sits in the root cpuset (no ConstrainCores: the job's cores are not fenced).
CPUSET_FN = r"""ktd_cgroup_cpus() {
  local ctl p dir file
  while IFS=: read -r _ ctl p; do
    case ",$ctl," in
      *,cpuset,*) dir=/sys/fs/cgroup/cpuset; file=cpuset.effective_cpus ;;
      ,,) dir=/sys/fs/cgroup; file=cpuset.cpus.effective ;;
      *) continue ;;
    esac
    while [ -n "$p" ] && [ "$p" != / ]; do
      if [ -r "$dir$p/$file" ]; then cat -- "$dir$p/$file"; return 0; fi
      case "$p" in /*/*) p="/${p#/*/}" ;; *) p= ;; esac
    done
  done < /proc/self/cgroup
  return 0
}"""


@dataclass(frozen=True)
class Supervision:
    save_on: tuple[str, ...]          # signals that ask for a checkpoint, then an orderly end
    stop_on: tuple[str, ...]          # signals that stop the container now
    stop_request: str = ""
    stopped_marker: str = ""
    stop_lines: tuple[str, ...] = ()  # how the runtime's container is stopped at once
    after_save: tuple[str, ...] = ()  # what runs once the checkpoint was saved on request (then the shell exits)
    who: str = "the scheduler"


def prologue(s: Supervision) -> list[str]:
    """Variables, traps and the stale request removed: before the container starts."""
    lines = ["save_asked=0"]
    if s.save_on:
        lines += [f"stop_request={shlex.quote(s.stop_request)}",
                  f"stopped_marker={shlex.quote(s.stopped_marker)}",
                  'mkdir -p -- "$(dirname -- "$stop_request")"',
                  'rm -f -- "$stop_request" "$stopped_marker"',
                  "ktd_save() {",
                  f'  echo "ktdeploy: $1 from {s.who}: the trainer saves a checkpoint at its next step boundary and '
                  'stops"',
                  "  save_asked=1",
                  '  printf \'%s\\n\' "$1" > "$stop_request"',
                  "}"]
        lines += [f"trap 'ktd_save {sig}' {sig}" for sig in s.save_on]
    if s.stop_on:
        lines += ["ktd_stop() {", '  echo "ktdeploy: signal received, stopping $cname"',
                  *(f"  {x}" for x in s.stop_lines), "  exit 143", "}",
                  f"trap ktd_stop {' '.join(s.stop_on)}"]
    return lines


def wait_lines(launch: str) -> list[str]:
    """Start ``launch`` in the background and wait for it through any number of trapped signals; then the exit
    code, and ``after_save`` when a save was asked for and the trainer named its checkpoint."""
    return [f"{launch} &",
            "pid=$!",
            # a trapped signal ends `wait` early with 128+n while the trainer runs on: wait again
            'while :; do wait "$pid"; rc=$?; if [ "$rc" -gt 128 ] && kill -0 "$pid" 2>/dev/null; then continue; fi; '
            "break; done"]


def epilogue(s: Supervision) -> list[str]:
    lines = ['echo "ktdeploy: $cname exited $rc"']
    if s.save_on and s.after_save:
        lines += ['if [ "$save_asked" = 1 ] && [ -s "$stopped_marker" ] && [ ! -h "$stopped_marker" ]; then',
                  '  echo "ktdeploy: checkpoint saved on request: $(head -c 300 -- "$stopped_marker")"',
                  *(f"  {x}" for x in s.after_save),
                  "fi"]
    lines.append('exit "$rc"')
    return lines
