"""The size of a pod group: the ``fleetlog.dev/pod-group-size`` annotation of its pods, or else
``spec.minMember`` of its ``PodGroup`` object (``scheduling.x-k8s.io/v1alpha1``, the
scheduler-plugins coscheduling CRD) in the pods' namespace."""

from __future__ import annotations

from typing import Final

import msgspec

from fleetlog.backends.kubernetes.api import KubeApi, KubeApiError
from fleetlog.backends.kubernetes.config import KubeBackendConfig
from fleetlog.backends.kubernetes.objects import Pod
from fleetlog.events.model import MAX_TASKS_PER_JOB
from fleetlog.numerals import whole

PODGROUPS: Final = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{namespace}/podgroups/{name}"
NOT_FOUND: Final = 404


class PodGroupSpec(msgspec.Struct, frozen=True, rename="camel", gc=False):
    min_member: int = 0


class PodGroup(msgspec.Struct, frozen=True, gc=False):
    spec: PodGroupSpec = PodGroupSpec()


POD_GROUP: Final = msgspec.json.Decoder(PodGroup)


def annotated_size(pod: Pod, cfg: KubeBackendConfig) -> int | None:
    text = pod.metadata.annotations.get(cfg.group_size_annotation, "")
    size = whole(text, 9)  # (ASCII digits: an annotation of "²" is no size, not a crash)
    return size if size is not None and 1 <= size <= MAX_TASKS_PER_JOB else None


async def group_size(api: KubeApi, pod: Pod, cfg: KubeBackendConfig) -> int | None:
    """The gang size of ``pod``'s group, or None while nothing says it (no annotation, no PodGroup)."""
    size = annotated_size(pod, cfg)
    if size is not None:
        return size
    group = pod.metadata.labels[cfg.pod_group_label]
    path = PODGROUPS.format(namespace=pod.metadata.namespace, name=group)
    try:
        found = POD_GROUP.decode(await api.request("GET", path))
    except KubeApiError as e:
        if e.status == NOT_FOUND:  # no such PodGroup, or the CRD is not installed
            return None
        raise
    return found.spec.min_member if 1 <= found.spec.min_member <= MAX_TASKS_PER_JOB else None
