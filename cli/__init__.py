"""urewrite: pre-instrument ELF programs and libraries with trap-free probes."""

__version__ = "0.1.0"
