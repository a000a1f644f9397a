"""The docs check (ctest docs.check, label cpu; standard library only, a second or two):
- every results file (docs/results/) parses and conforms to tools/bench/results.py's schema;
- every results file and every decision record (docs/decisions/) is linked from a page;
- every relative link in the repository's Markdown pages leads to a file that exists, and no page points
  outside the repository (../shared/ and the like);
- docs/performance.md is what tools/bench/performance_page.py makes of the store.

    python3 tests/docs/check_docs.py [REPO_ROOT]
"""

import os
import re
import sys

ROOT = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "bench"))
import performance_page  # noqa: E402
import results  # noqa: E402

LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = ["README.md", "docs", "tools/manifests/README.md"]


def pages():
    for entry in PAGES:
        path = os.path.join(ROOT, entry)
        if os.path.isfile(path):
            yield path
        for folder, _, names in os.walk(path) if os.path.isdir(path) else []:
            yield from (os.path.join(folder, n) for n in sorted(names) if n.endswith(".md"))


def main():
    failures = []
    store = os.path.join(ROOT, "docs", "results")
    runs = {}
    for name in sorted(os.listdir(store)):
        if not name.endswith(".json"):
            failures.append(f"docs/results/{name}: only results files (*.json) belong in the store")
            continue
        try:
            runs[name] = results.load(os.path.join(store, name))
        except ValueError as e:  # json.JSONDecodeError is one
            failures.append(str(e).replace(ROOT + os.sep, ""))

    linked = set()
    for page in pages():
        text = open(page, encoding="utf-8").read()
        rel = os.path.relpath(page, ROOT)
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = os.path.normpath(os.path.join(os.path.dirname(page), target.split("#")[0]))
            if not path.startswith(ROOT + os.sep):
                failures.append(f"{rel}: link '{target}' leads outside the repository")
            elif not os.path.exists(path):
                failures.append(f"{rel}: link '{target}' leads to no file")
            linked.add(path)
        for stale in re.findall(r"\.\./shared/\S+|`shared/\S+`", text):
            failures.append(f"{rel}: '{stale}' is outside the repository")

    for name in runs:
        if os.path.join(store, name) not in linked:
            failures.append(f"docs/results/{name}: no page links it (docs/performance.md should: regenerate it)")
    decisions = os.path.join(ROOT, "docs", "decisions")
    for name in sorted(os.listdir(decisions)):
        if re.match(r"\d{4}-.*\.md$", name) and os.path.join(decisions, name) not in linked:
            failures.append(f"docs/decisions/{name}: no page links it (add it to docs/decisions/README.md)")

    if not failures:
        page = os.path.join(ROOT, "docs", "performance.md")
        current = open(page, encoding="utf-8").read() if os.path.exists(page) else ""
        if current != performance_page.render(runs):
            failures.append("docs/performance.md is not the store's: run python3 tools/bench/performance_page.py")

    for failure in failures:
        print(f"FAIL {failure}")
    print(f"docs check: {len(runs)} results files, {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
