"""Active bundles for the server, hot-reloaded per source file.

Each source (a file, or a cluster object name) holds its last good bundles. A change that does
not compile is reported and the last good version stays active; readers always see one
consistent, immutable tuple, swapped in a single assignment. File sources are polled on the
event loop while cluster sources arrive from a watch thread, so writes take a lock (compiling
happens outside it).
"""
from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from trainjob_admission.policies.bundle.compile import Bundle, BundleError, Problem, compile_document
from trainjob_admission.policies.bundle.load import (
    BUILTIN_PREFIX, bundle_files, order, parse_documents, read_source,
)
from trainjob_admission.policies.k8s.versions import NEWEST, Versions

log = logging.getLogger("trainjob_admission.bundles")
# A file that holds no document is refused, never read as "no policy": an editor or `cp` empties a
# file before writing it, and a poll in between would otherwise enforce nothing until the next one.
EMPTY_SOURCE = "holds no bundle (empty, or only comments); the last good version stays: delete the file to remove its bundles"
CLUSTER_SOURCE_PREFIX = "cluster:"  # sources fed from PolicyBundle objects, not files (webhook/loops/clusterbundles.py)


@dataclass
class SourceState:
    """One source as last compiled: its good bundles (kept through a broken change) and, when
    the latest version did not compile, why."""

    bundles: tuple[Bundle, ...] = ()
    fingerprint: tuple = ()
    error: str = ""
    problems: tuple[Problem, ...] = ()  # of the latest version, when it did not compile

    @property
    def compiled(self) -> bool:
        return not self.problems and not self.error


@dataclass
class BundleRegistry:
    specs: list[str]
    # The cluster's versions when a bundle compiles (its CEL library level); the server's state holds them.
    versions: Callable[[], Versions] = lambda: NEWEST
    sources: dict[str, SourceState] = field(default_factory=dict)
    active: tuple[Bundle, ...] = ()
    reloads: int = 0
    failures: int = 0
    _lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    def _files(self) -> list[str]:
        files: list[str] = []
        for spec in self.specs:
            if spec.startswith(BUILTIN_PREFIX):
                files.append(spec)
            elif Path(spec).exists():
                files.extend(str(p) for p in bundle_files(Path(spec)))
        return files

    @staticmethod
    def _fingerprint(source: str) -> tuple:
        if source.startswith(BUILTIN_PREFIX):
            return ("builtin",)
        try:
            st = os.stat(source)
        except OSError:
            return ()
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def update_source(self, source: str, text: str, fingerprint: tuple = ()) -> SourceState:
        """Compile ``text`` as the new content of ``source``; on error keep the last good one.
        Returns the source's state: what it now enforces and, if the text did not compile, why."""
        try:
            documents = parse_documents(text, source)
        except BundleError as exc:
            return self._reject(source, exc, fingerprint)
        except Exception as exc:  # noqa: BLE001 - see update_documents
            return self._reject(source, _unexpected(source, exc), fingerprint)
        if not documents:  # caught mid-write (emptied before written) or emptied by mistake
            return self._reject(source, BundleError([Problem(source, EMPTY_SOURCE)]), fingerprint)
        return self.update_documents(source, documents, fingerprint)

    def update_documents(self, source: str, documents: list[Any], fingerprint: tuple = ()) -> SourceState:
        """Compile parsed documents (e.g. a PolicyBundle object from the API) as ``source``;
        returns the source's state as :meth:`update_source` does."""
        try:
            bundles = tuple(compile_document(doc, source, versions=self.versions()) for doc in documents)
        except BundleError as exc:
            return self._reject(source, exc, fingerprint)
        except Exception as exc:  # noqa: BLE001 - a compiler bug must not stop the reload loop or the watch
            return self._reject(source, _unexpected(source, exc), fingerprint)
        state = SourceState(bundles, fingerprint)
        with self._lock:
            self.sources[source] = state
            self.reloads += 1
            self._publish()
        return state

    def _reject(self, source: str, exc: BundleError, fingerprint: tuple) -> SourceState:
        with self._lock:
            last_good = self.sources.get(source, SourceState()).bundles
            state = self.sources[source] = SourceState(last_good, fingerprint, str(exc), tuple(exc.problems))
            self.failures += 1
        log.error("bundle rejected, keeping the last good version: %s", exc)
        return state

    def remove_source(self, source: str) -> None:
        with self._lock:
            if self.sources.pop(source, None) is not None:
                self._publish()

    def poll(self) -> None:
        """Re-read the sources whose files changed (the rest cost one stat each)."""
        files = self._files()
        for source in list(self.sources):
            if source not in files and not source.startswith(CLUSTER_SOURCE_PREFIX):
                self.remove_source(source)
        for source in files:
            fingerprint = self._fingerprint(source)
            known = self.sources.get(source)
            if known is not None and known.fingerprint == fingerprint:
                continue
            try:
                texts = read_source(source)
            except FileNotFoundError as exc:  # removed between listing and reading: the next poll drops it
                log.warning("bundle file %s vanished while reloading", exc)
                continue
            except BundleError as exc:  # unreadable: rejected once per change of the file, like a bad one
                self._reject(source, exc, fingerprint)
                continue
            for name, text in texts:
                self.update_source(name, text, fingerprint)

    def _publish(self) -> None:
        bundles = [b for state in self.sources.values() for b in state.bundles]
        seen: set[str] = set()
        unique = []
        for bundle in order(bundles):
            if bundle.name in seen:
                log.error("bundle %s is defined twice (%s); keeping the first", bundle.name, bundle.source)
                continue
            seen.add(bundle.name)
            unique.append(bundle)
        self.active = tuple(unique)

    @property
    def errors(self) -> dict[str, str]:
        with self._lock:
            return {source: state.error for source, state in self.sources.items() if state.error}


def _unexpected(source: str, exc: Exception) -> BundleError:
    """A failure the compiler does not report itself, as a rejection like any other (logged with
    its traceback): the source keeps its last good version and the next change is tried again."""
    log.error("compiling %s failed unexpectedly", source, exc_info=exc)
    return BundleError([Problem(source, f"could not be compiled ({type(exc).__name__}: {str(exc)[:200]})")])
