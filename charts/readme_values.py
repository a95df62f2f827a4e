#!/usr/bin/env python3
"""The values table of charts/sidecar-injector/README.md, made from values.yaml.

A key is documented by the comment block just above it that starts with "# --". The table
goes between the README's "<!-- values:start -->" and "<!-- values:end -->" markers.

    python3 charts/readme_values.py           print the table
    python3 charts/readme_values.py --write   rewrite the README's table
    python3 charts/readme_values.py --check   exit 1 if the README's table is stale
"""

import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent / "sidecar-injector"
START, END = "<!-- values:start -->", "<!-- values:end -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):")


def documented_keys(text):
    """[(dotted key, description)] in file order, for every key with a "# --" block."""
    out, stack, doc = [], [], None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            doc = [stripped[4:].strip()]
            continue
        if stripped.startswith("#"):
            if doc is not None:
                doc.append(stripped[1:].strip())
            continue
        m = KEY.match(line)
        if not m:
            doc = None
            continue
        indent = len(m["indent"])
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m["key"]))
        if doc is not None:
            out.append((".".join(k for _, k in stack), " ".join(doc)))
        doc = None
    return out


def lookup(values, dotted):
    for part in dotted.split("."):
        values = values[part]
    return values


def leaf_keys(values, prefix=""):
    """Every dotted key whose value is not a non-empty map."""
    for key, value in values.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from leaf_keys(value, path + ".")
        else:
            yield path


def undocumented(values_text):
    values = yaml.safe_load(values_text)
    keys = [k for k, _ in documented_keys(values_text)]
    return [
        leaf for leaf in leaf_keys(values)
        if not any(leaf == k or leaf.startswith(k + ".") for k in keys)
    ]


def type_name(value):
    return {bool: "bool", int: "int", float: "number", str: "string", list: "list",
            dict: "map", type(None): "null"}[type(value)]


def table(values_text):
    values = yaml.safe_load(values_text)
    rows = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    for key, doc in documented_keys(values_text):
        value = lookup(values, key)
        default = json.dumps(value, separators=(", ", ": "))
        rows.append(f"| `{key}` | {type_name(value)} | `{default}` | {doc.replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"


def with_table(readme, values_text):
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table(values_text)}{END}{tail}"


def main(argv):
    values_text = (CHART / "values.yaml").read_text()
    missing = undocumented(values_text)
    if missing:
        print("values without a '# --' description: " + ", ".join(missing), file=sys.stderr)
        return 1
    readme_path = CHART / "README.md"
    if argv[1:] == ["--write"]:
        readme_path.write_text(with_table(readme_path.read_text(), values_text))
    elif argv[1:] == ["--check"]:
        readme = readme_path.read_text()
        if readme != with_table(readme, values_text):
            print("README.md values table is stale: python3 charts/readme_values.py --write",
                  file=sys.stderr)
            return 1
    else:
        sys.stdout.write(table(values_text))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
