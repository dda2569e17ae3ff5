#!/usr/bin/env python3
"""make test-docs: the user-facing documents stay readable and true to the scripts.

- no table cell of a reference page (README.md, docs/*.md, the chart's README) is over 400
  characters: a cell says what a field or part is; evidence belongs in tests and the CHANGELOG;
- no user document names a test (a Go test function, a GoogleTest case, a *_test file): the
  developer's pages (docs/development.md, docs/performance.md, docs/facility.md) and the
  CHANGELOG may;
- every relative link resolves to a file of the repository, and a #fragment to one of its headings;
- the README's quick start matches the scripts and the measurements: the demo's numbered steps,
  the nodes the facility brings up, the columns `kubectl get streampipelines` prints, the
  layout's paths and packages, and first-build figures within a fifth of what
  docs/development.md measured.

Prints each problem as FILE:LINE: what, and exits 1 if there is any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_CELL = 400
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")  # a regular expression in code is not a link


def documents():
    yield ROOT / "README.md"
    yield ROOT / "ARCHITECTURE.md"
    yield from sorted((ROOT / "docs").glob("*.md"))
    yield from sorted((ROOT / "charts").glob("*/README.md"))


def prose_lines(path):
    """(line number, text) of the lines outside fenced code blocks."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\*|_(?=\W)|(?<=\W)_", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    seen = {}
    result = set()
    for _, line in prose_lines(path):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return result


def check_cells(path, problems):
    for number, line in prose_lines(path):
        if not line.lstrip().startswith("|"):
            continue
        # a literal pipe inside code is written \| in a table
        cells = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        for cell in cells:
            if len(cell.strip()) > MAX_CELL:
                problems.append(f"{path.relative_to(ROOT)}:{number}: a table cell of "
                                f"{len(cell.strip())} characters (at most {MAX_CELL}): "
                                f"{cell.strip()[:60]}...")


# Go test functions, GoogleTest cases (Suite.CaseName) and test files, as the docs would quote them.
TEST_NAME = re.compile(r"`(Test[A-Z]\w*|[A-Z][A-Za-z0-9]+\.[A-Z][A-Za-z0-9]{12,}|[\w/.-]*_test\.(?:go|cpp|py))")
DEVELOPER_PAGES = {"docs/development.md", "docs/performance.md", "docs/facility.md"}


def check_test_names(path, problems):
    if str(path.relative_to(ROOT)) in DEVELOPER_PAGES:
        return
    for number, line in prose_lines(path):
        for name in TEST_NAME.finditer(line):
            problems.append(f"{path.relative_to(ROOT)}:{number}: names the test {name.group(1)}: "
                            f"a user document says what the product does; the test holds the evidence")


