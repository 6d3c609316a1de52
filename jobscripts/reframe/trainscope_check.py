"""ReFrame test: one trainscope run on a system partition, its figures as performance variables.

A run-only test (nothing is built): ReFrame launches the trainscope binary with the partition's
launcher (srun, mpirun, ...) under its scheduler, then reads the run file the run wrote:
  sanity       the run file's `status` attribute is "completed" (an interrupted, failed or missing
               run file fails the test, whatever the exit code said)
  performance  from /summary: samples_per_s (throughput_samples_per_s), median_step_s, and where
               defined tokens_per_s (LLM runs), mfu (model FLOPs utilisation: GPUs with known
               peak FLOPs) and scaling_efficiency = samples_per_s / (ranks x baseline_samples_per_s)
               when a single-rank baseline is given.

  reframe -C jobscripts/reframe/settings.py -c jobscripts/reframe/trainscope_check.py -r
  # other configs, ranks, binary, extra trainscope options (-P runs one test per value):
  reframe -C ... -c ... -r -P config=inputs/quickstart.ini,inputs/llm/lora-tiny.ini \
      -S num_tasks=8 -S trainscope=/opt/trainscope/bin/trainscope \
      -S 'options=--train.max_iters=200,--run.device=cuda'

References: REFERENCES below, keyed by the config file's stem, then by `system:partition` as
ReFrame's `reference` is: (value, lower, upper, unit) with lower/upper as fractions of the value
(-0.1 = fail when more than 10% below; None = unbounded). A centre measures a run it trusts,
copies the figures from the perf log into an entry for its partition, and chooses thresholds
from the repeats' spread (see jobscripts/README.md).
"""

import math
import os
import shlex
import sys
from pathlib import Path

import h5py
import reframe as rfm
import reframe.utility.sanity as sn
import reframe.utility.typecheck as typ
from reframe.core.builtins import run_after, run_before, sanity_function, variable

ROOT = Path(__file__).resolve().parents[2]
# The run-file paths (trainscope_post/schema.py: standard library only) from this checkout, as
# jobscripts/study finds the package.
sys.path.insert(0, str(ROOT / "postprocess"))
from trainscope_post import schema  # noqa: E402

# config stem -> system:partition -> perf variable -> (value, lower, upper, unit)
REFERENCES = {
    # This kind of machine (2 CPU cores, 2 ranks, a few iterations): bounds that catch a broken
    # or pathologically slow build (10x off), not a tuned figure. Measured 2026-11 on the 2-core
    # test VM: quickstart 322 samples/s, median step 0.40 s; lora-tiny 27 samples/s, 3800
    # tokens/s, median step 0.30 s.
    "quickstart": {
        "trainscope-local:cpu": {
            "samples_per_s": (300.0, -0.9, None, "samples/s"),
            "median_step_s": (0.4, None, 9.0, "s"),
        },
        # A centre's entry (commented example): 4 x H100 per node, FP32, 4 ranks.
        # "mycluster:gpu": {
        #     "samples_per_s": (9000.0, -0.10, None, "samples/s"),
        #     "median_step_s": (0.028, None, 0.10, "s"),
        #     "scaling_efficiency": (0.9, -0.05, None, "1"),
        # },
    },
    "lora-tiny": {
        "trainscope-local:cpu": {
            "samples_per_s": (25.0, -0.9, None, "samples/s"),
            "tokens_per_s": (3500.0, -0.9, None, "tokens/s"),
            "median_step_s": (0.3, None, 9.0, "s"),
        },
    },
}

UNITS = {"samples_per_s": "samples/s", "tokens_per_s": "tokens/s", "median_step_s": "s",
         "mfu": "1", "scaling_efficiency": "1"}


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


@rfm.simple_test
class TrainscopeRun(rfm.RunOnlyRegressionTest):
    descr = "trainscope training run: throughput, step time, efficiency from the run file"
    valid_systems = ["*"]
    valid_prog_environs = ["*"]
    sourcesdir = None
    maintainers = ["trainscope"]
    tags = {"trainscope", "benchmark"}

    #: trainscope binary (a site installs it anywhere; default: this checkout's build)
    trainscope = variable(str, value=str(ROOT / "build" / "app" / "trainscope"))
    #: config file, absolute or relative to `workdir`
    config = variable(str, value="inputs/quickstart.ini")
    #: directory the run starts in (configs name their data relative to the checkout)
    workdir = variable(str, value=str(ROOT))
    #: extra trainscope options, e.g. ["--train.max_iters=200", "--run.device=cuda"]
    options = variable(typ.List[str], value=[])
    #: single-rank samples/s of the same config and per-rank batch, measured on this partition
    #: (0 = unknown: no scaling_efficiency)
    baseline_samples_per_s = variable(float, value=0.0)
    num_tasks = 2
    time_limit = "30m"
    run_file = "run.h5"
    keep_files = ["run.h5"]  # copied to ReFrame's output directory for trainscope-post

    @run_after("setup")  # after -S / -P have set `config`
    def set_references(self):
        self.reference = REFERENCES.get(Path(self.config).stem, {})

    @run_before("run")
    def set_command(self):
        self.executable = self.trainscope
        cfg = Path(self.config)
        if not cfg.is_absolute():
            cfg = Path(self.workdir) / cfg
        self.executable_opts = ["--config", str(cfg),
                                f"--output.file={os.path.join(self.stagedir, self.run_file)}",
                                "--output.overwrite=true", *self.options]
        # The run starts in the checkout (relative data paths); the run file goes to the stage.
        self.prerun_cmds = [f"cd {shlex.quote(self.workdir)}"]
        # Partition-specific launcher flags (the local site config: --oversubscribe).
        self.job.launcher.options += self.current_partition.extras.get("launcher_options", [])

    def _summary(self):
        path = os.path.join(self.stagedir, self.run_file)
        with h5py.File(path, "r") as f:
            summary = dict(f[schema.SUMMARY].attrs) if schema.SUMMARY in f else {}
            return _text(f.attrs.get("status", "")), summary

    @sanity_function
    def run_completed(self):
        path = os.path.join(self.stagedir, self.run_file)
        if not os.path.exists(path):
            return sn.assert_true(False, msg=f"no run file {path} (see {self.stdout} and "
                                  f"{self.stderr})")
        status, _ = self._summary()
        return sn.assert_eq(status, "completed",
                            msg=f"run file status is {{0!r}}, not {{1!r}} ({path})")

    @run_before("performance")
    def set_perf_variables(self):
        # Only the figures this run defines: tokens for LLM runs, MFU where peak FLOPs are known,
        # efficiency with a baseline.
        _, s = self._summary()
        values = {
            "samples_per_s": float(s.get("throughput_samples_per_s", math.nan)),
            "median_step_s": float(s.get("median_step_s", math.nan)),
            "tokens_per_s": float(s.get("throughput_tokens_per_s", math.nan)),
            "mfu": float(s.get("mfu", math.nan)),
        }
        if self.baseline_samples_per_s > 0:
            values["scaling_efficiency"] = values["samples_per_s"] / (
                self.num_tasks * self.baseline_samples_per_s)
        self.perf_variables = {
            name: sn.make_performance_function(sn.defer(v), UNITS[name])
            for name, v in values.items() if math.isfinite(v)}
