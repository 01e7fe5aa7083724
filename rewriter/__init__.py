"""ELF in -> sites -> plan -> code -> ELF out."""
