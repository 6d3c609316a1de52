"""trainscope post-processing: read run files (schema trainscope/1) into tables and plots.

The run-file names are imported on first use, so that the modules that need only the standard
library (sweep, the job-script renderer) run under any python3, without h5py or numpy."""

__all__ = ["IncompleteRunError", "RunFile", "SchemaError"]


def __getattr__(name):
    if name in __all__:
        from . import runfile
        return getattr(runfile, name)
    raise AttributeError(f"module 'trainscope_post' has no attribute {name!r}")
