"""Renderers: each turns report data into text; none of them computes anything new."""

from attntrace.formats.summary_text import summary_table

__all__ = ["summary_table"]
