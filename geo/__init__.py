"""Geography: spines (standard, AIAN, optimized), bypassing, custom block groups, block assignment files."""


class GeographyError(ValueError):
    """A block assignment file, spine file or units table that breaks the geography's contract (the message
    names the file or table, the block and the value). A ValueError, as before it was declared."""
