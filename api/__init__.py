"""urewrite's Python API (docs/api.md): what the command line does, as functions with
typed results that print nothing and raise UrewriteError on bad input.

    from urewrite import api
    result = api.rewrite("app", "app.probed", probes=["parse_*"], returns=["handle"])
    listing = api.list_sites("app")
    counts = api.run(["./app.probed", "--flag"]).counts
"""

from urewrite.api.listing import list_sites
from urewrite.api.reading import arm, read_regions, run
from urewrite.api.results import (ArmedProcesses, Bucket, CommandRun, Counts, FunctionSite,
                                  Listing, PlacedProbe, ProbeCount, RefusedSite, ReturnProbe,
                                  RewriteResult, UsdtSite)
from urewrite.api.rewriting import NothingToProbe, rewrite
from urewrite.errors import UrewriteError

__all__ = ["rewrite", "list_sites", "read_regions", "run", "arm", "UrewriteError",
           "NothingToProbe", "RewriteResult", "PlacedProbe", "RefusedSite", "Listing",
           "FunctionSite", "UsdtSite", "ReturnProbe", "Counts", "ProbeCount", "Bucket",
           "CommandRun", "ArmedProcesses"]
