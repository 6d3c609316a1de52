"""The one error type of job execution: a sweep, study or co-allocation that cannot be rendered,
submitted or queried as asked. Its message names what was wrong and the fix; the commands print
it on one line and exit 2."""


class JobError(Exception):
    pass
