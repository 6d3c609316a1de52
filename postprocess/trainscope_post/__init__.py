"""trainscope post-processing: read run files (schema trainscope/1) into tables and plots."""

from .runfile import IncompleteRunError, RunFile, SchemaError

__all__ = ["IncompleteRunError", "RunFile", "SchemaError"]
