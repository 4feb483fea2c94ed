"""Plans and the checkpoint's contents (SPEC §9-§10): the diff into JSON Patch, allocations,
uids and gids. Pure."""
