"""A run folder, written and read: the writer (writer.py), the reader every tool uses (reader.py), the lock and digests both share (folder.py), and the arithmetic of a record (metrics.py)."""
