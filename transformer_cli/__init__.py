"""The ``transformer-ref`` command: the same model and input through every installed backend."""
