"""Probe programs: what a probe does, in bpftrace's language (docs/programs.md)."""
