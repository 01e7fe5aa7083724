"""The reading side: running commands with a region directory, arming running processes,
region sources and snapshots, event rings, where a probe program runs and its maps, and
the exporters' data (Prometheus, Perfetto). No click and no terminal output here: the
command line (cli/) prints. Kept empty so that `stat -- COMMAND` can start the command
after importing only what it needs (cli/entry.py).
"""
