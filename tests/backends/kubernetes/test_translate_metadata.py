"""A pod's labels and annotations become its job's (docs/kubernetes.md, "Labels and annotations"):
those within a job's bounds, in key order; the rest left out, never a refused pod."""

from __future__ import annotations

from typing import Any

from fleetlog.backends.kubernetes.translate import job_submitted, kept_annotations, kept_labels
from fleetlog.events.model import (
    MAX_ANNOTATION_CHARS,
    MAX_JOB_ANNOTATIONS,
    MAX_JOB_LABELS,
    MAX_JOB_METADATA_BYTES,
    metadata_bytes,
)
from tests.backends.kubernetes.manifests import pod
from tests.backends.kubernetes.test_translate import CFG, as_pod, round_trip


def with_notes(manifest: dict[str, Any], notes: dict[str, str]) -> dict[str, Any]:
    meta = manifest["metadata"]
    return {**manifest, "metadata": {**meta, "annotations": {**meta.get("annotations", {}), **notes}}}


def test_a_pods_labels_and_annotations_become_its_jobs() -> None:
    manifest = with_notes(pod("p", labels={"app": "train", "team": "vision"}),
                          {"owner": "Ada Lovelace", "note": "two\nlines"})
    job = round_trip(job_submitted("pod/default/p/01234567", [as_pod(manifest)], CFG))
    assert job.labels == {"app": "train", "team": "vision"}
    assert job.annotations == {"note": "two\nlines", "owner": "Ada Lovelace"}
    assert job.payload is None  # (the pod's own spec is what runs)


def test_a_gang_takes_the_first_pods() -> None:
    first = pod("a", group="g", labels={"role": "first"})
    second = pod("b", group="g", labels={"role": "second"})
    job = job_submitted("group/default/g", [as_pod(first), as_pod(second)], CFG)
    assert job.labels == {"role": "first", "scheduling.x-k8s.io/pod-group": "g"}


def test_labels_past_the_bounds_are_left_out() -> None:
    many = {f"k{i:03d}": "v" for i in range(MAX_JOB_LABELS + 10)}
    long_key = "example.com/" + "k" * 242  # 254 characters: a prefixed Kubernetes key may be 317
    at_bound = "k" * 253
    labels = kept_labels({**many, long_key: "v", "z" + at_bound[1:]: "v" * 253})
    assert list(labels) == [f"k{i:03d}" for i in range(MAX_JOB_LABELS)]  # the first 64 by key
    kept = kept_labels({long_key: "v", at_bound: "", "ok": "v", "spaced": "a b", "v": "w" * 254})
    assert kept == {at_bound: "", "ok": "v"}


def test_annotations_past_the_bounds_are_left_out_and_the_next_may_fit() -> None:
    applied = "{" + "x" * 70_000 + "}"  # kubectl's last-applied-configuration of a large pod
    notes = {"a": "1", "kubectl.kubernetes.io/last-applied-configuration": applied, "z": "2", "bad key": "x"}
    assert kept_annotations(notes) == {"a": "1", "z": "2"}
    exact = {"a": "x" * (MAX_ANNOTATION_CHARS - 2), "b": ""}  # 16,383 + 1 characters: every one fits
    assert kept_annotations(exact) == exact
    over = {"a": "x" * (MAX_ANNOTATION_CHARS - 2), "b": "y"}  # one more character: "b" is left out
    assert kept_annotations(over) == {"a": "x" * (MAX_ANNOTATION_CHARS - 2)}
    many = {f"n{i:03d}": "v" for i in range(MAX_JOB_ANNOTATIONS + 1)}
    assert list(kept_annotations(many)) == [f"n{i:03d}" for i in range(MAX_JOB_ANNOTATIONS)]


def test_a_pod_with_labels_and_annotations_past_every_bound_still_submits() -> None:
    labels = {f"l{i:03d}": "v" for i in range(100)} | {"example.com/" + "k" * 300: "v"}
    notes = {f"n{i:03d}": "w" * 2000 for i in range(100)}
    manifest = with_notes(pod("p", labels=labels), notes)
    job = round_trip(job_submitted("pod/default/p/01234567", [as_pod(manifest)], CFG))  # the codec takes it
    assert len(job.labels) == MAX_JOB_LABELS
    assert sum(len(k) + len(v) for k, v in job.annotations.items()) <= MAX_ANNOTATION_CHARS
    assert len(job.annotations) == (MAX_JOB_METADATA_BYTES - 64 * 5) // 2004  # (beside 64 labels "lNNN": "v")
    assert metadata_bytes(job.labels, job.annotations) <= MAX_JOB_METADATA_BYTES


def test_labels_and_annotations_share_the_jobs_metadata_bytes() -> None:
    """Four-byte characters: within every count and character bound, the bytes bound still holds
    (issue 46) — the annotations take what the labels leave, the next may fit."""
    wide = "\U0001f600"
    labels = {f"l{i:02d}": wide * 60 for i in range(MAX_JOB_LABELS)}  # 64 x 243 bytes: 15,552
    notes = {"a": wide * 300, "b": "x" * 700, "c": "y" * 200, "d": "z" * 100}
    manifest = with_notes(pod("p", labels=labels), notes)
    job = round_trip(job_submitted("pod/default/p/0", [as_pod(manifest)], CFG))
    assert job.labels == labels
    assert job.annotations == {"b": "x" * 700, "d": "z" * 100}  # of the 832 left: a (1,201) no, b (701), c
    # (201) no, d (101)
    assert metadata_bytes(job.labels, job.annotations) <= MAX_JOB_METADATA_BYTES
    assert kept_labels({f"l{i:02d}": wide * 200 for i in range(MAX_JOB_LABELS)}).keys() == {
        f"l{i:02d}" for i in range(20)}  # 803 bytes each: 20 fit 16,384
