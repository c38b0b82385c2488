"""The Kubeflow CRDs' ``openAPIV3Schema`` (tests/data/kubeflow_crds, Trainer v2.3.0 and training-operator v1.9) as
JSON Schema: ``crd_errors(doc)`` lists what the API server's schema validation would refuse in a TrainJob,
TrainingRuntime, ClusterTrainingRuntime or PyTorchJob: types, required fields, enums, maxItems, maxLength,
patterns, minimum, and unknown fields (refused, as kubectl's default ``--validate=strict`` has the server do).

OpenAPI v3 structural schemas are JSON Schema (draft 4) but for their ``x-kubernetes-*`` keys and ``nullable``.
Kept: ``x-kubernetes-preserve-unknown-fields`` (an object that keeps unknown fields), ``x-kubernetes-embedded-
resource`` (apiVersion, kind and metadata allowed), ``x-kubernetes-list-type`` with its map keys (``set``: items
unique; ``map``: keys unique, as the server's duplicate check). Ignored: the CEL rules (``x-kubernetes-
validations``) but for the three that touch the exported documents, written out in ``_CEL``; ``x-kubernetes-int-
or-string`` (its ``anyOf`` of integer and string is kept); ``format`` (int32 ranges, dates: not checked).
"""

import json
import re
from functools import cache

from helpers.support import ROOT, require

DATA = ROOT / "tests" / "data" / "kubeflow_crds"
FILES = {
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.json",
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "trainer.kubeflow.org_trainingruntimes.json",
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"): "trainer.kubeflow.org_clustertrainingruntimes.json",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.json",
}
_EMBEDDED = {"apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}}


def json_schema(node: dict) -> dict:
    """One OpenAPI v3 structural schema node as JSON Schema (draft 4), unknown fields refused."""
    out: dict = {}
    for key, value in node.items():
        if key == "properties":
            out[key] = {name: json_schema(s) for name, s in value.items()}
        elif key in ("items", "not") or (key == "additionalProperties" and isinstance(value, dict)):
            out[key] = json_schema(value)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [json_schema(s) for s in value]
        elif key in ("x-kubernetes-list-type", "x-kubernetes-list-map-keys"):
            out[key] = value  # checked by _list_type
        elif not key.startswith("x-kubernetes-") and key not in ("nullable", "default"):
            out[key] = value
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if node.get("x-kubernetes-embedded-resource"):
        out["properties"] = {**_EMBEDDED, **out.get("properties", {})}
    if "properties" in out and "additionalProperties" not in node and \
            not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def _list_type(validator, list_type, instance, schema):
    from jsonschema import ValidationError

    if not validator.is_type(instance, "array"):
        return
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen = set()
    for item in instance:
        key = json.dumps(item, sort_keys=True) if list_type == "set" else \
            tuple(item.get(k) for k in keys) if list_type == "map" and isinstance(item, dict) else None
        if key is not None and key in seen:
            yield ValidationError(f"duplicate entry {key!r} in a list of type {list_type} (keys {keys})")
        seen.add(key)


@cache
def validator(api_version: str, kind: str):
    jsonschema = require("jsonschema", "jsonschema (test extra) validates the manifests against the CRD schemas")
    stored = json.loads((DATA / FILES[(api_version, kind)]).read_text())
    assert (f"{stored['group']}/{stored['version']}", stored["kind"]) == (api_version, kind)
    cls = jsonschema.validators.extend(jsonschema.Draft4Validator, {"x-kubernetes-list-type": _list_type})
    return cls(json_schema(stored["openAPIV3Schema"]))


# The CEL rules (x-kubernetes-validations) of these CRDs that the exported documents can meet, written out
_CEL = {
    "TrainJob": [("metadata.name must match RFC 1035 DNS label format and be at most 63 characters",
                  lambda d: re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", d["metadata"]["name"])
                  and len(d["metadata"]["name"]) <= 63)],
    "TrainingRuntime": [("spec.mlPolicy: only one of the policies can be configured",
                         lambda d: sum(k in d["spec"].get("mlPolicy", {}) for k in
                                       ("torch", "mpi", "jax", "xgboost", "flux")) <= 1)],
}
_CEL["ClusterTrainingRuntime"] = _CEL["TrainingRuntime"]


def crd_errors(doc: dict) -> list[str]:
    """What the CRD's schema refuses in ``doc``, each as ``path: message``; [] for a valid document."""
    errors = sorted(validator(doc["apiVersion"], doc["kind"]).iter_errors(doc), key=lambda e: list(e.path))
    out = [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.validator} {str(e.validator_value)[:80]}: "
           f"{e.message[:160]}" for e in errors]
    return out + [f"CEL: {why}" for why, ok in _CEL.get(doc["kind"], []) if not ok(doc)]


def is_crd_kind(doc: dict) -> bool:
    return (doc.get("apiVersion"), doc.get("kind")) in FILES
