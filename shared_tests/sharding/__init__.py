"""Sharded training (FSDP, tensor parallel, and their combinations with data parallel): the plan and
its refusals, NumPy's written-out collectives equal to one device, and the command line's options."""
