"""What runs show: intervals (stats.py), tables (tables.py), figures (plots.py) and the console summary (console.py)."""
