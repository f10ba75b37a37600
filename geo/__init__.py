"""Geography: spines (standard, AIAN, optimized), bypassing, custom block groups, block assignment files."""
import gzip
import zlib

#: What reading a damaged compressed file raises (a truncated .gz: EOFError; a corrupt one: zlib.error or
#: BadGzipFile), beside the parser's own errors: the readers of input files declare them as input errors.
DAMAGED_FILE_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile)


class GeographyError(ValueError):
    """A block assignment file, spine file or units table that breaks the geography's contract (the message
    names the file or table, the block and the value). A ValueError, so that code catching ValueError still catches it."""


def one_line(exc: BaseException) -> str:
    """A library error that a declared error wraps, in one line: its type and its message's first line."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"
