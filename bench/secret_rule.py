"""The secret rule (autotune.redaction) scored (issue 52): its misses on the attack list, its false positives on the
ordinary-arguments corpus (bench/secret_corpus.py), and how often the long-random-string rule catches random strings
(fixed seeds). Prints the Markdown table BENCHMARKS.md holds.

    .venv/bin/python bench/secret_rule.py
"""

from __future__ import annotations

import base64
import random
import string
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from secret_corpus import attack_cases, ordinary_args  # noqa: E402

from autotune.redaction import looks_random, redact_args, secret_flags  # noqa: E402


def main() -> None:
    attacks = attack_cases()
    missed = [args for args, secret in attacks if any(secret in shown for shown in redact_args(args))]
    corpus = ordinary_args()
    alone = [a for a in corpus if secret_flags([a])]
    flagged = [a for a in corpus if secret_flags(["--input", a])]
    rng = random.Random(2052)
    b62 = string.ascii_letters + string.digits
    rows = [("attack list: secrets shown", f"{len(missed)} of {len(attacks)}"),
            ("ordinary corpus: refused as a positional argument", f"{len(alone)} of {len(corpus)}"),
            ("ordinary corpus: refused after --input", f"{len(flagged)} of {len(corpus)}")]
    for what, make in (("random base62, 32 characters", lambda: "".join(rng.choice(b62) for _ in range(32))),
                       ("random base62, 40 characters", lambda: "".join(rng.choice(b62) for _ in range(40))),
                       ("random base64url, 43 characters (32 bytes)",
                        lambda: base64.urlsafe_b64encode(rng.randbytes(32)).decode().rstrip("=")),
                       ("random base64, 40 characters (30 bytes)",
                        lambda: base64.b64encode(rng.randbytes(30)).decode())):
        caught = sum(looks_random(make()) for _ in range(20_000))
        rows.append((f"long-random rule: {what}", f"{caught / 200:.1f} % caught (20,000)"))
    print("| measure | result |\n|---|---|")
    for what, result in rows:
        print(f"| {what} | {result} |")
    for name, bad in (("missed", missed), ("refused", sorted(set(alone + flagged)))):
        for b in bad:
            print(f"{name}: {b}", file=sys.stderr)


if __name__ == "__main__":
    main()
