"""Schedulers (pure): what ktdeploy hands Slurm and Kubernetes from its own knowledge — CPU features proven by
doctor, the planner's memory upper edge, the thread plan, the image variant's CPU needs.

    features.py   proven CPU features of a node, the one image-variant -> CPU-needs mapping, node weights
    request.py    a training job's resource request (memory, CPUs, GPUs, constraint, time) from recipe + plan
    slurm.py      slurm.conf node lines and gres.conf from host facts; sinfo/squeue/scontrol parsers; fit check
    batch.py      the sbatch scripts (header from the request, body the image's agent started by the job's runtime)
    runtimes.py   podman (rootless), pyxis, apptainer, docker: how a job starts the image inside (or, docker, outside)
                  its cgroup
    supervise.py  the shell around the training container: stop request on the scheduler's warning, requeue
    cluster.py    the login node's probe (runtimes, cgroup config) and the slurm.runtime / slurm.cgroup checks
    cpuset.py     a job's CPUs (cgroup, SLURM_CPU_BIND, mask) and the one kt threads rule
    signal_time.py how early the job is warned before its time limit (step time, save time)
    k8s.py        Kubernetes Job (training) and Deployment + Service (serving) manifests
    slurm_plan.py the plan of `up-slurm` (the stages of `up --host`, TRAIN and CONVERT submitted as jobs)
    job_files.py  `render --slurm | --k8s`: the batch scripts and manifests of a recipe
"""
