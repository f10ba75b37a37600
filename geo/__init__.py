"""Geography: spines (standard, AIAN, optimized), bypassing, custom block groups, block assignment files."""
