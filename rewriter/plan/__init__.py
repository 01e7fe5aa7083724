"""Planning: which bytes each site's patch displaces, and how it is patched."""
