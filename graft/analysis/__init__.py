"""What runs show: intervals (stats.py), tables (tables.py; by batch size, batch.py), figures (plots.py, drawn
with styles.py and drawing.py from figure_data.py), the paper's claims beside them (claims.py) and the console
summary (console.py)."""
