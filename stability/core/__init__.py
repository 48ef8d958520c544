"""The bottom layer: the result row, the errors and the dtype limits every layer shares."""
