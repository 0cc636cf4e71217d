"""The console command ``transformer-ref``: what it prints, its help, and its one-line user errors."""
