"""Helpers shared by the tests: builders, fakes, fixtures' machinery and the repository's paths.

Test files import from here, never from one another (docs/testing.md)."""
