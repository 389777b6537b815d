#!/usr/bin/env python3
"""Puts a `kiln study quant` REPORT.md into a README between its study markers.

    tools/docs/splice_study.py README TITLE REPORT.md INTRO.md

The README holds `<!-- study:TITLE -->` ... `<!-- /study:TITLE -->`; everything between them
is replaced by `## TITLE`, the intro paragraph (where the run came from: GPU, command, commit)
and the report's body with its headings one level down (its `# kiln study quant` title dropped).
The numbers are the report's; this only moves text. Exits non-zero, changing nothing, when
the markers are missing or the report has no Regenerate line.
"""
import sys


def main(argv):
    if len(argv) != 5:
        sys.exit(__doc__)
    readme, title, report, intro = argv[1:]
    text = open(readme, encoding="utf-8").read()
    begin, end = f"<!-- study:{title} -->", f"<!-- /study:{title} -->"
    i, j = text.find(begin), text.find(end)
    if i < 0 or j < i:
        sys.exit(f"{readme}: no '{begin}' ... '{end}' markers")
    lines = open(report, encoding="utf-8").read().splitlines()
    start = next((k for k, l in enumerate(lines) if l.startswith("Regenerate:")), None)
    if start is None:
        sys.exit(f"{report}: no 'Regenerate:' line (not a kiln study quant report?)")
    body = ["#" + l if l.startswith("#") else l for l in lines[start:]]
    block = "\n".join([begin, f"## {title}", "", open(intro, encoding="utf-8").read().strip(), ""] + body).rstrip()
    out = text[:i] + block + "\n\n" + text[j:]
    tmp = readme + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(out)
    import os
    os.replace(tmp, readme)


if __name__ == "__main__":
    main(sys.argv)
