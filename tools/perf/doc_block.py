"""Replace the generated block of a markdown file between two marker lines.

The tables in docs/performance.md are made by scripts (suite_table.py, contention_grid.py);
each owns the text between its `<!-- NAME:begin -->` and `<!-- NAME:end -->` lines.
"""
import re
import sys


def replace_block(path, name, text, tool):
    """Put `text` between the NAME markers of `path`; exit naming `tool` if they are missing."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    with open(path) as f:
        doc = f.read()
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(doc):
        sys.exit(f"{tool}: {path} has no '{begin}' ... '{end}' block")
    doc = pattern.sub(lambda _: f"{begin}\n{text}{end}", doc, count=1)
    with open(path, "w") as f:
        f.write(doc)
    print(f"wrote the table into {path}", file=sys.stderr)


def publish(text, path, name, tool):
    """The report `text` into the NAME block of `path` (--write), or to stdout without one."""
    if path:
        replace_block(path, name, text, tool)
    else:
        sys.stdout.write(text)
