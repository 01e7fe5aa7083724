"""What a hit runs: the shared-memory region layout and the trampoline segment."""
