"""trainscope job execution: render and submit the job scripts of sweeps and studies, follow their
points, run co-allocations, and start MPI launches on this machine.

Analysis of the run files lives in trainscope_post; this package may import it (a point's state
reads its run file's status), never the other way round. Schedulers (Slurm, PBS, the local
runner) sit behind one registry in trainscope_jobs.schedulers; where the clone or installation
and the default binary are is decided once, in trainscope_jobs.paths. The modules that render and
submit (sweep, the schedulers, paths, launch) need only the standard library, so jobscripts/sweep
and scripts/mpirun run under any python3."""
