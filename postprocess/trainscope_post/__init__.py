"""trainscope post-processing: read run files (schema trainscope/1) into tables and plots."""

from .runfile import RunFile, SchemaError

__all__ = ["RunFile", "SchemaError"]
