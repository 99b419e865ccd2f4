"""The Kubernetes backend: fleetlog as a custom scheduler (pods with ``schedulerName: fleetlog``).

Observations (nodes, pods) become input events; decisions become Bindings, Evictions and
``PodScheduled=False`` conditions.  See docs/kubernetes.md.
"""

from fleetlog.backends.kubernetes.api import KubeApi, KubeApiError, KubeConfigError, KubeUnreachableError
from fleetlog.backends.kubernetes.backend import KubernetesBackend
from fleetlog.backends.kubernetes.config import KubeBackendConfig

__all__ = [
    "KubeApi",
    "KubeApiError",
    "KubeBackendConfig",
    "KubeConfigError",
    "KubeUnreachableError",
    "KubernetesBackend",
]
