"""A JSONPatch from one object to another whose operations come in the same order on every run.

python-json-patch (pinned, requirements.lock) walks a dict's keys through sets, so sibling
operations came out in an order set by PYTHONHASHSEED: the same review printed a different patch
in each process, and the decision log recorded a different patch for the same job. Here the keys
are walked in the objects' own order (removed keys in the old object's order, then added and
common ones in the new object's), which keeps every operation the library would make.
"""
from __future__ import annotations

import jsonpatch


class _OrderedDiff(jsonpatch.DiffBuilder):
    """The library's diff with its one set-ordered walk replaced by an ordered one."""

    def _compare_dicts(self, path, src, dst):  # noqa: ANN001 (the library's signature)
        for key in src:
            if key not in dst:
                self._item_removed(path, str(key), src[key])
        for key in dst:
            if key not in src:
                self._item_added(path, str(key), dst[key])
        for key in dst:
            if key in src:
                self._compare_values(path, key, src[key], dst[key])


def make_patch(before: dict, after: dict) -> list[dict]:
    """The JSONPatch operations that turn ``before`` into ``after``, as plain dicts."""
    builder = _OrderedDiff(before, after, jsonpatch.JsonPatch.json_dumper)
    builder._compare_values("", None, before, after)
    return list(builder.execute())
