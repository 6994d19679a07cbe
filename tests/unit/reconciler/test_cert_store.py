"""JSON-patch `test` evaluation used to tell a lost race from a real 422 (no cluster)."""

from __future__ import annotations

from reconciler.admission.api_store import patch_test_holds as holds


def test_json_patch_test_evaluation_follows_rfc6901_escapes() -> None:
    obj = {"metadata": {"resourceVersion": "7", "annotations": {"a/b~c": "x"}}, "l": [1, {"k": 2}]}
    assert holds(obj, {"op": "test", "path": "/metadata/resourceVersion", "value": "7"})
    assert not holds(obj, {"op": "test", "path": "/metadata/resourceVersion", "value": "8"})
    assert holds(obj, {"op": "test", "path": "/metadata/annotations/a~1b~0c", "value": "x"})
    assert holds(obj, {"op": "test", "path": "/l/1/k", "value": 2})
    assert not holds(obj, {"op": "test", "path": "/l/5", "value": 2})
    assert not holds(obj, {"op": "test", "path": "/missing", "value": None})
    assert holds(obj, {"op": "add", "path": "/x", "value": 1})
