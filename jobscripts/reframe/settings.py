"""ReFrame site configuration for trainscope's test (trainscope_check.py).

trainscope-local: this machine. Local scheduler (no batch system), Open MPI's mpirun as the
launcher with --oversubscribe (more ranks than cores on a small machine) and the environment that
lets Open MPI run as root (containers, CI); one rank per core-share, OMP_NUM_THREADS=1 (trainscope
sets its own intra-op threads).

trainscope-testslurm: the test suite's single-node Slurm (tests/slurm/local_slurm.sh; select it
with --system trainscope-testslurm:batch and SLURM_CONF set). `squeue` scheduler: that Slurm keeps
no accounting database for sacct. mpirun inside the allocation: Debian's Slurm has no PMI for srun.

A cluster: copy the commented `mycluster` system below, set its hostnames, partitions, access
options (account, partition, constraint) and the environments that load trainscope's modules.
"""

import os

_ROOT_ENV = [["OMPI_ALLOW_RUN_AS_ROOT", "1"], ["OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"]] \
    if os.geteuid() == 0 else []

site_configuration = {
    "systems": [
        {
            "name": "trainscope-local",
            "descr": "this machine: local scheduler, mpirun",
            "hostnames": [".*"],
            "modules_system": "nomod",
            "partitions": [
                {
                    "name": "cpu",
                    "descr": "CPU ranks on this host",
                    "scheduler": "local",
                    "launcher": "mpirun",
                    "environs": ["plain"],
                    "max_jobs": 1,  # runs share the cores: one at a time
                    "env_vars": _ROOT_ENV + [["OMP_NUM_THREADS", "1"]],
                    "extras": {"launcher_options": ["--oversubscribe"]},
                },
            ],
        },
        {
            "name": "trainscope-testslurm",
            "descr": "the test suite's one-node Slurm (tests/slurm/local_slurm.sh)",
            "hostnames": ["^$"],  # only with --system
            "modules_system": "nomod",
            "partitions": [
                {
                    "name": "batch",
                    "scheduler": "squeue",
                    "launcher": "mpirun",
                    "environs": ["plain"],
                    "max_jobs": 1,
                    "env_vars": _ROOT_ENV + [["OMP_NUM_THREADS", "1"]],
                    "extras": {"launcher_options": ["--oversubscribe"]},
                },
            ],
        },
        # A Slurm cluster (commented example):
        # {
        #     "name": "mycluster",
        #     "descr": "4 x H100 per node",
        #     "hostnames": [r"login\d+", r"nid\d+"],
        #     "modules_system": "lmod",
        #     "partitions": [
        #         {
        #             "name": "gpu",
        #             "scheduler": "slurm",
        #             "launcher": "srun",  # srun --mpi=pmix: add it to access or launcher options
        #             "access": ["--partition=gpu", "--account=myproject", "--gpus-per-node=4"],
        #             "environs": ["trainscope"],
        #             "max_jobs": 8,
        #             "extras": {"launcher_options": ["--mpi=pmix", "--cpu-bind=cores"]},
        #             "resources": [{"name": "gpus", "options": ["--gpus-per-node={n}"]}],
        #         },
        #     ],
        # },
    ],
    "environments": [
        {"name": "plain"},  # the shell's environment: trainscope is built already
        # {"name": "trainscope", "modules": ["trainscope/1.0"], "target_systems": ["mycluster"]},
    ],
    "logging": [
        {
            "handlers": [
                {"type": "file", "name": "reframe.log", "level": "debug",
                 "format": "[%(asctime)s] %(levelname)s: %(check_info)s: %(message)s",
                 "append": False},
                {"type": "stream", "name": "stdout", "level": "info", "format": "%(message)s"},
            ],
            # One line per performance variable in
            # <perflogdir>/<system>/<partition>/<test>.log:
            # completion time|test|system:partition|variable=value unit (reference, bounds)|result
            "handlers_perflog": [
                {
                    "type": "filelog",
                    "prefix": "%(check_system)s/%(check_partition)s",
                    "level": "info",
                    "format": ("%(check_job_completion_time)s|%(check_display_name)s|"
                               "%(check_system)s:%(check_partition)s|%(check_num_tasks)s ranks|"
                               "%(check_perfvalues)s|%(check_result)s"),
                    "format_perfvars": ("%(check_perf_var)s=%(check_perf_value)s "
                                       "%(check_perf_unit)s (ref %(check_perf_ref)s, "
                                       "%(check_perf_lower_thres)s..%(check_perf_upper_thres)s)|"),
                    "append": True,
                },
            ],
        },
    ],
}
