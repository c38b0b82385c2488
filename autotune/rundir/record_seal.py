"""A rank's observed record sealed with its launch's key, and the seal checked: an HMAC-SHA256 over the record's
canonical JSON, keyed by a secret the launcher hands only to its ranks' processes (``OBSERVE_KEY_ENV``). Another
writer of the run directory can rewrite a record, this launch's id included, but not seal it. Standard library only:
the observer imports it before the script's first line."""

from __future__ import annotations

import hashlib
import hmac
import json

SEAL = "seal"  # the record's field that holds its seal


def _canonical(record: dict) -> bytes:
    body = {k: v for k, v in record.items() if k != SEAL}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, default=str).encode()


def sealed(text: str, key: str) -> str:
    """``text`` (a record as JSON, written by the rank's observer) with its seal: the record as it reads back is what
    is sealed, so the reader's canonical form is the writer's."""
    record = json.loads(text)
    record[SEAL] = hmac.new(key.encode(), _canonical(record), hashlib.sha256).hexdigest()
    return json.dumps(record)


def is_sealed(record: dict, key: str) -> bool:
    """Whether ``record`` (read back from JSON) carries the seal ``key`` makes of it."""
    seal = record.get(SEAL)
    if not isinstance(seal, str):
        return False
    try:
        expected = hmac.new(key.encode(), _canonical(record), hashlib.sha256).hexdigest()
    except (TypeError, ValueError):
        return False
    return hmac.compare_digest(seal, expected)
