"""One module per file format that a scan recognises by content."""
