"""The balancer (SPEC §6-§8): instances, filters, sharing policies, node states, the passes,
explain and the load alerts. Pure."""
