"""Normalises `helm template` output for snapshots: stdin in, stdout out.

- Certificate material (caBundle, ca.crt, tls.crt, tls.key) is masked: selfSigned mode makes
  new random certificates on every render.
- The templates in the ConfigMap (and the checksum of it) are masked: they are the
  repository's templates/, which change on their own; tests/test_config.py checks they are
  copied exactly.
- Documents are sorted by source file, kind and name. Helm 3 and Helm 4 order documents of
  kinds they do not know (cert-manager's) differently; the order is not part of the chart
  (Helm applies its own install order).
"""

import re
import sys

MASK = re.compile(r"^(\s*(?:caBundle|ca\.crt|tls\.crt|tls\.key|checksum/config): ).+$", re.M)
# A ConfigMap data key NAME.yaml.j2 and its (block or quoted) value.
TEMPLATE = re.compile(r"^  ([-._A-Za-z0-9]+\.yaml\.j2):.*(?:\n(?:    .*|\s*))*?(?=\n  \S|\Z)", re.M)


def normalise(text):
    text = TEMPLATE.sub(r"  \1: MASKED", MASK.sub(r"\1MASKED", text))
    docs = [d.strip("\n") for d in re.split(r"^---$", text, flags=re.M)]
    docs = [d for d in docs if d.strip()]

    def key(doc):
        source = re.search(r"^# Source: (.+)$", doc, re.M)
        kind = re.search(r"^kind: (.+)$", doc, re.M)
        name = re.search(r"^  name: (.+)$", doc, re.M)
        return tuple(m.group(1) if m else "" for m in (source, kind, name)) + (doc,)

    return "".join(f"---\n{d}\n" for d in sorted(docs, key=key))


if __name__ == "__main__":
    sys.stdout.write(normalise(sys.stdin.read()))
