"""The Kubernetes device plugin API v1beta1 on the agent's side (SPEC §19): the Registration
server, the plugins' ListAndWatch streams, Allocate before a container starts."""
