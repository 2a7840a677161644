"""Renderers: each turns report data into text; none of them computes anything new. Each is imported where
it is used, so that a lint that prints text loads no table library."""

FORMATS = ("text", "json", "sarif", "github", "markdown", "html", "parquet")  # lint's --format