def check_links(path, problems, anchor_cache):
    for number, line in prose_lines(path):
        for target in LINK.findall(CODE_SPAN.sub("", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
                continue
            file_part, _, fragment = target.partition("#")
            linked = (path.parent / file_part).resolve() if file_part else path
            where = f"{path.relative_to(ROOT)}:{number}"
            if not linked.exists():
                problems.append(f"{where}: the link {target} names no file of the repository")
                continue
            if fragment and linked.suffix == ".md":
                if linked not in anchor_cache:
                    anchor_cache[linked] = anchors(linked)
                if fragment not in anchor_cache[linked]:
                    problems.append(f"{where}: the link {target} names no heading of "
                                    f"{linked.relative_to(ROOT)}")


def check_quick_start(problems):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    demo = (ROOT / "hack" / "demo-facility.sh").read_text(encoding="utf-8")
    steps = re.findall(r'^say "(\d+/\d+) ', demo, re.M)
    shown = re.findall(r"^== (\d+/\d+) ", readme, re.M)
    for step in shown:
        if step not in steps:
            problems.append(f"README.md: the demo's output shows step {step}; "
                            f"hack/demo-facility.sh has {', '.join(steps)}")
    facility = (ROOT / "hack" / "facility.sh").read_text(encoding="utf-8")
    up = re.search(r"^NODES=\(([^)]*)\)", facility, re.M)
    nodes = set(up.group(1).split()) if up else set()
    first = re.search(r'^say "1/\d+ (.*)"$', demo, re.M)
    demo_nodes = set(re.findall(r"\b(detector-[a-z]|gateway-[a-z]|gw-numa)\b", first.group(1))) if first else set()
    if demo_nodes != nodes:
        problems.append(f"hack/demo-facility.sh: its first step names the nodes {sorted(demo_nodes)}; "
                        f"hack/facility.sh brings up {sorted(nodes)}")
    intro = readme.split("```", 3)[2] if readme.count("```") >= 4 else readme
    said = re.search(r"`make demo` runs the whole mission.*?(?=\n\n)", readme, re.S)
    said_nodes = set(re.findall(r"`(detector-[a-z]|gateway-[a-z]|gw-numa)`", said.group(0))) if said else set()
    if said_nodes != nodes:
        problems.append(f"README.md: the quick start names the demo's nodes {sorted(said_nodes)}; "
                        f"hack/facility.sh brings up {sorted(nodes)}")
    types = (ROOT / "api" / "v1beta1" / "streampipeline_types.go").read_text(encoding="utf-8")
    columns = ["NAME"] + [c.upper() for c in re.findall(r"\+kubebuilder:printcolumn:name=\"([^\"]+)\"", types)]
    sample = re.search(r"^\$ kubectl get streampipelines.*\n(.*)$", readme, re.M)
    if not sample or sample.group(1).split() != columns:
        problems.append(f"README.md: the `kubectl get streampipelines` sample's columns are "
                        f"{sample.group(1).split() if sample else 'missing'}; the CRD prints {columns}")
    layout = re.search(r"^## Layout\n+```\n(.*?)```", readme, re.M | re.S)
    for number, line in enumerate(layout.group(1).splitlines() if layout else []):
        path = line.split()[0] if line and not line[0].isspace() else ""
        if path and not (ROOT / path).exists():
            problems.append(f"README.md: the layout names {path}, which the repository lacks")
    listed = re.search(r"^internal/ +the operator's and node daemon's packages: (.*?)\n(?=\S)", layout.group(1) if layout else "", re.M | re.S)
    named = set(re.findall(r"\b([a-z]+)\b(?![^(]*\))", listed.group(1))) if listed else set()
    have = {p.name for p in (ROOT / "internal").iterdir() if p.is_dir()}
    if named != have:
        problems.append(f"README.md: the layout's internal/ line names {sorted(named)}; internal/ holds {sorted(have)}")
    demo_claim = re.search(r"the first `make demo` takes\s+about (\d+) minutes", intro)
    test_claim = re.search(r"the first `make test` about (\d+)", intro)
    dev = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    demo_measured = re.search(r"cold `make demo`[^.]*?\b(\d+(?:\.\d+)?) min", dev)
    test_measured = re.search(r"\*\*Cold\*\*.*?\*\*(\d+(?:\.\d+)?) minutes\*\*", dev, re.S)
    for what, claim, measured in (("make demo", demo_claim, demo_measured),
                                  ("make test", test_claim, test_measured)):
        if not claim or not measured:
            problems.append(f"README.md: the quick start's first-`{what}` figure, or "
                            f"docs/development.md's measurement of it, is missing")
        elif abs(float(claim.group(1)) - float(measured.group(1))) > 0.2 * float(measured.group(1)):
            problems.append(f"README.md: the quick start says the first `{what}` takes about "
                            f"{claim.group(1)} minutes; docs/development.md measured "
                            f"{measured.group(1)}")


def main():
    problems = []
    anchor_cache = {}
    for path in documents():
        check_cells(path, problems)
        check_test_names(path, problems)
        check_links(path, problems, anchor_cache)
    check_quick_start(problems)
    for problem in problems:
        print(problem)
    if problems:
        print(f"check-docs: {len(problems)} problems", file=sys.stderr)
        return 1
    print(f"check-docs: {sum(1 for _ in documents())} documents, no problem")
    return 0


if __name__ == "__main__":
    sys.exit(main())
